"""Discovery metrics that are not noise: the best noise-free value reached, the peaks reached, and when.

The execution reward ``R = Q·B + ε·B`` (:class:`~popgrpo.envs.idea.IdeaEnv`) has noise σ = 0.3,
so the maximum of a batch's rewards is largely an extreme of that noise. On a landscape whose
peaks the environment can name (:class:`~popgrpo.envs.Landscape`) the same ideas are measured
without noise:

* **best noise-free value**: ``max Q(x)·p_exec(x)`` (the expected reward of the best idea) and
  ``max Q(x)`` over the ideas sampled;
* **peaks reached**: peak ``p`` is reached by an idea ``x`` of its basin (``peak(x) = p``) with
  ``Q(x) ≥ f·q_p``, ``q_p`` the peak's height and ``f`` a fraction (``eval.discovery_threshold``);
  a set, so it unions over the members of a population or over K independent runs;
* **how close to each peak** the ideas came: ``max Q(x) / q_p`` over the ideas of its basin,
  so that reaching can be judged at another fraction afterwards;
* **samples to first discovery** of each peak: the ideas sampled, by every member (or run)
  together, up to and including the first idea that reached it; None (censored at the samples
  spent) when none did.

Peaks are those of ``Q = max_i bump_i``: a peak whose centre lies in a higher, wider peak's
basin (``peak(c_p) ≠ p``; on the collapse landscape, peak 0 of instance 1 and peaks 0 and 1 of
instance 2; none on the calibrated paper landscape's instances 1 and 2) is not a maximum of
``Q`` and is never reached; :func:`reachable_peaks` says which are.

A member computes an epoch's :func:`best_value` and :func:`first_hits` (a metrics row); a study
unions the rows of a population, or of K runs, with :func:`union_discovery`. Shapes: ``N`` ideas
in sampling order (step by step, each step prompt-major), ``n`` peaks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from popgrpo.columns import DISCOVERY_COLUMNS
from popgrpo.core.tensor_lists import int_list

__all__ = [
    "Discovery",
    "DiscoveryPoint",
    "best_value",
    "first_hits",
    "parse_first_hits",
    "parse_peak_fractions",
    "peak_coverage",
    "peak_fractions",
    "peak_hits",
    "peak_reach",
    "reachable_peaks",
    "sampled_discovery",
    "union_discovery",
]

_BEST_EXPECTED, _BEST_QUALITY, _PEAKS, _FRACTIONS = DISCOVERY_COLUMNS


def best_value(values: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """The largest non-NaN entry of ``values [N]`` (where ``mask [N]`` bool is True); NaN when there is none."""
    kept = values.double()
    if mask is not None:
        kept = kept[mask]
    kept = kept[~kept.isnan()]
    return float(kept.max()) if kept.numel() else math.nan


def peak_hits(quality: torch.Tensor, peak: torch.Tensor, peak_height: torch.Tensor, fraction: float) -> torch.Tensor:
    """``[N]`` bool: idea ``i`` reached its peak, ``Q_i ≥ fraction · peak_height[peak_i]``.

    ``quality [N]`` noise-free qualities, ``peak [N]`` int64 the peak of each idea's basin,
    ``peak_height [n]`` each peak's maximum quality, ``fraction`` in (0, 1].
    """
    return quality >= fraction * peak_height[peak]


def first_hits(
    quality: torch.Tensor,
    peak: torch.Tensor,
    peak_height: torch.Tensor,
    fraction: float,
    mask: torch.Tensor | None = None,
) -> dict[int, int]:
    """``{peak: position of the first idea that reached it}`` over ``N`` ideas in sampling order.

    Reaching is :func:`peak_hits`; ``mask [N]`` bool (optional) leaves out the ideas where it is
    False (ideas that were not executed). Positions are 0-based indices into the ``N`` ideas;
    peaks no idea reached are absent. Sorted by peak.
    """
    hits = peak_hits(quality, peak, peak_height, fraction)
    if mask is not None:
        hits = hits & mask
    index = hits.nonzero().flatten()  # ascending: the first hit of a peak is the first listed
    hit_peaks = peak[index]
    firsts = (index[hit_peaks == p][:1] for p in range(len(peak_height)))
    return {p: int(first) for p, first in enumerate(firsts) if first.numel()}


def peak_fractions(
    quality: torch.Tensor,
    peak: torch.Tensor,
    peak_height: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> dict[int, float]:
    """``{peak: max Q / height}`` over the ideas (where ``mask``) in each peak's basin, for every
    basin an idea lies in: how close to each peak's top the ideas came. A peak's fraction is at
    least ``f`` when :func:`first_hits` at fraction ``f`` finds it (up to float32 rounding of
    ``f·height`` there). Sorted by peak."""
    if mask is not None:
        quality, peak = quality[mask], peak[mask]
    fraction = quality.double() / peak_height.double()[peak]
    visited = torch.bincount(peak, minlength=len(peak_height)) > 0
    best = torch.full((len(peak_height),), -math.inf, dtype=torch.float64)
    best = best.scatter_reduce(0, peak, fraction, reduce="amax")
    return {p: float(best[p]) for p in range(len(peak_height)) if bool(visited[p])}


def peak_reach(fractions: Mapping[int, float], peaks: Iterable[int], threshold: float) -> dict[int, bool]:
    """``{peak: reached}`` for each of ``peaks``: its best fraction of its height (``fractions``, as
    :func:`peak_fractions` gives them; a peak absent was never visited) is at least ``threshold``."""
    return {p: fractions.get(p, -math.inf) >= threshold for p in sorted(peaks)}


def peak_coverage(fractions: Mapping[int, float], peaks: Iterable[int], threshold: float) -> float:
    """Coverage above a height threshold: ``mean over peaks p of max(0, f_p − threshold)``.

    ``f_p`` is peak ``p``'s best fraction of its height (``fractions``; 0 for a peak never
    visited), ``peaks`` the peaks averaged over (NaN when none). An idea counts only where it
    lies above ``threshold`` of its peak's height, so sampling widely, which raises every
    basin's fraction a little, adds nothing until it reaches the top part of a peak."""
    targets = sorted(peaks)
    if not targets:
        return math.nan
    return sum(max(0.0, fractions.get(p, 0.0) - threshold) for p in targets) / len(targets)


