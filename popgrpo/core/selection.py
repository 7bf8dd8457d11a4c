"""Pop-GRPO selection (main paper §4.3): score members, keep the top M."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["pop_score", "select_top_m"]


def pop_score(diversity: float, max_reward: float) -> float:
    """``S_k = d_k · (1 + max R_k)``: the quality-diversity score of one member."""
    return float(diversity) * (1.0 + float(max_reward))


def select_top_m(scores: Sequence[float], m: int) -> list[int]:
    """Indices of the ``m`` highest scores, best first; ties go to the lower index.

    NaN scores rank last, so a member whose metrics broke is never picked over a healthy one.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if not 1 <= m <= len(scores):
        raise ValueError(f"top_m must be in [1, {len(scores)}], got {m}")
    keyed = np.where(np.isnan(scores), -np.inf, scores)
    order = sorted(range(len(keyed)), key=lambda i: (-keyed[i], i))
    return order[:m]
