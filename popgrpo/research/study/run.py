"""``popgrpo reproduce``: every trial of :func:`popgrpo.research.study.plan.build_plan` as a Ray Tune experiment.

One Tune trial per training run. Tune schedules them over the cluster's CPUs (one CPU
each; a trial trains its members in-process, since Tune already spreads trials over the
cores) and records which finished. An interrupted ``reproduce`` run again with the same
``--out`` restores the experiment with ``Tuner.restore``: finished trials are not run
again, and a trial cut off mid-run continues from its last round checkpoint
(:func:`popgrpo.train.resume`), so it ends with exactly the numbers of an uninterrupted run.

Layout of the out directory::

    OUT/plan.json           the trials and the study cells each one serves
    OUT/runs/<trial key>/   one popgrpo run directory per trial
    OUT/tune/               Tune's experiment state (what makes ``restore`` possible)
    OUT/metrics.parquet     every trial's per-epoch metrics, with trial key and seed
    OUT/...                 tables and figures (:mod:`popgrpo.research.study.report`)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from popgrpo.research.study.kinds import study_kind
from popgrpo.research.study.plan import EPOCHS, QUICK_EPOCHS, build_plan

__all__ = [
    "collect_metrics",
    "discovery_plan",
    "discovery_tuning_plan",
    "lm_plan",
    "paper_plan",
    "reproduce",
    "run_trial",
]

EXPERIMENT = "reproduce"


def run_trial(trial: dict, runs_root: str) -> dict:
    """Train one trial (or finish it, or read its result back); return its summary.

    Pure popgrpo, no Tune: the Tune trainable is a thin wrapper, and tests call this directly.
    """
    from popgrpo.config import load_config, preset_path
    from popgrpo.train import resume, train

    run_dir = Path(runs_root) / trial["key"]
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    started, resumed = time.time(), (run_dir / "config.yaml").exists()
    if resumed:
        summary = resume(run_dir, progress=False)
    else:
        config = load_config(preset_path(trial["preset"]), [*trial["overrides"], f"run.seed={trial['seed']}"])
        summary = train(config, run_dir, progress=False)
    # What the trial cost (the study reports seconds per epoch); a resumed trial's is its last part only.
    timing = {"seconds": time.time() - started, "resumed": resumed, "load_average": list(_load_average())}
    (run_dir / "timing.json").write_text(json.dumps(timing) + "\n")
    return summary


def _load_average() -> tuple[float, float, float]:
    import os

    try:
        return os.getloadavg()
    except OSError:  # not every platform has one
        nan = float("nan")
        return nan, nan, nan


def _trainable(params: dict) -> None:
    from ray import tune

    started = time.time()
    summary = run_trial(params["trial"], params["runs_root"])
    tune.report(
        {**{k: v for k, v in summary.items() if isinstance(v, int | float)}, "trial_seconds": time.time() - started}
    )


def reproduce(
    out: str | Path,
    quick: bool = False,
    address: str | None = None,
    num_cpus: int | None = None,
    verbose: int = 1,
    seeds: tuple[int, ...] | None = None,
    epochs: int | None = None,
    landscape: str = "collapse",
    study: str = "paper",
    model: str | None = None,
) -> dict:
    """Run (or finish) the whole study under ``out``; return ``{"trials": n, "seconds": wall}``.

    ``address``: a Ray cluster to run the trials on (default: an embedded local Ray). On a
    multi-node cluster ``out`` must be on storage every node sees. ``seeds`` / ``epochs``
    shrink the plan further (tests); a restored study keeps the plan it started with.
    ``study``: a :data:`popgrpo.registry.STUDIES` name whose kind builds a plan (``paper``:
    :func:`paper_plan`; ``lm``: :func:`lm_plan` on the causal LM in ``model``; ``discovery``,
    ``discovery-tuning``: :func:`discovery_plan`).
    """
    import ray
    from ray import tune

    from popgrpo.runtime.cluster import connect

    out = Path(out).resolve()
    plan_file = out / "plan.json"
    if plan_file.exists():
        saved = json.loads(plan_file.read_text())
        if saved.get("study", "paper") != study:
            raise ValueError(f"{out} holds a --study {saved.get('study', 'paper')} study: use another --out")
        if saved.get("landscape", "collapse") not in ("both", landscape):  # "both": a plan over every landscape
            raise ValueError(
                f"{out} holds a study on the {saved.get('landscape', 'collapse')} landscape: use another --out"
            )
        if saved["quick"] != quick:
            kind = "quick" if saved["quick"] else "full"
            raise ValueError(
                f"{out} holds a {kind} study: rerun with{'' if saved['quick'] else 'out'} --quick, or use another --out"
            )
        if epochs is not None and saved.get("epochs") not in (None, epochs):
            raise ValueError(
                f"{out} holds a study of {saved['epochs']}-epoch trials: rerun without --epochs, or use another --out"
            )
        trials = saved["trials"]
        if seeds is not None and {t["seed"] for t in trials} != set(seeds):
            raise ValueError(f"{out} holds a study of seeds {sorted({t['seed'] for t in trials})}: use another --out")
    else:
        # Before mkdir: a bad plan leaves nothing.
        plan = study_kind(study).new_plan(study, quick, seeds, epochs, landscape, model)
        trials = plan["trials"]
        out.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(json.dumps(plan, indent=1))
    runs_root = str(out / "runs")
    started = time.time()
    started_ray = connect(address, num_cpus=num_cpus)
    _print_where_to_watch(runs_root)
    try:
        trainable = tune.with_resources(_trainable, {"cpu": 1})
        experiment = out / "tune" / EXPERIMENT
        if tune.Tuner.can_restore(str(experiment)):
            # Finished trials keep their results; unfinished and errored ones run again.
            tuner = tune.Tuner.restore(str(experiment), trainable, resume_unfinished=True, restart_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space={"trial": tune.grid_search(trials), "runs_root": runs_root},
                tune_config=tune.TuneConfig(reuse_actors=True),  # a worker imports torch, ribs… once, not per trial
                run_config=tune.RunConfig(
                    name=EXPERIMENT,
                    storage_path=str(out / "tune"),
                    verbose=verbose,
                    failure_config=tune.FailureConfig(max_failures=1),
                ),
            )
        results = tuner.fit()
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise RuntimeError(f"{len(errors)} trial(s) failed; first: {errors[0]}")
    finally:
        if started_ray:
            ray.shutdown()
    unfinished = [t["key"] for t in trials if not (out / "runs" / t["key"] / "summary.json").exists()]
    if not unfinished:
        collect_metrics(out, trials)
    return {"trials": len(trials), "unfinished": len(unfinished), "seconds": time.time() - started}


def paper_plan(study, quick, seeds, epochs, landscape, model) -> dict:
    """plan.json of the main paper's studies (:func:`popgrpo.research.study.plan.build_plan`)."""
    del study, model
    trials = [t.to_json() for t in build_plan(quick, seeds, epochs, landscape, regime=not quick)]
    effective_epochs = epochs or (QUICK_EPOCHS if quick else EPOCHS)
    return {"study": "paper", "quick": quick, "landscape": landscape, "epochs": effective_epochs, "trials": trials}


