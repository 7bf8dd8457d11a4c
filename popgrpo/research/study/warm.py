"""``popgrpo reproduce --study warm``: do WARM's three claims hold in the idea environment?

WARM (Ramé et al. 2024, ``shared/seeds/003_…``) claims that the weight average of M reward
models fine-tuned from one pre-trained start (1) is linearly mode connected to them, and
as accurate as, or more than, their prediction ensemble under distribution shift (Fig. 3);
(2) memorises corrupted labels less than ENS and generalises at least as well (Figs. 4–5);
(3) makes a better proxy: best-of-N (Fig. 6) and RL (Figs. 1b, 8) keep the control reward
rising for longer. For every seed and both settings (clean labels, 25% swapped) this study

* builds an RM directory (:mod:`popgrpo.reward_models.training`, in this process: M RMs from
  one featurizer, Baklava initialisations, lr and dropout drawn per RM), with shifted pairs
  from a policy trained by GRPO on execution;
* measures accuracies along the line between RMs 0 and 1 (weights vs predictions vs the
  diagonal), WA vs ENS for M = 2…M on the four subsets, best-of-N control reward against KL;
* trains GRPO against each single RM (M = 1: one run per RM, reported as their mean and
  spread, so "one RM" is not one arbitrary draw), ENS M = 2 and WARM M = 2…M, Pop-GRPO against
  WARM, and GRPO on execution as the reference, every run logging its control reward.

Layout of the out directory::

    OUT/rms/<setting>-seed<s>/     one RM directory per setting and seed
    OUT/runs/<setting>-seed<s>-<proxy>/   one popgrpo run directory per RL run (proxy
                                   execution, single_<k>, ens2, warm<m>, pop_warm<M>)
    OUT/lmc.parquet, corruption.parquet, bon.parquet, rl.parquet   the measurements (zstd;
                                   rl: one row per run and epoch, population means)
    OUT/study.json                 the plan and the wall time
    OUT/warm.md, verdicts.json     tables, claims and verdicts; OUT/fig*_*.png the figures
                                   (``popgrpo report OUT`` redraws them from the four Parquet
                                   files and study.json alone: docs/results/warm holds those)

Finished RM directories and runs are kept, so the same command again resumes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

if TYPE_CHECKING:
    from popgrpo.reward_models.config import RMTrainConfig

__all__ = ["FULL", "QUICK", "WarmStudy", "run_warm_study"]

SETTINGS = {"clean": 0.0, "corrupt": 0.25}


@dataclass(frozen=True)
class WarmStudy:
    """What one study runs; :data:`FULL` and :data:`QUICK` are the two shipped sizes."""

    # 16 paired seeds (42, 142, …, 1542): the 3-seed study's RL effects had d_z about 1, which a
    # paired t-test at the strictest Holm threshold of the report's 21 claims (0.05/21) detects
    # with 64% power at 16 seeds (8 seeds: 15%, 3 seeds: 1%; statsmodels' TTestPower); one
    # seed costs about 80 s of one free core.
    seeds: tuple[int, ...] = tuple(42 + 100 * i for i in range(16))
    n_models: int = 6
    rm_overrides: tuple[str, ...] = ()
    shift_epochs: int = 30
    rl_epochs: int = 30
    rl_window: int = 5
    # RMs trained against one by one in RL (RMs 0…k−1, runs single_<k>); None: every RM.
    rl_singles: int | None = None
    pop: bool = True
    bon_ns: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    bon_groups: int = 1000
    lmc_points: int = 11
    settings: dict = field(default_factory=lambda: dict(SETTINGS))


FULL = WarmStudy()
QUICK = WarmStudy(
    seeds=(42,),
    n_models=3,
    rm_overrides=(
        "data.reference_ideas=1024",
        "data.train_pairs=400",
        "data.test_pairs=200",
        "data.shifted_pairs=200",
        "featurizer.pretrain_steps=100",
        "featurizer.pretrain_ideas=1024",
        "featurizer.checkpoints=3",
        "finetune.epochs=3",
    ),
    shift_epochs=3,
    rl_epochs=3,
    rl_window=2,
    pop=False,
    bon_ns=(1, 4, 16),
    bon_groups=100,
    lmc_points=3,
)


def _proxies(study: WarmStudy) -> list[tuple[str, str, str, int | None, int]]:
    """(name, preset, combine, n_models, index) of every RL run per setting and seed."""
    M = study.n_models
    singles = M if study.rl_singles is None else min(study.rl_singles, M)
    runs: list[tuple[str, str, str, int | None, int]] = [("execution", "grpo", "execution", None, 0)]
    runs += [(f"single_{k}", "grpo", "single", None, k) for k in range(singles)]
    runs.append(("ens2", "grpo", "ens", 2, 0))
    runs += [(f"warm{m}", "grpo", "warm", m, 0) for m in range(2, M + 1)]
    if study.pop:
        runs.append((f"pop_warm{M}", "pop_grpo", "warm", M, 0))
    return runs


# ---- RM directories -------------------------------------------------------------------------
def _rm_config(study: WarmStudy, seed: int, corruption: float):
    from popgrpo.reward_models.config import load_rm_config

    return load_rm_config(
        None,
        [
            f"seed={seed}",
            f"data.corruption={corruption}",
            f"data.shift_epochs={study.shift_epochs}",
            f"finetune.n_models={study.n_models}",
            *study.rm_overrides,
        ],
    )


def build_rm_dir(rm_cfg: RMTrainConfig, rm_dir: Path, shifted: Mapping[str, torch.Tensor] | None) -> dict:
    """An RM directory, in this process (the same steps as ``popgrpo rm train``, without Tune)."""
    from popgrpo.reward_models.reference import load_base
    from popgrpo.reward_models.store import load_manifest
    from popgrpo.reward_models.training import draw_hyperparameters, finalize, finetune_member, prepare

    if (rm_dir / "rms.json").exists():
        return load_manifest(rm_dir)
    prepare(rm_cfg, load_base(rm_cfg), rm_dir, shifted)
    entries = [finetune_member(rm_cfg, rm_dir, h) for h in draw_hyperparameters(rm_cfg)]
    return finalize(rm_cfg, rm_dir, entries)


# ---- measurements ---------------------------------------------------------------------------
def _models(rm_dir: Path):
    from popgrpo.reward_models.store import build_model, load_manifest, load_states

    manifest = load_manifest(rm_dir)
    states = load_states(rm_dir, [m["file"] for m in manifest["models"]])
    return manifest, states, [build_model(manifest, s) for s in states]


def lmc_rows(rm_dir: Path, points: int) -> list[dict]:
    """Accuracy along θ(λ) = (1 − λ)θ_0 + λθ_1: of the interpolated weights, of the interpolated
    predictions, and the diagonal (1 − λ)·acc_0 + λ·acc_1 (WARM Fig. 3)."""
    from popgrpo.core.reward_model import ensemble_scores, interpolate
    from popgrpo.reward_models.store import build_model
    from popgrpo.reward_models.training import SUBSETS, accuracies, load_pairs

    manifest, states, models = _models(rm_dir)
    pairs = load_pairs(rm_dir)
    ends = [accuracies(m, pairs) for m in models[:2]]
    rows = []
    for lam in np.linspace(0.0, 1.0, points):
        lam = float(lam)
        wa = accuracies(build_model(manifest, interpolate(states[0], states[1], lam)), pairs)
        ens = accuracies(lambda x, lam=lam: ensemble_scores([models[0](x), models[1](x)], [1 - lam, lam]), pairs)
        for subset in SUBSETS:
            diag = (1 - lam) * ends[0][subset] + lam * ends[1][subset]
            rows.append({"lam": lam, "subset": subset, "wa": wa[subset], "ens": ens[subset], "diagonal": diag})
    return rows


def corruption_rows(rm_dir: Path, oracle: Callable[[torch.Tensor], torch.Tensor]) -> list[dict]:
    """WA vs ENS of the first M RMs, M = 1…all, on every subset (WARM Figs. 4–5), beside the
    accuracy of the oracle ``oracle`` (the noise-free expected reward: the best any RM can rank)."""
    from popgrpo.core.reward_model import ensemble_scores, weight_average
    from popgrpo.reward_models.store import build_model
    from popgrpo.reward_models.training import SUBSETS, accuracies, load_pairs

    manifest, states, models = _models(rm_dir)
    pairs = load_pairs(rm_dir)
    best = accuracies(oracle, pairs)
    rows = []
    for m in range(1, len(models) + 1):
        wa = accuracies(build_model(manifest, weight_average(states[:m])), pairs)
        ens = accuracies(lambda x, m=m: ensemble_scores([model(x) for model in models[:m]]), pairs)
        for subset in SUBSETS:
            rows.append({"m": m, "subset": subset, "wa": wa[subset], "ens": ens[subset], "oracle": best[subset]})
    return rows


def bon_rows(rm_dir: Path, study: WarmStudy, seed: int) -> list[dict]:
    """Best-of-N control reward against KL for single RMs (each, then their mean), ENS and WARM."""
    from popgrpo.reward_models.reference import best_of_n_curve

    M, ns = study.n_models, list(study.bon_ns)
    rows = []

    def add(name: str, combine: str, n_models: int | None, index: int = 0) -> None:
        for point in best_of_n_curve(rm_dir, combine, n_models, ns, study.bon_groups, seed, index):
            rows.append({"proxy": name, **point})

    for k in range(M):
        add(f"single_{k}", "single", None, k)
    add("ens2", "ens", 2)
    add(f"ens{M}", "ens", M)
    for m in range(2, M + 1):
        add(f"warm{m}", "warm", m)
    return rows


def rl_run(
    study: WarmStudy,
    seed: int,
    rm_dir: Path,
    run_dir: Path,
    preset: str,
    combine: str,
    n_models: int | None,
    index: int = 0,
) -> pd.DataFrame:
    """One RL run against a proxy (or on execution), in this process; its metrics."""
    from popgrpo.config import load_config, preset_path
    from popgrpo.runtime.executor_spec import LOCAL
    from popgrpo.train import train

    if not (run_dir / "summary.json").exists():
        overrides = [f"run.seed={seed}", f"run.epochs={study.rl_epochs}", "run.loggers=[]"]
        if preset == "pop_grpo":
            overrides.append(f"scheduler.interval_epochs={max(1, min(10, study.rl_epochs // 2))}")
        if combine != "execution":
            overrides += ["reward.source=proxy", f"reward.proxy.dir={rm_dir}", f"reward.proxy.combine={combine}"]
            if n_models is not None:
                overrides.append(f"reward.proxy.n_models={n_models}")
            if combine == "single":
                overrides.append(f"reward.proxy.index={index}")
        if run_dir.exists():  # an unfinished run: start it again
            import shutil

            shutil.rmtree(run_dir)
        train(load_config(preset_path(preset), overrides), run_dir, LOCAL, progress=False)
    return pd.read_parquet(run_dir / "metrics.parquet")


RL_COLUMNS = ("reward_mean", "control_reward_mean", "control_expected_reward")
"""The per-epoch measures ``rl.parquet`` keeps of each RL run (population means): what the report
reads. Each run's ``metrics.parquet`` under ``runs/`` keeps the rest."""


