"""Seed derivation: every random stream in a run comes from the root seed and a key path."""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "STREAM_EVAL",
    "STREAM_INIT",
    "STREAM_MEMBER",
    "STREAM_MERGE",
    "STREAM_PERTURB",
    "STREAM_POPULATION",
    "STREAM_STRAGGLER",
    "derive_seed",
    "torch_generator",
]

# The first key of every stream a run draws from ``run.seed``: each purpose has its own, so
# adding draws to one purpose never shifts another's numbers.
STREAM_INIT = 0  # (0,) shared initial weights; (0, k) member k's own with population.shared_init off
STREAM_MEMBER = 1  # (1, k): member k's sampling, prompt draws and reward noise
STREAM_PERTURB = 2  # (2, k, round): member k's mutation when it adopts the merged model of a round
STREAM_MERGE = 3  # (3, round): the driver's merge draws (task_arithmetic's w)
STREAM_EVAL = 4  # (4, round, purpose): the held-out evaluation's draws
STREAM_POPULATION = 5  # (5, round): the driver's population-mechanism draws (which top member a copy takes)
STREAM_STRAGGLER = 6  # (6, k, round): member k's seeded extra delay in a round (population.straggler)


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