def reachable_peaks(centre_peaks: torch.Tensor) -> frozenset[int]:
    """The peaks whose centre lies in their own basin: ``centre_peaks [n]`` is the landscape's
    ``peak(peak_centres)``; peak ``p`` is reachable when ``centre_peaks[p] == p``."""
    own = centre_peaks == torch.arange(len(centre_peaks))
    return frozenset(int_list(own.nonzero().flatten()))


def parse_first_hits(cell: object) -> dict[int, int] | None:
    """A row's ``discovery_peaks`` cell (a JSON object ``{"peak": position}``, or that mapping)
    → ``{peak: position}``; None where the row does not know (null, NaN, absent)."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return None
    items: Mapping[object, object] = json.loads(cell) if isinstance(cell, str) else cell  # pyright: ignore[reportAssignmentType]  # a row's cell is JSON text or its mapping
    return {int(str(k)): int(str(v)) for k, v in items.items()}


def parse_peak_fractions(cell: object) -> dict[int, float] | None:
    """A row's ``discovery_peak_fraction`` cell (JSON ``{"peak": fraction}``, or that mapping) →
    ``{peak: fraction}``; None where the row does not know."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return None
    items: Mapping[object, object] = json.loads(cell) if isinstance(cell, str) else cell  # pyright: ignore[reportAssignmentType]  # a row's cell is JSON text or its mapping
    return {int(str(k)): float(str(v)) for k, v in items.items()}


@dataclass(frozen=True)
class DiscoveryPoint:
    """What had been found by the end of an epoch (cumulative over every unit and earlier epoch)."""

    epoch: int
    samples: int  # ideas sampled by every unit through this epoch
    peaks: int  # distinct peaks reached so far
    best_expected: float  # best noise-free expected reward so far (NaN: unknown)
    best_quality: float  # best noise-free quality so far (NaN: unknown)


@dataclass(frozen=True)
class Discovery:
    """What a population, or K independent runs, found: :func:`union_discovery`.

    ``first_discovery`` maps each peak reached to the samples-to-first-discovery: ideas sampled
    by all units together up to and including the first idea that reached it. ``samples`` is
    every idea sampled (where a peak never reached is censored). ``peaks_known`` is False
    when no row says which peaks it reached (an environment without named peaks).
    """

    best_expected: float
    best_quality: float
    samples: int
    first_discovery: dict[int, int]
    peaks_known: bool
    trajectory: tuple[DiscoveryPoint, ...]
    peak_fraction: dict[int, float] = field(default_factory=dict[int, float])  # peak → best Q / height, any unit

    def peaks_at(self, fraction: float) -> frozenset[int]:
        """The peaks some idea reached at another threshold ``fraction`` of their height (from
        :attr:`peak_fraction`; the samples to reach them are known only at the run's own threshold)."""
        return frozenset(p for p, f in self.peak_fraction.items() if f >= fraction)

    @property
    def peaks(self) -> frozenset[int]:
        """The distinct peaks reached by any unit."""
        return frozenset(self.first_discovery)

    def samples_to_first(self, peak: int) -> int | None:
        """Samples to the first discovery of ``peak``; None (censored at :attr:`samples`) when never."""
        return self.first_discovery.get(peak)


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan  # None, absent: unknown