def run_curve(metrics: pd.DataFrame) -> pd.DataFrame:
    """One run's per-epoch curve: the mean over members of each of :data:`RL_COLUMNS`, and
    ``members`` (how many were averaged). ``metrics`` is the run's ``metrics.parquet``
    (one row per member and epoch); the result has one row per epoch."""
    grouped = metrics.groupby("epoch", sort=True)
    curve = grouped[[c for c in RL_COLUMNS if c in metrics.columns]].mean()
    curve["members"] = grouped.size()
    return curve.reset_index()


# ---- the whole study ------------------------------------------------------------------------
def run_warm_study(out: str | Path, study: WarmStudy = FULL, progress: bool = True) -> dict:
    """Run (or resume) the study into ``out``; write the Parquet files, figures and warm.md."""
    from tqdm import tqdm

    from popgrpo.envs.idea import IdeaEnv
    from popgrpo.reward_models.reference import load_base
    from popgrpo.reward_models.tune import shifted_policy_weights

    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    tables: dict[str, list[dict]] = {"lmc": [], "corruption": [], "bon": [], "rl": []}
    proxies = _proxies(study)
    trained = 0
    bar = tqdm(
        total=len(study.seeds) * len(study.settings) * (1 + len(proxies)), desc="warm study", disable=not progress
    )
    for seed in study.seeds:
        shifted = None
        for setting, corruption in study.settings.items():
            rm_cfg = _rm_config(study, seed, corruption)
            rm_dir = out / "rms" / f"{setting}-seed{seed}"
            if not (rm_dir / "rms.json").exists() and shifted is None:
                shifted = shifted_policy_weights(load_base(rm_cfg), study.shift_epochs)
            build_rm_dir(rm_cfg, rm_dir, shifted)
            tag = {"setting": setting, "seed": seed}
            tables["lmc"] += [{**tag, **r} for r in lmc_rows(rm_dir, study.lmc_points)]
            oracle = IdeaEnv(load_base(rm_cfg).env).expected_reward
            tables["corruption"] += [{**tag, **r} for r in corruption_rows(rm_dir, oracle)]
            tables["bon"] += [{**tag, **r} for r in bon_rows(rm_dir, study, seed)]
            bar.update(1)
            for name, preset, combine, n_models, index in proxies:
                run_dir = out / "runs" / f"{setting}-seed{seed}-{name}"
                trained += not (run_dir / "summary.json").exists()
                metrics = rl_run(study, seed, rm_dir, run_dir, preset, combine, n_models, index)
                tables["rl"] += run_curve(metrics).assign(proxy=name, **tag).to_dict("records")
                bar.update(1)
    bar.close()
    frames = {name: pd.DataFrame(rows) for name, rows in tables.items()}
    for name, frame in frames.items():
        frame.to_parquet(out / f"{name}.parquet", index=False, compression="zstd")
    seconds = time.time() - started
    record_invocation(out, study, seconds, trained)
    from popgrpo.research.study.warm_report import render_warm

    written = render_warm(out, frames, study, seconds)
    return {"seconds": seconds, "written": [str(p) for p in written]}


def record_invocation(out: Path, study: WarmStudy, seconds: float, trained: int) -> dict:
    """Write ``out/study.json``: the plan, and every invocation so far (its wall seconds, seeds,
    RL runs trained, finish time) appended to those already recorded there, so a resumed or
    split study keeps what each part cost."""
    path = out / "study.json"
    before = json.loads(path.read_text()) if path.is_file() else {}
    invocation = {
        "seconds": round(seconds, 1),
        "seeds": list(study.seeds),
        "runs_trained": trained,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    record = {
        "seconds": seconds,
        "invocations": [*before.get("invocations", []), invocation],
        "study": {k: v for k, v in study.__dict__.items()},
    }
    path.write_text(json.dumps(record, indent=2, default=list) + "\n")
    return record


def quick(study: WarmStudy = QUICK, **changes: Any) -> WarmStudy:
    """``study`` with fields changed (tests shrink it further)."""
    return replace(study, **changes)


def _finite_mean(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan
