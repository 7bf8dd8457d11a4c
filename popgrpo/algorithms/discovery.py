"""An epoch's discovery columns (:data:`popgrpo.columns.DISCOVERY_COLUMNS`) from its steps' scores.

The formulas are :mod:`popgrpo.core.discovery`'s; this module only says which ideas they see:
each step's ideas in sampling order (the features of vector ideas are the ideas), those that
were executed (a proxy's ``reward.proxy.control_fraction`` executes some: their ``success`` is
known), and the environment's peaks where it names them (:class:`~popgrpo.envs.Landscape`).
Nothing here feeds back into training.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import torch

from popgrpo.algorithms.step import StepStats
from popgrpo.columns import DISCOVERY_COLUMNS
from popgrpo.core.discovery import best_value, first_hits, peak_fractions
from popgrpo.envs import Environment, Landscape, TextEnvironment

__all__ = ["epoch_discovery"]


def _executed(success: torch.Tensor | None, n: int) -> torch.Tensor:
    """``[n]`` bool: the ideas that were executed (a float ``success`` is NaN where one was not)."""
    if success is None or not success.is_floating_point():
        return torch.ones(n, dtype=torch.bool)
    return ~success.isnan()


def epoch_discovery(
    steps: Sequence[StepStats], env: Environment | TextEnvironment, fraction: float
) -> dict[str, float | str | None]:
    """The discovery columns of an epoch of ``steps``: best noise-free expected reward and quality,
    ``{peak: position of its first hit}`` (``fraction``: ``eval.discovery_threshold``) and
    ``{peak: best Q / height}`` as JSON.

    The expected reward is the reward source's ``expected`` (NaN where no step has it); quality
    and peaks need a :class:`~popgrpo.envs.Landscape` (NaN and None otherwise).
    """
    best_col, quality_col, peaks_col, fractions_col = DISCOVERY_COLUMNS
    executed = torch.cat([_executed(s.scores.success, s.scores.features.shape[0]) for s in steps])
    expected = [s.scores.expected for s in steps]
    row: dict[str, float | str | None] = {
        best_col: math.nan,
        quality_col: math.nan,
        peaks_col: None,
        fractions_col: None,
    }
    if all(e is not None for e in expected):
        row[best_col] = best_value(torch.cat([e for e in expected if e is not None]), executed)
    if isinstance(env, Landscape):
        ideas = torch.cat([s.scores.features for s in steps])  # [N, d]: vector ideas are their features
        quality, peak = env.quality(ideas), env.peak(ideas)
        row[quality_col] = best_value(quality, executed)
        hits = first_hits(quality, peak, env.peak_quality, fraction, executed)
        row[peaks_col] = json.dumps({str(p): i for p, i in hits.items()})
        fractions = peak_fractions(quality, peak, env.peak_quality, executed)
        row[fractions_col] = json.dumps({str(p): f for p, f in fractions.items()})
    return row