def _nanmax(a: float, b: float) -> float:
    return b if math.isnan(a) else a if math.isnan(b) else max(a, b)


def union_discovery(rows: Iterable[Mapping[str, object]], unit: Sequence[str] = ("member",)) -> Discovery:
    """Union of the discovery columns of per-epoch metrics rows, over every unit that sampled.

    ``rows``: one mapping per unit per epoch with ``epoch``, ``ideas`` and the columns
    :data:`popgrpo.columns.DISCOVERY_COLUMNS` (a run's ``metrics.parquet`` as records). A unit is
    one sampling stream, named by the ``unit`` keys: ``("member",)`` for one run's population,
    ``("run", "member")`` for K runs whose rows carry a ``run`` key (best-of-K: K runs of one
    member are K units, exactly like a population of K).

    Samples are counted as if the units sampled in lockstep, one idea each in turn, epoch by
    epoch (as synchronous rounds do): the ``i``-th idea (0-based) of a unit in epoch ``e`` is
    sample number ``C_e + Σ_u min(i + 1, n_{u,e})``, where ``C_e`` is every idea of the epochs
    before ``e`` and ``n_{u,e}`` unit ``u``'s ideas in epoch ``e``. A population and K
    independent runs with the same ideas per epoch are so charged the same.
    """
    by_epoch: dict[int, list[Mapping[str, object]]] = {}
    for row in rows:
        by_epoch.setdefault(int(_number(row["epoch"])), []).append(row)
    best_expected = best_quality = math.nan
    first: dict[int, int] = {}
    fractions: dict[int, float] = {}
    known = False
    samples = 0
    trajectory: list[DiscoveryPoint] = []
    for epoch in sorted(by_epoch):
        epoch_rows = by_epoch[epoch]
        units = {tuple(row.get(key) for key in unit) for row in epoch_rows}
        if len(units) != len(epoch_rows):
            raise ValueError(f"epoch {epoch}: several rows of one unit {unit}; give the keys that tell them apart")
        ideas = [int(_number(row["ideas"])) for row in epoch_rows]
        for row in epoch_rows:
            best_expected = _nanmax(best_expected, _number(row.get(_BEST_EXPECTED)))
            best_quality = _nanmax(best_quality, _number(row.get(_BEST_QUALITY)))
            for peak, fraction in (parse_peak_fractions(row.get(_FRACTIONS)) or {}).items():
                fractions[peak] = max(fractions.get(peak, -math.inf), fraction)
            hits = parse_first_hits(row.get(_PEAKS))
            if hits is None:
                continue
            known = True
            for peak, position in hits.items():
                if peak in first and first[peak] <= samples:
                    continue  # found in an earlier epoch
                at = samples + sum(min(position + 1, n) for n in ideas)
                first[peak] = min(first.get(peak, at), at)
        samples += sum(ideas)
        trajectory.append(DiscoveryPoint(epoch, samples, len(first), best_expected, best_quality))
    return Discovery(
        best_expected=best_expected,
        best_quality=best_quality,
        samples=samples,
        first_discovery=dict(sorted(first.items())),
        peaks_known=known,
        trajectory=tuple(trajectory),
        peak_fraction=dict(sorted(fractions.items())),
    )


def sampled_discovery(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]],
    peak_height: torch.Tensor,
    fraction: float,
) -> Discovery:
    """What one stream of ideas found, fed batch by batch in sampling order (a random search).

    Each batch is ``(quality [B], peak [B], expected [B] or None, executed [B] bool or None)``:
    the ideas' noise-free quality, basin, noise-free expected reward and whether each counts
    (None: all). Returns a :class:`Discovery` as :func:`union_discovery` would of one unit whose
    rows held these ideas: best values, first hits at ``fraction`` (positions 1-based, as
    samples-to-first-discovery), the best fraction of each basin visited, the samples; no
    trajectory."""
    best_expected = best_quality = math.nan
    first: dict[int, int] = {}
    fractions: dict[int, float] = {}
    samples = 0
    for quality, peak, expected, executed in batches:
        if expected is not None:
            best_expected = _nanmax(best_expected, best_value(expected, executed))
        best_quality = _nanmax(best_quality, best_value(quality, executed))
        for p, at in first_hits(quality, peak, peak_height, fraction, executed).items():
            first.setdefault(p, samples + at + 1)
        for p, f in peak_fractions(quality, peak, peak_height, executed).items():
            fractions[p] = max(fractions.get(p, -math.inf), f)
        samples += int(quality.shape[0])
    return Discovery(
        best_expected=best_expected,
        best_quality=best_quality,
        samples=samples,
        first_discovery=dict(sorted(first.items())),
        peaks_known=True,
        trajectory=(),
        peak_fraction=dict(sorted(fractions.items())),
    )
