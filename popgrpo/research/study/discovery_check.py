"""Does discovery on a landscape family need learning? GRPO against the best random sampler.

``python -m popgrpo.research.study.discovery_check --out docs/results/stepping-stones`` runs, on every
instance of :data:`INSTANCES` of a study landscape (default ``stepping_stones``):

* the GRPO control: best-of-K GRPO (the ``pop_grpo`` preset with ``scheduler.enabled=false``:
  K = 5 independent members) at the landscape's overrides, :data:`EPOCHS` epochs and
  :data:`INTENSITY` updates per epoch, one seed per instance (:func:`control_overrides`);
* random search: ideas drawn from ``N(0, w²·I)`` at every width ``w`` of
  :data:`~popgrpo.research.study.discovery.WIDTHS`, as many as the control sampled, every idea counted
  (not only the executed ones: kinder to random search than the control's own rule);

and writes ``landscape_check.json``: per instance, the far peaks each reached at
:data:`THRESHOLD` of their height, the best fraction of each far peak's height, the best
noise-free quality. :func:`problems` says where the property fails: the best random sampler over
the widths must reach at most half the far peaks the control reaches, and a lower best quality.
tests/research/study/test_discovery_check.py holds the committed file to it and recomputes parts of it.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from popgrpo.research.study.discovery import WIDTHS, random_search

__all__ = [
    "EPOCHS",
    "INSTANCES",
    "INTENSITY",
    "THRESHOLD",
    "check_landscape",
    "check_markdown",
    "control_overrides",
    "grpo_control",
    "landscape_env",
    "problems",
    "random_side",
]

INSTANCES = tuple(range(1, 9))
"""``env.peak_seed`` of the instances checked: 8, the instances a confirmatory study uses."""
EPOCHS, INTENSITY, THRESHOLD = 120, 4, 0.7
SEED_BASE = 2000  # the control's run.seed on instance i is SEED_BASE + i
CHECK_FILE = "landscape_check.json"


def control_overrides(landscape: str, instance: int, epochs: int = EPOCHS, intensity: int = INTENSITY) -> list[str]:
    """The GRPO control's overrides of the ``pop_grpo`` preset on ``instance`` of ``landscape``."""
    from popgrpo.research.study.plan import landscape_overrides

    return [
        *landscape_overrides(landscape),
        "scheduler.enabled=false",
        f"run.epochs={epochs}",
        f"grpo.steps_per_epoch={intensity}",
        f"eval.discovery_threshold={THRESHOLD}",
        f"env.peak_seed={instance}",
        f"run.seed={SEED_BASE + instance}",
        "run.loggers=[]",
    ]


def _found(discovery, far: list[int], samples: int | None = None) -> dict:
    fractions = {p: max(discovery.peak_fraction.get(p, 0.0), 0.0) for p in far}
    return {
        "samples": int(samples if samples is not None else discovery.samples),
        "best_quality": float(discovery.best_quality),
        "far_reached": sorted(p for p in far if fractions[p] >= THRESHOLD),
        "far_fraction": {str(p): round(f, 6) for p, f in fractions.items()},
    }


def landscape_env(landscape: str, instance: int):
    """The GRPO control's config on ``instance`` of ``landscape``, and its environment."""
    from popgrpo.config import load_config, preset_path
    from popgrpo.envs import make_env
    from popgrpo.research.study.plan import landscape_preset

    config = load_config(preset_path(landscape_preset("pop_grpo", landscape)), control_overrides(landscape, instance))
    return config, make_env(config.env)


def grpo_control(landscape: str, instance: int, epochs: int = EPOCHS) -> dict:
    """Train the GRPO control on ``instance`` and return what it found (far peaks, best quality)."""
    import pandas as pd

    from popgrpo.research.study.discovery import run_discovery
    from popgrpo.train import train

    config, env = landscape_env(landscape, instance)
    if epochs != EPOCHS:
        config = config.model_copy(update={"run": config.run.model_copy(update={"epochs": epochs})})
    with tempfile.TemporaryDirectory() as run_dir:
        train(config, run_dir, progress=False)
        metrics = pd.read_parquet(Path(run_dir) / "metrics.parquet")
    return _found(run_discovery(metrics), sorted(env.far_peaks))


def random_side(landscape: str, instance: int, samples: int, width: float) -> dict:
    """Random search at ``width`` with ``samples`` ideas on ``instance`` (generator seeded by the instance)."""
    _, env = landscape_env(landscape, instance)
    found = random_search(env, samples, width, torch.Generator().manual_seed(instance), THRESHOLD, executed_only=False)
    return _found(found, sorted(env.far_peaks))


def check_landscape(landscape: str = "stepping_stones", instances: tuple[int, ...] = INSTANCES) -> dict:
    """Every instance's control and random search at every width (minutes: one training run per instance)."""
    config, _ = landscape_env(landscape, instances[0])
    rows = []
    for instance in instances:
        started = time.time()
        control = grpo_control(landscape, instance)
        searches = {f"{w:g}": random_side(landscape, instance, control["samples"], w) for w in WIDTHS}
        rows.append({"instance": instance, "grpo": control, "random_search": searches})
        print(f"instance {instance}: {time.time() - started:.0f} s", flush=True)
    return {
        "landscape": landscape,
        "threshold": THRESHOLD,
        "epochs": EPOCHS,
        "intensity": INTENSITY,
        "overrides": control_overrides(landscape, 0)[:-3],
        "env": config.env.model_dump(exclude={"kind", "text", "code", "peak_seed"}),
        "widths": list(WIDTHS),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "instances": rows,
    }


def problems(check: dict) -> list[str]:
    """Where the property fails: per instance, the best random sampler over the widths reaches
    more than half the far peaks the control reaches, or a best quality at least the control's."""
    out = []
    for row in check["instances"]:
        control, searches = row["grpo"], row["random_search"].values()
        most = max(len(s["far_reached"]) for s in searches)
        best = max(s["best_quality"] for s in searches)
        if most > 0.5 * len(control["far_reached"]):
            out.append(
                f"instance {row['instance']}: random search reached {most} far peaks, GRPO {control['far_reached']}"
            )
        if best >= control["best_quality"]:
            out.append(f"instance {row['instance']}: random search's best quality {best:.3f} >= GRPO's")
    return out


def check_markdown(check: dict) -> str:
    """The check as a table, one row per instance: what docs/DISCOVERY.md shows (a test holds it so)."""
    lines = [
        "| instance | GRPO: far peaks reached | GRPO: best quality | random search: most far peaks (any width) "
        "| random search: best far-peak fraction | random search: best quality (width) |",
        "| --- " * 6 + "|",
    ]
    for row in check["instances"]:
        control, searches = row["grpo"], row["random_search"]
        n_far = len(control["far_fraction"])
        best_width = max(searches, key=lambda w: searches[w]["best_quality"])
        most = max(len(s["far_reached"]) for s in searches.values())
        closest = max(max(s["far_fraction"].values()) for s in searches.values())
        lines.append(
            f"| {row['instance']} | {len(control['far_reached'])} of {n_far} | {control['best_quality']:.3f} "
            f"| {most} of {n_far} | {closest:.2f} | {searches[best_width]['best_quality']:.3f} ({best_width}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m popgrpo.research.study.discovery_check", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="directory to write landscape_check.json into")
    parser.add_argument("--landscape", default="stepping_stones", help="a study landscape (STUDY_LANDSCAPES)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    check = check_landscape(args.landscape)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / CHECK_FILE).write_text(json.dumps(check, indent=1) + "\n")
    found = problems(check)
    print("\n".join(found) or "the property holds on every instance")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
