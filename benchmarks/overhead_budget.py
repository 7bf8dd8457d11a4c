"""Section 3's budget and its saved results, shared by the section and its subsections.

:mod:`benchmarks.round_overhead` measures a round's time outside member training against
:data:`TARGET` and writes section 3, the subsections of :mod:`benchmarks.ray_call_cost` and
:mod:`benchmarks.transport_cost` included; :mod:`benchmarks.ray_call_cost` sets the cost of a
merge's Ray calls against the same budget, read from section 3's saved results. Both import
this module, so neither imports the other's section.
"""

from __future__ import annotations

import statistics
from pathlib import Path

__all__ = ["DEFAULT_JSON", "NOT_THE_RUN", "TARGET", "load_sizes", "rest_share", "spread"]

TARGET = 0.05
"""Section 3's target: the share of a round's time spent outside member training."""

DEFAULT_JSON = Path(__file__).resolve().parent / "data" / "round_overhead.json"
"""Where ``python -m benchmarks.round_overhead`` saves its results (``--json``)."""

NOT_THE_RUN = ("members' epochs", "other processes", "idle cores", "unaccounted")
"""The roles of a split of the cores that are not the run's Ray and actors at rest."""


def rest_share(r: dict) -> float | None:
    """The share of the cores the run's Ray and actors take at rest (every role but the machine's
    other processes and idle cores), or None for results saved before it was measured."""
    rest = r.get("at_rest")
    return None if rest is None else sum(v for k, v in rest.items() if k not in NOT_THE_RUN)


def load_sizes(saved: dict) -> dict[int, dict]:
    """The results of a saved ``--json``: ``{"sizes": {factor: result}}``, or the earlier
    ``{"preset": result, "heavier": result}`` (the preset and 4×)."""
    if "sizes" in saved:
        return {int(k): v for k, v in saved["sizes"].items()}
    return {1: saved["preset"], **({4: saved["heavier"]} if saved.get("heavier") else {})}


def spread(values: list[float], fmt) -> str:
    """``median (lowest–highest)`` of ``values``, each through ``fmt``; the value alone for one."""
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"
