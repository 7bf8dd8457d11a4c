"""Discovery metrics of whole runs, from what they wrote: ``metrics.parquet`` and ``archive.parquet``.

The formulas are :mod:`popgrpo.core.discovery`'s. :func:`run_discovery` unions a run's
per-member, per-epoch discovery columns (a population), or several runs' (best-of-K: pass the
frames of the K runs); :func:`archived_best_quality` is the best noise-free quality among an
archive's elites, which are chosen by their noisy reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd
import torch

from popgrpo.core.discovery import Discovery, union_discovery
from popgrpo.envs import Landscape

__all__ = ["archived_best_quality", "run_discovery"]


def run_discovery(frames: pd.DataFrame | Sequence[pd.DataFrame]) -> Discovery:
    """:func:`~popgrpo.core.discovery.union_discovery` of one run's metrics, or of K runs' together.

    One frame: its members are the units (a population). Several frames: each (run, member)
    is a unit, so K runs of one member each are charged exactly like a population of K.
    """
    if isinstance(frames, pd.DataFrame):
        return union_discovery(_records(frames))
    rows = [{**row, "run": k} for k, frame in enumerate(frames) for row in _records(frame)]
    return union_discovery(rows, unit=("run", "member"))


def _records(frame: pd.DataFrame) -> list[dict[str, object]]:
    return cast("list[dict[str, object]]", frame.to_dict("records"))  # the metrics' column names are str


def archived_best_quality(archive: pd.DataFrame, landscape: Landscape) -> float:
    """The highest noise-free quality ``Q`` among the elites of ``archive`` (its ``idea`` column,
    as ``archive.parquet`` holds it); NaN for an empty archive."""
    if archive.empty:
        return float("nan")
    ideas = torch.as_tensor(np.stack([np.asarray(i, dtype=np.float32) for i in archive["idea"]]))
    return float(landscape.quality(ideas).double().max())
