"""Pop-GRPO selection (main paper §4.3): score members, keep the top M; cyclic objectives (CycleQD §3.1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from popgrpo.columns import POP_SCORE  # the main paper's S_k; any other objective is a column of the member's rows
from popgrpo.registry import SELECTION_STATISTICS

__all__ = ["POP_SCORE", "cyclic_objective", "objective_scores", "pop_score", "pop_scores", "select_top_m"]


def pop_score(diversity: float, max_reward: float) -> float:
    """``S_k = d_k · (1 + max R_k)``: the quality-diversity score of one member."""
    return float(diversity) * (1.0 + float(max_reward))


def select_top_m(scores: Sequence[float], m: int) -> list[int]:
    """Indices of the ``m`` highest scores, best first; ties go to the lower index.

    NaN scores rank last, so a member whose metrics broke is never picked over a healthy one.
    """
    values = np.asarray(scores, dtype=np.float64)
    if not 1 <= m <= len(values):
        raise ValueError(f"top_m must be in [1, {len(values)}], got {m}")
    keyed = np.where(np.isnan(values), -np.inf, values)
    order = sorted(range(len(keyed)), key=lambda i: (-keyed[i], i))
    return order[:m]


def cyclic_objective(round_index: int, objectives: Sequence[str]) -> str:
    """The selection objective of round ``r``: ``objectives[r mod len(objectives)]``.

    CycleQD §3.1 rotates which task metric is the quality (the others serve as behaviour
    characteristics) from one generation to the next, ``i = t mod K``; here the rotation is
    over scheduler rounds. One objective means no rotation.
    """
    if not objectives:
        raise ValueError("need at least one objective")
    return objectives[round_index % len(objectives)]


def pop_scores(rows: Sequence[Mapping[str, float]]) -> list[float]:
    """:func:`pop_score` of each member's metrics row (``diversity``, ``reward_max``): the ``pop_score`` statistic."""
    return [pop_score(r["diversity"], r["reward_max"]) for r in rows]


def objective_scores(rows: Sequence[Mapping[str, float]], objective: str) -> list[float]:
    """Each member's score under ``objective``, from its metrics row; higher is better.

    ``objective`` names a selection statistic of :data:`popgrpo.registry.SELECTION_STATISTICS`:
    ``pop_score`` (:func:`pop_scores`), a metrics column read as it is (e.g. ``reward_max``,
    ``diversity``, ``archive_coverage``), or a plugin's.
    """
    return SELECTION_STATISTICS.get(objective)(rows)
