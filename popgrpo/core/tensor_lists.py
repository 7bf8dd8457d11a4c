"""``Tensor.tolist()`` with the types it really returns.

torch's stub types ``tolist()`` as a bare list, which the strict type checker reads as a list
of unknowns; these two say what a 1-D tensor gives. One place, so the workaround goes when
the stub improves.
"""

from __future__ import annotations

from typing import cast

import torch

__all__ = ["float_list", "int_list"]


def float_list(t: torch.Tensor) -> list[float]:
    """``[n]`` floating tensor → ``n`` Python floats."""
    return cast("list[float]", t.tolist())  # pyright: ignore[reportUnknownMemberType]


def int_list(t: torch.Tensor) -> list[int]:
    """``[n]`` integer tensor → ``n`` Python ints."""
    return cast("list[int]", t.tolist())  # pyright: ignore[reportUnknownMemberType]
