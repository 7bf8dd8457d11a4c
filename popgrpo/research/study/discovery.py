"""Discovery metrics of whole runs, from what they wrote: ``metrics.parquet`` and ``archive.parquet``.

The formulas are :mod:`popgrpo.core.discovery`'s. :func:`run_discovery` unions a run's
per-member, per-epoch discovery columns (a population), or several runs' (best-of-K: pass the
frames of the K runs); :func:`archived_best_quality` is the best noise-free quality among an
archive's elites, which are chosen by their noisy reward.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd
import torch

from popgrpo.core.discovery import (
    Discovery,
    peak_coverage,
    peak_reach,
    reachable_peaks,
    sampled_discovery,
    union_discovery,
)
from popgrpo.envs import Landscape

__all__ = [
    "COVERAGE_THRESHOLD",
    "RANDOM_SEARCH",
    "SPREAD_COLUMNS",
    "WIDTHS",
    "archived_best_quality",
    "discovery_summary",
    "random_search",
    "reachable",
    "run_discovery",
    "spread_summary",
    "trial_summary",
]

RANDOM_SEARCH = "random search"
"""The random-search arm's label in a study's tables."""

WIDTHS = (0.25, 0.35, 0.5, 0.71, 1.0, 1.41, 2.0, 2.83, 4.0, 5.66, 8.0)
"""The widths random search is tuned over: 0.25 to 8 in steps of √2."""


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


THRESHOLDS = (0.7, 0.75, 0.8, 0.85, 0.9)
"""Fractions of a peak's height at which the summary also counts the peaks reached (from the
runs' per-peak best fractions, whatever threshold they ran with): what tuning chooses among."""


def reachable(landscape: Landscape, centres: torch.Tensor) -> frozenset[int]:
    """The peaks of ``landscape`` an idea can reach: those whose centre ``centres [n, d]`` lies in its own basin."""
    return reachable_peaks(landscape.peak(centres))


COVERAGE_THRESHOLD = 0.7
"""The height threshold of :func:`~popgrpo.core.discovery.peak_coverage` in a study's summaries."""


def discovery_summary(
    found: Discovery,
    reachable_set: frozenset[int],
    far: frozenset[int] = frozenset(),
    threshold: float = COVERAGE_THRESHOLD,
) -> dict[str, float | str]:
    """What a run, or a random search, found (``found``), as the discovery study reports it.

    ``best_quality``, ``best_expected``; ``peaks``: reachable peaks reached at the run's own
    threshold (its first hits); ``peak_fraction_mean``: the mean over reachable peaks of how close
    to its top any idea came (0 for a basin never visited); ``discovery_time``: the mean over
    reachable peaks of samples-to-first-discovery / samples, a peak never reached counting 1;
    ``samples``; ``peaks_at_<f>`` for each of :data:`THRESHOLDS`; ``coverage``: the mean over
    reachable peaks of ``max(0, fraction − threshold)``
    (:func:`~popgrpo.core.discovery.peak_coverage`); ``far_peaks`` and ``far_coverage``: the same
    over the landscape's far peaks that are reachable (NaN without far peaks); ``peak_fractions``:
    every visited basin's best fraction as JSON (per-peak reach at any threshold)."""
    targets = sorted(reachable_set)
    far_targets = sorted(far & reachable_set)
    fractions = [max(found.peak_fraction.get(p, 0.0), 0.0) for p in targets]
    times = [found.first_discovery.get(p, found.samples) / found.samples for p in targets]
    nan = float("nan")
    return {
        "best_quality": found.best_quality,
        "best_expected": found.best_expected,
        "peaks": float(len(found.peaks & reachable_set)),
        "peak_fraction_mean": float(np.mean(fractions)) if targets else nan,
        "discovery_time": float(np.mean(times)) if targets else nan,
        "samples": float(found.samples),
        **{f"peaks_at_{f:g}": float(len(found.peaks_at(f) & reachable_set)) for f in THRESHOLDS},
        "coverage": peak_coverage(found.peak_fraction, targets, threshold),
        "far_peaks": float(sum(peak_reach(found.peak_fraction, far_targets, threshold).values()))
        if far_targets
        else nan,
        "far_coverage": peak_coverage(found.peak_fraction, far_targets, threshold),
        "peak_fractions": json.dumps({str(p): round(f, 6) for p, f in found.peak_fraction.items()}),
    }


