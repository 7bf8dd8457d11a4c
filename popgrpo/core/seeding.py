"""Seed derivation: every random stream in a run comes from the root seed and a key path."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["derive_seed", "torch_generator"]


def derive_seed(root: int, *keys: int) -> int:
    """A 63-bit seed for the stream named by ``keys`` (numpy SeedSequence spawn keys).

    Streams with different keys are statistically independent; the same (root, keys)
    always gives the same seed, whichever process or machine asks.
    """
    state = np.random.SeedSequence(root, spawn_key=tuple(int(k) for k in keys)).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def torch_generator(root: int, *keys: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed`."""
    return torch.Generator().manual_seed(derive_seed(root, *keys))