def lm_plan(study, quick, seeds, epochs, landscape, model) -> dict:
    """plan.json of the collapse study on real programs (:mod:`popgrpo.research.study.lm`) with the causal LM in ``model``."""
    from dataclasses import replace

    from popgrpo.research.study.lm import FULL, QUICK, build_lm_plan

    del study
    if landscape != "collapse":
        raise ValueError("--study lm has no landscapes: drop --landscape")
    if not model or not (Path(model) / "config.json").is_file():
        raise ValueError(f"--model {model}: not a saved causal LM (run `popgrpo lm pretrain --out {model}` first)")
    size = replace(QUICK if quick else FULL, **({"epochs": epochs} if epochs else {}))
    trials = [t.to_json() for t in build_lm_plan(size, str(Path(model).resolve()), seeds)]
    return {
        "study": "lm",
        "quick": quick,
        "landscape": landscape,
        "epochs": size.epochs,
        "window": size.window,
        "model": str(Path(model).resolve()),
        "trials": trials,
    }


def discovery_plan(study, quick, seeds, epochs, landscape, model) -> dict:
    """plan.json of the pre-registered confirmatory discovery study (``discovery``)."""
    from popgrpo.research.study.discovery_plan import load_preregistration

    design, sha = load_preregistration()
    return _discovery(study, design, sha, quick, seeds, epochs, landscape, model)


def discovery_tuning_plan(study, quick, seeds, epochs, landscape, model) -> dict:
    """plan.json of the discovery study's tuning design (``discovery-tuning``)."""
    from popgrpo.research.study.discovery_plan import TUNING

    return _discovery(study, TUNING, None, quick, seeds, epochs, landscape, model)


def _discovery(study, design, sha, quick, seeds, epochs, landscape, model) -> dict:
    """A discovery plan of ``design`` (pre-registered when ``sha``, its file's hash, is given), with
    ``--seeds``, ``--quick`` and ``--epochs`` applied."""
    from popgrpo.research.study.discovery_plan import TUNING, build_discovery_plan, quick_design
    from popgrpo.research.study.plan import design_with_options

    del model
    design = design_with_options(
        study, design, quick_design, (quick, seeds, epochs, landscape), TUNING.seeds, sha is not None
    )
    trials = build_discovery_plan(design)
    return {
        "study": study,
        "quick": quick,
        "landscape": "both",
        "epochs": design.epochs,
        "design": design.to_json(),
        "preregistration_sha256": sha,
        "trials": trials,
    }


def _print_where_to_watch(runs_root: str) -> None:
    import sys

    from popgrpo.telemetry.watching import watch_lines

    lines = watch_lines(None, None, ray_connected=True)
    # Every trial is a run directory under runs_root with its own event files.
    lines.append(
        f"TensorBoard: tensorboard --logdir {runs_root}  (one set of runs per trial; then http://localhost:6006)"
    )
    for line in lines:
        print(f"popgrpo: {line}", file=sys.stderr, flush=True)


def collect_metrics(out: Path, plan: list[dict]) -> Path:
    """Concatenate every trial's ``metrics.parquet`` into ``OUT/metrics.parquet`` (+ trial, seed)."""
    import pandas as pd

    frames = []
    for t in plan:
        frame = pd.read_parquet(Path(out) / "runs" / t["key"] / "metrics.parquet")
        frame.insert(0, "trial", t["key"])
        frame.insert(1, "seed", t["seed"])
        frames.append(frame)
    path = Path(out) / "metrics.parquet"
    pd.concat(frames, ignore_index=True).to_parquet(path, index=False)
    return path
