"""Random search as a discovery study's baseline arm, at a width tuned on the tuning instance only.

For every cell (landscape × intensity) of a study, random search draws as many ideas as a run of
the cell sampled from ``N(0, w²·I)`` (:func:`popgrpo.research.study.discovery.random_search`, scored by the
runs' own rule: only ideas whose execution succeeded count). Its width ``w`` is tuned per
landscape, intensity and metric over :data:`~popgrpo.research.study.discovery.WIDTHS` (0.25 to 8) on the
tuning design's instance and seeds (:data:`popgrpo.research.study.discovery_plan.TUNING`), which the
confirmatory study never uses: the best width for each metric, so random search meets every
metric at its own best width. The confirmatory units (instance, seed) then each get one search
per tuned width.

Two Parquet files beside the study's trials, redrawn from by the report:

    OUT/discovery_random_widths.parquet   tuning: landscape, intensity, width, metric means
    OUT/discovery_random_search.parquet   one row per unit and cell, the trials table's columns
                                          (arm "random search"), plus each metric's width

``python -m popgrpo.research.study.discovery_random OUT`` writes them for a study directory whose
``discovery_trials.parquet`` exists (minutes: every search is up to 614,400 ideas).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from popgrpo.research.study.discovery import RANDOM_SEARCH, WIDTHS, discovery_summary, random_search, reachable
from popgrpo.research.study.discovery_plan import TUNING

__all__ = ["RANDOM_FILE", "WIDTH_FILE", "random_arm", "search_unit", "tune_widths", "tuned_widths"]

RANDOM_FILE, WIDTH_FILE = "discovery_random_search.parquet", "discovery_random_widths.parquet"

# Metric -> True when higher is better: what a width is tuned for.
TUNED_METRICS = {
    "best_quality": True,
    "peak_fraction_mean": True,
    "peaks": True,
    "best_expected": True,
    "discovery_time": False,
    "coverage": True,
}


@lru_cache(maxsize=64)
def _environment(landscape: str, instance: int):
    from popgrpo.config import load_config, preset_path
    from popgrpo.envs import make_env
    from popgrpo.research.study.discovery_plan import LANDSCAPE_PRESET
    from popgrpo.research.study.plan import landscape_overrides, landscape_preset

    preset = preset_path(landscape_preset(LANDSCAPE_PRESET, landscape))
    return make_env(load_config(preset, [*landscape_overrides(landscape), f"env.peak_seed={instance}"]).env)


def search_unit(
    landscape: str, instance: int, intensity: int, seed: int, samples: int, width: float, threshold: float
) -> dict[str, float | str]:
    """One random search of a unit (instance, seed) in a cell: its :func:`discovery_summary`.

    The generator is seeded from (seed, instance, intensity, width), so the same unit and width
    give the same search whatever else is computed."""
    env = _environment(landscape, instance)
    entropy = np.random.SeedSequence([seed, instance, intensity, round(width * 1000)]).generate_state(1)[0]
    generator = torch.Generator().manual_seed(int(entropy))
    found = random_search(env, samples, width, generator, threshold)
    far = frozenset(getattr(env, "far_peaks", ()))
    return discovery_summary(found, reachable(env, env.peak_centres), far)


def tune_widths(
    landscapes: list[str],
    samples: dict[int, int],
    threshold: float,
    instances=TUNING.instances,
    seeds=TUNING.seeds,
    metrics: Mapping[str, bool] = TUNED_METRICS,
) -> pd.DataFrame:
    """Mean of every tuned metric (``metrics``: name → higher is better) over the tuning units, per
    landscape × intensity × width (``samples``: intensity → ideas a run of that intensity samples)."""
    rows = []
    for landscape in landscapes:
        for intensity, n in sorted(samples.items()):
            for width in WIDTHS:
                found = [search_unit(landscape, i, intensity, s, n, width, threshold) for i in instances for s in seeds]
                means = {m: float(np.mean([float(f[m]) for f in found])) for m in metrics}
                rows.append({"landscape": landscape, "intensity": intensity, "width": width, **means})
    return pd.DataFrame(rows)


def tuned_widths(
    tuning: pd.DataFrame, metrics: Mapping[str, bool] = TUNED_METRICS
) -> dict[tuple[str, int, str], float]:
    """(landscape, intensity, metric) → the width with the best tuning mean of that metric (the
    first of the smallest widths on a tie)."""
    best: dict[tuple[str, int, str], float] = {}
    for row in tuning[["landscape", "intensity"]].drop_duplicates().itertuples(index=False):
        landscape, intensity = str(row[0]), int(row[1])
        part = tuning[(tuning["landscape"] == landscape) & (tuning["intensity"] == intensity)]
        for metric, higher in metrics.items():
            order = part.sort_values(metric, ascending=not higher, kind="stable")
            best[(landscape, intensity, metric)] = float(order["width"].iloc[0])
    return best


def random_arm(trials: pd.DataFrame, design: dict, tuning: pd.DataFrame) -> pd.DataFrame:
    """Random search on every confirmatory unit and cell of ``trials``, each metric at its tuned width."""
    widths = tuned_widths(tuning)
    samples = trials.groupby(["landscape", "intensity"])["samples"].max()
    rows = []
    units = trials[["landscape", "instance", "intensity", "seed"]].drop_duplicates()
    for unit in units.itertuples(index=False):
        landscape, instance, intensity, seed = str(unit[0]), int(unit[1]), int(unit[2]), int(unit[3])
        n = int(samples[(landscape, intensity)])
        chosen = {m: widths[(landscape, intensity, m)] for m in TUNED_METRICS}
        found = {
            w: search_unit(landscape, instance, intensity, seed, n, w, design["threshold"])
            for w in sorted(set(chosen.values()))
        }
        # Columns no metric is tuned for come from the best_quality width's search.
        row: dict[str, object] = dict(found[chosen["best_quality"]])
        row.update({m: found[w][m] for m, w in chosen.items()})
        row.update({f"width_{m}": w for m, w in chosen.items()})
        key = f"random-{landscape}-{instance}-{intensity}-{seed}"
        labels = {"key": key, "landscape": landscape, "instance": instance, "intensity": intensity, "seed": seed}
        rows.append({**labels, "arm": RANDOM_SEARCH, **row})
    return pd.DataFrame(rows)


def write_random_search(out: str | Path) -> list[Path]:
    """Tune and run random search for the study in ``out``; write the two Parquet files."""
    out = Path(out)
    design = json.loads((out / "plan.json").read_text())["design"]
    trials = pd.read_parquet(out / "discovery_trials.parquet")
    per_intensity = trials.groupby("intensity")["samples"].max()
    samples = {int(i): int(per_intensity[i]) for i in per_intensity.index}
    tuning = tune_widths(list(design["landscapes"]), samples, design["threshold"])
    tuning.to_parquet(out / WIDTH_FILE, index=False, compression="zstd")
    random_arm(trials, design, tuning).to_parquet(out / RANDOM_FILE, index=False, compression="zstd")
    return [out / WIDTH_FILE, out / RANDOM_FILE]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m popgrpo.research.study.discovery_random", description="Random search beside a discovery study."
    )
    parser.add_argument("out", help="the study directory (plan.json, discovery_trials.parquet)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for path in write_random_search(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