SPREAD_COLUMNS = ("entropy", "spread", "diversity")
"""What :func:`spread_summary` adds to a trial's summary: how wide the policy stayed and how
varied its ideas were, to read beside the discovery metrics (not a discovery metric)."""

_HALF_LOG_2PI_E = 0.5 * math.log(2 * math.pi * math.e)


def last_quarter(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a run's ``metrics.parquet`` frame in the last ⌈E/4⌉ of its E epochs."""
    epochs = np.sort(frame["epoch"].unique())
    return frame[frame["epoch"].isin(epochs[len(epochs) - math.ceil(len(epochs) / 4) :])]


def spread_summary(frame: pd.DataFrame) -> dict[str, float]:
    """A run's policy spread and idea diversity over the last quarter of its epochs.

    From the run's ``metrics.parquet`` rows (every member): the mean over the members and the
    last ⌈E/4⌉ of its E epochs (the policy the run ended with, once the shared start has worn
    off) of ``entropy`` (the policy's entropy per dimension in nats, for a Gaussian policy
    ½ log(2πe) + mean log σ: :func:`popgrpo.core.entropy.gaussian_entropy`) and ``diversity``
    (the mean pairwise cosine distance of an epoch's ideas' features); ``spread``:
    ``exp(entropy − ½ log(2πe))``, the geometric mean of a Gaussian policy's σ (the width
    random search is tuned over; not meaningful for a text policy). NaN where a column is absent.
    """
    last = last_quarter(frame)

    def mean(column: str) -> float:
        return float(last[column].mean()) if column in last.columns and len(last) else float("nan")

    entropy = mean("entropy")
    return {"entropy": entropy, "spread": math.exp(entropy - _HALF_LOG_2PI_E), "diversity": mean("diversity")}


def trial_summary(
    frame: pd.DataFrame, reachable_set: frozenset[int], far: frozenset[int] = frozenset()
) -> tuple[dict[str, float | str], pd.DataFrame]:
    """What one run found (:func:`discovery_summary`), its spread (:func:`spread_summary`), and its per-epoch trajectory.

    ``frame``: the run's ``metrics.parquet`` (every member a unit: a population, or K
    independent runs of a ``scheduler.enabled=false`` population); ``far``: the landscape's far
    peaks. The trajectory has ``epoch``, ``samples``, ``peaks``, ``best_expected``,
    ``best_quality``, cumulative.
    """
    found = run_discovery(frame)
    curve = pd.DataFrame([p.__dict__ for p in found.trajectory])
    return {**discovery_summary(found, reachable_set, far), **spread_summary(frame)}, curve


def random_search(
    landscape: Landscape,
    samples: int,
    width: float,
    generator: torch.Generator,
    fraction: float,
    executed_only: bool = True,
    batch: int = 1 << 15,
) -> Discovery:
    """What ``samples`` ideas drawn from the untrained isotropic Gaussian ``N(0, width²·I)`` find
    on ``landscape`` (:func:`~popgrpo.core.discovery.sampled_discovery`; peaks reached at
    ``fraction`` of their height).

    ``executed_only``: count only ideas whose execution succeeded, ``B ~ Bernoulli(p_exec(x))``
    drawn from ``generator`` as a run's member draws it, so random search is scored by the rule a
    run's discovery columns follow; False counts every idea, which is kinder to random search.
    ``best_expected`` is ``max Q·p_exec`` where the landscape has ``p_exec`` (NaN otherwise).
    ``generator`` draws the ideas and the executions; same generator state, same result."""
    dim = int(getattr(landscape, "idea_dim"))  # noqa: B009  # the Landscape protocol does not name it
    p_exec = getattr(landscape, "p_exec", None)
    both = getattr(landscape, "quality_and_peak", None)
    if executed_only and p_exec is None:
        raise ValueError("executed_only needs a landscape with p_exec(ideas)")

    def batches():
        left = samples
        while left > 0:
            n = min(batch, left)
            ideas = width * torch.randn((n, dim), generator=generator)
            quality, peak = both(ideas) if both else (landscape.quality(ideas), landscape.peak(ideas))
            expected, success = None, None
            if p_exec is not None:
                p = p_exec(ideas)
                expected = quality * p
                if executed_only:
                    success = torch.bernoulli(p, generator=generator).bool()
            yield quality, peak, expected, success
            left -= n

    return sampled_discovery(batches(), landscape.peak_quality, fraction)
