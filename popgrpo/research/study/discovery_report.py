"""The discovery study's tables, figures and verdicts (``popgrpo reproduce --study discovery[-tuning]``).

Every trial is summarised once (:func:`popgrpo.research.study.discovery.trial_summary`) into two
Parquet files that are all the report needs, so ``popgrpo report DIR`` redraws everything
from them without the run directories:

    OUT/discovery_trials.parquet  one row per trial: its cell (arm, landscape, instance,
                                  intensity, seed) and what it found
    OUT/discovery_curves.parquet  per trial and epoch: samples, peaks reached, best values so far

The confirmatory report (``phase: confirmatory``) judges, against the best-of-K control, every
mechanism of the design on every pre-registered metric: per cell (landscape × intensity) and
pooled over intensities per landscape (a unit's mean difference over the intensities), units
paired by (landscape instance, seed), confidence intervals by the hierarchical bootstrap over
instances then seeds, one Holm family for the primary metrics and one for the secondary
(:func:`popgrpo.research.study.stats.judge`). It writes ``verdicts.json`` (one record per claim:
landscape, intensity or ``pooled``, mechanism, metric, mean paired difference, CI, Holm p,
verdict) and ``verdicts.md``, ``arms.md``, the figures and the compute check.

The tuning report (``phase: tuning``) writes per-arm means and paired effects against the
control (``tuning.md``, ``tuning.json``) and, for each mechanism, the seeds a confirmatory
study would need for power 0.8 (statsmodels' ``TTestPower``, at the Bonferroni level of the
family's first Holm step: conservative).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from popgrpo.markdown import md_table
from popgrpo.research.study.discovery_plan import CONTROL, K1_ARM
from popgrpo.research.study.stats import (
    ALPHA,
    HOLM,
    VERDICT,
    Claim,
    Column,
    Verdict,
    effect,
    judge,
    label_column,
    verdicts_markdown,
    write_verdicts,
)

__all__ = ["METRICS", "render_discovery", "summarise"]

POWER_FAMILY = 60
"""The confirmatory primary family the tuning report sizes its power calculation for (5 cells ×
2 landscapes × 3 mechanisms × 2 primary metrics; docs/DISCOVERY_PREREGISTRATION.md)."""

TRIALS_FILE, CURVES_FILE = "discovery_trials.parquet", "discovery_curves.parquet"

# Every metric the study can judge: which direction is better, and what it means.
METRICS = {
    "best_quality": (True, "best noise-free quality Q reached (max over executed ideas)"),
    "peaks": (True, "distinct reachable peaks reached at the pre-registered fraction of their height"),
    "best_expected": (True, "best noise-free expected reward Q·p_exec reached"),
    "peak_fraction_mean": (True, "mean over reachable peaks of the best Q / height reached"),
    "discovery_time": (False, "mean over reachable peaks of samples-to-first-discovery / samples (1: never)"),
}


def _load_plan(out: Path) -> dict:
    return json.loads((out / "plan.json").read_text())


def summarise(out: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trials table and the curves of the study in ``out``: read from its Parquet files when
    they are there, else computed from ``OUT/runs`` and written."""
    out = Path(out)
    trials_path, curves_path = out / TRIALS_FILE, out / CURVES_FILE
    if trials_path.exists() and curves_path.exists():
        return pd.read_parquet(trials_path), pd.read_parquet(curves_path)
    from popgrpo.config import load_config, preset_path
    from popgrpo.envs import make_env
    from popgrpo.research.study.discovery import reachable, trial_summary
    from popgrpo.research.study.plan import landscape_overrides

    plan = _load_plan(out)
    reach: dict[tuple[str, int], tuple[frozenset[int], frozenset[int]]] = {}
    rows, curves = [], []
    for trial in plan["trials"]:
        cell = (trial["landscape"], trial["instance"])
        if cell not in reach:
            overrides = [*landscape_overrides(trial["landscape"]), f"env.peak_seed={trial['instance']}"]
            env = make_env(load_config(preset_path(trial["preset"]), overrides).env)
            reach[cell] = (reachable(env, env.peak_centres), frozenset(getattr(env, "far_peaks", ())))
        metrics = pd.read_parquet(out / "runs" / trial["key"] / "metrics.parquet")
        summary, curve = trial_summary(metrics, *reach[cell])
        labels = {k: trial[k] for k in ("key", "landscape", "instance", "intensity", "arm", "seed")}
        rows.append({**labels, **summary, "reachable": len(reach[cell][0])})
        curves.append(curve.assign(key=trial["key"]))
    trials, curve_frame = pd.DataFrame(rows), pd.concat(curves, ignore_index=True)
    trials.to_parquet(trials_path, index=False, compression="zstd")
    curve_frame.to_parquet(curves_path, index=False, compression="zstd")
    return trials, curve_frame


def compute_check(trials: pd.DataFrame) -> str:
    """One sentence on compute matching: the ideas sampled per run in each cell, equal across arms
    (a ValueError when they are not: the comparison would not be compute-matched)."""
    matched = trials[trials["arm"].isin(_matched_arms(trials))]
    spread = matched.groupby(["landscape", "intensity"])["samples"].agg(["min", "max"])
    unequal = spread[spread["min"] != spread["max"]]
    if not unequal.empty:
        raise ValueError(f"arms sampled different numbers of ideas in {list(unequal.index)}: not compute-matched")
    parts = [f"{int(row['min']):,} at {i} update(s)/epoch" for (_, i), row in spread.iterrows()]
    per_intensity = list(dict.fromkeys(parts))
    return (
        "Compute: every compute-matched arm sampled and executed exactly the same number of ideas per run in each "
        f"cell ({'; '.join(per_intensity)}), with the same gradient steps (K = 5 members × epochs × updates/epoch); "
        "no mechanism spends samples on selection. The soup arms also evaluate their merged model every round "
        "(eval.merged: held-out ideas executed in the driver, not counted here and used by neither training nor "
        "these metrics)."
    )


def _matched_arms(trials: pd.DataFrame) -> list[str]:
    """The arms with the compute of the control (every arm but the population of one)."""
    return [a for a in trials["arm"].unique() if a != K1_ARM]


def _paired(trials: pd.DataFrame, arm: str, metric: str, landscape: str, intensity: int | None) -> pd.DataFrame:
    """Per unit (instance, seed): the arm's and the control's value (intensity None: means over intensities)."""
    part = trials[(trials["landscape"] == landscape) & trials["arm"].isin([arm, CONTROL])]
    if intensity is not None:
        part = part[part["intensity"] == intensity]
    wide = part.pivot_table(index=["instance", "seed"], columns="arm", values=metric, aggfunc="mean")
    return wide.dropna()


def claims(trials: pd.DataFrame, design: dict, tier: str) -> list[Claim]:
    """The claims of one Holm family (``tier``: ``primary`` or ``secondary``), labelled with their
    landscape, intensity (or ``pooled``), mechanism, metric, tier and both arms' means."""
    metrics = [m for m, spec in design["metrics"].items() if spec.get("tier", "primary") == tier]
    out: list[Claim] = []
    for landscape in design["landscapes"]:
        for arm in [a for a in design["arms"] if a != CONTROL]:
            for metric in metrics:
                spec = design["metrics"][metric]
                for intensity in (None, *design["intensities"]):
                    wide = _paired(trials, arm, metric, landscape, intensity)
                    if wide.empty:
                        continue
                    where = "pooled" if intensity is None else f"{intensity}/epoch"
                    labels = {
                        "landscape": landscape,
                        "intensity": "pooled" if intensity is None else int(intensity),
                        "mechanism": arm,
                        "metric": metric,
                        "tier": tier,
                        "arm_mean": float(wide[arm].mean()),
                        "control_mean": float(wide[CONTROL].mean()),
                    }
                    claim = Claim.paired(
                        f"{landscape}, {where}: {arm} − best-of-K, {metric}",
                        wide[arm].to_numpy(),
                        wide[CONTROL].to_numpy(),
                        margin=float(spec["margin"]),
                        higher_is_better=METRICS[metric][0],
                        groups=tuple(wide.index.get_level_values("instance")),
                        labels=labels,
                    )
                    out.append(claim)
    return out


def judge_design(trials: pd.DataFrame, design: dict) -> list[Verdict]:
    """Every claim of the design, judged in two Holm families (primary, secondary)."""
    return [v for tier in ("primary", "secondary") for v in judge(claims(trials, design, tier))]


def decisions(verdicts: list[Verdict], design: dict) -> list[dict]:
    """The pre-registered decision per mechanism: on a landscape it beats best-of-K when at least
    one of its pooled primary claims there is ``better`` and none is ``worse``; it beats best-of-K
    when it does on every landscape of the design."""
    pooled = [v for v in verdicts if v.extra["tier"] == "primary" and v.extra["intensity"] == "pooled"]
    rows = []
    for arm in [a for a in design["arms"] if a != CONTROL]:
        per_landscape = {}
        for landscape in design["landscapes"]:
            outcomes = [v.outcome for v in pooled if v.extra["mechanism"] == arm and v.extra["landscape"] == landscape]
            per_landscape[landscape] = "better" in outcomes and "worse" not in outcomes
        rows.append({"mechanism": arm, **per_landscape, "beats_best_of_k": all(per_landscape.values())})
    return rows


def decisions_markdown(rows: list[dict], landscapes: list[str]) -> str:
    """The decisions as a table: yes/no per landscape and overall."""
    table = [
        [
            row["mechanism"],
            *("yes" if row[x] else "no" for x in landscapes),
            f"**{'yes' if row['beats_best_of_k'] else 'no'}**",
        ]
        for row in rows
    ]
    header = ["mechanism", *(f"beats best-of-K on {x}" for x in landscapes), "beats best-of-K"]
    return md_table(header, table) + "\n"


def random_pooled(random: pd.DataFrame, landscape: str, metric: str) -> float:
    """Random search's mean of ``metric`` on ``landscape``, pooled as the claims are: each unit's
    mean over the intensities, then the mean over units."""
    part = random[random["landscape"] == landscape]
    return float(part.groupby(["instance", "seed"])[metric].mean().mean())


def summary_markdown(verdicts: list[Verdict], design: dict, random: pd.DataFrame | None = None) -> str:
    """What docs/DISCOVERY.md includes: the decisions, then every pooled claim (primary, then
    secondary) with its mean arm and control values, and random search's mean at its tuned width
    where ``random`` (:mod:`popgrpo.research.study.discovery_random`) is given; the per-intensity claims
    are in verdicts.md."""
    columns: list[Column] = [
        label_column("family", "tier"),
        label_column("landscape", "landscape"),
        label_column("mechanism", "mechanism"),
        label_column("metric", "metric"),
        ("mechanism", lambda v: f"{v.extra['arm_mean']:.3f}"),
        ("best-of-K", lambda v: f"{v.extra['control_mean']:.3f}"),
    ]
    if random is not None:
        columns.append(
            ("random search", lambda v: f"{random_pooled(random, v.extra['landscape'], v.extra['metric']):.3f}")
        )
    columns += [("difference [95% CI]", effect()[1]), HOLM, VERDICT]
    pooled = [v for v in verdicts if v.extra["intensity"] == "pooled"]
    sizes = sorted({v.test.n for v in verdicts if v.extra["intensity"] == "pooled"})
    units = " or ".join(str(n) for n in sizes)
    about_random = (
        " Random search: the same number of ideas per unit and cell from an isotropic Gaussian at the width tuned "
        "for that metric on the tuning instance, scored by the runs' rule (executed ideas only); descriptive, "
        "not a pre-registered claim (random_search.md)."
        if random is not None
        else ""
    )
    return (
        decisions_markdown(decisions(verdicts, design), design["landscapes"])
        + f"\nPooled over the intensities (a unit's mean over them), {units} paired units (instance, seed) "
        f"per row; Holm within each family (primary: every primary claim, pooled and per intensity).{about_random}\n\n"
        + verdicts_markdown(pooled, columns)
    )


def arms_markdown(trials: pd.DataFrame, metrics: list[str]) -> str:
    """Mean ± sd over units of each metric, per landscape × intensity × arm."""
    grouped = trials.groupby(["landscape", "intensity", "arm"], sort=True)
    rows = [
        [landscape, intensity, arm, len(part), *(f"{part[m].mean():.3f} ± {part[m].std(ddof=1):.3f}" for m in metrics)]
        for (landscape, intensity, arm), part in grouped
    ]
    return md_table(["landscape", "updates/epoch", "arm", "n", *metrics], rows) + "\n"


def _arm_order(trials: pd.DataFrame) -> list[str]:
    arms = list(dict.fromkeys(trials["arm"]))
    return [CONTROL, *[a for a in arms if a != CONTROL]]


def fig_curves(trials: pd.DataFrame, curves: pd.DataFrame, column: str, label: str, path: Path) -> Path:
    """Mean over units of ``column`` against samples, one panel per landscape × intensity, a line per arm."""
    merged = curves.merge(trials[["key", "landscape", "intensity", "arm"]], on="key")
    landscapes, intensities = sorted(merged["landscape"].unique()), sorted(merged["intensity"].unique())
    fig, axes = plt.subplots(
        len(landscapes), len(intensities), figsize=(3.6 * len(intensities), 3.0 * len(landscapes)), squeeze=False
    )
    for r, landscape in enumerate(landscapes):
        for c, intensity in enumerate(intensities):
            ax = axes[r][c]
            part = merged[(merged["landscape"] == landscape) & (merged["intensity"] == intensity)]
            for arm in _arm_order(trials):
                line = part[part["arm"] == arm].groupby("epoch")[["samples", column]].mean()
                if not line.empty:
                    style = {"color": "black", "linewidth": 2.2} if arm == CONTROL else {"linewidth": 1.2}
                    ax.plot(line["samples"], line[column], label=arm, **style)
            ax.set_title(f"{landscape}, {intensity} update(s)/epoch", fontsize=9)
            ax.set_xlabel("ideas sampled (all members)", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig_effects(verdicts: list[Verdict], path: Path) -> Path:
    """Forest plot: each primary claim's mean paired difference with its CI, coloured by verdict."""
    primary = [v for v in verdicts if v.extra.get("tier") == "primary"]
    metrics = list(dict.fromkeys(v.extra["metric"] for v in primary))
    fig, axes = plt.subplots(1, max(1, len(metrics)), figsize=(6.0 * max(1, len(metrics)), 0.22 * len(primary) + 1.5))
    axes = np.atleast_1d(axes)
    colours = {"better": "tab:green", "worse": "tab:red", "equivalent": "tab:blue", "inconclusive": "grey"}
    for ax, metric in zip(axes, metrics, strict=False):
        rows = [v for v in primary if v.extra["metric"] == metric]
        for y, v in enumerate(rows):
            low, high = v.ci
            ax.plot([low, high], [y, y], color=colours[v.outcome], linewidth=2)
            ax.plot([v.test.mean], [y], "o", color=colours[v.outcome], markersize=4)
        ax.axvline(0, color="black", linewidth=0.8)
        if rows:
            ax.axvspan(-rows[0].claim.margin, rows[0].claim.margin, color="tab:blue", alpha=0.08)
        labels = [f"{v.extra['landscape']}, {v.extra['intensity']}: {v.extra['mechanism']}" for v in rows]
        ax.set_yticks(range(len(rows)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_title(f"{metric}: mechanism − best-of-K (95% CI; band: ±margin)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def power_table(trials: pd.DataFrame, metrics: list[str], alpha_family: int, power: float = 0.8) -> pd.DataFrame:
    """Tuning: per landscape × arm × metric, the paired effect ``d_z`` against the control (units
    averaged over intensities) and the paired units needed for ``power`` at level
    ``ALPHA / alpha_family`` (two-sided paired t-test; NaN where |d_z| ≤ 0.05)."""
    from statsmodels.stats.power import TTestPower

    analysis = TTestPower()
    rows = []
    for landscape in sorted(trials["landscape"].unique()):
        for arm in [a for a in _arm_order(trials) if a != CONTROL]:
            for metric in metrics:
                wide = _paired(trials, arm, metric, landscape, None)
                if wide.empty:
                    continue
                d = (wide[arm] - wide[CONTROL]).to_numpy()
                sd = d.std(ddof=1) if len(d) > 1 else math.nan
                dz = d.mean() / sd if sd and sd > 0 else math.nan
                needed = math.nan
                if np.isfinite(dz) and abs(dz) > 0.05:
                    needed = float(
                        analysis.solve_power(
                            effect_size=abs(dz), alpha=ALPHA / alpha_family, power=power, alternative="two-sided"
                        )
                    )
                rows.append(
                    {
                        "landscape": landscape,
                        "arm": arm,
                        "metric": metric,
                        "n": len(d),
                        "mean_diff": float(d.mean()),
                        "sd_diff": float(sd),
                        "dz": float(dz),
                        "units_for_power": needed,
                    }
                )
    return pd.DataFrame(rows)


def _markdown_table(frame: pd.DataFrame, digits: int = 3) -> str:
    rows = [[f"{v:.{digits}f}" if isinstance(v, float) else v for v in row] for _, row in frame.iterrows()]
    return md_table(list(frame.columns), rows) + "\n"


def wall_time(out: Path) -> float | None:
    """The study's wall time: the sum over every ``popgrpo reproduce`` invocation that worked on
    it (``OUT/wall.jsonl``); None when none was recorded."""
    path = out / "wall.jsonl"
    if not path.exists():
        return None
    return float(sum(json.loads(line)["seconds"] for line in path.read_text().splitlines() if line.strip()))


RANDOM_METRICS = ("best_quality", "peak_fraction_mean", "peaks", "best_expected", "discovery_time", "coverage")


def load_random(out: Path) -> pd.DataFrame | None:
    """The random-search arm of the study in ``out`` (:mod:`popgrpo.research.study.discovery_random`), or None."""
    from popgrpo.research.study.discovery_random import RANDOM_FILE

    path = out / RANDOM_FILE
    return pd.read_parquet(path) if path.exists() else None


def write_random_markdown(out: Path, trials: pd.DataFrame, random: pd.DataFrame, design: dict) -> list[Path]:
    """``random_search.md``: per cell, the width tuned for each metric and random search's mean ±
    sd beside the control's (and the control's minus random search's, per unit); and
    ``random_search.json``, the same numbers."""
    control = trials[trials["arm"] == CONTROL]
    rows, table = [], []
    cells = random[["landscape", "intensity"]].drop_duplicates().sort_values(["landscape", "intensity"])
    for landscape, intensity in zip(cells["landscape"].astype(str), cells["intensity"].astype(int), strict=True):
        part = random[(random["landscape"] == landscape) & (random["intensity"] == intensity)]
        ctrl = control[(control["landscape"] == landscape) & (control["intensity"] == intensity)]
        for metric in RANDOM_METRICS:
            width = float(part[f"width_{metric}"].iloc[0])
            if metric in ctrl.columns:
                paired = ctrl.set_index(["instance", "seed"])[[metric]].join(
                    part.set_index(["instance", "seed"])[[metric]], rsuffix="_random", how="inner"
                )
                diff = (paired[metric] - paired[f"{metric}_random"]).dropna()
            else:
                diff = pd.Series(dtype=float)
            low = high = math.nan
            if len(diff) > 1 and diff.std(ddof=1) == 0:
                low = high = float(diff.mean())  # every unit's difference the same: no spread to bound
            elif len(diff) > 1:
                from scipy import stats as scipy_stats

                low, high = scipy_stats.t.interval(
                    0.95, len(diff) - 1, loc=diff.mean(), scale=diff.std(ddof=1) / math.sqrt(len(diff))
                )
            record = {
                "landscape": landscape,
                "intensity": intensity,
                "metric": metric,
                "width": width,
                "random_mean": float(part[metric].mean()),
                "random_sd": float(part[metric].std(ddof=1)),
                "control_mean": float(ctrl[metric].mean()) if metric in ctrl.columns else math.nan,
                "difference": float(diff.mean()) if len(diff) else math.nan,
                "ci_low": float(low),
                "ci_high": float(high),
                "n": len(diff),
            }
            rows.append(record)
            control_cell = "not recorded" if math.isnan(record["control_mean"]) else f"{record['control_mean']:.3f}"
            diff_cell = (
                "—"
                if not len(diff)
                else f"{record['difference']:+.3f} [{record['ci_low']:+.3f}, {record['ci_high']:+.3f}]"
            )
            random_cell = f"{record['random_mean']:.3f} ± {record['random_sd']:.3f}"
            table.append([landscape, intensity, metric, f"{width:g}", random_cell, control_cell, diff_cell])
    header = ["landscape", "updates/epoch", "metric", "width", "random search", "best-of-K"]
    header.append("best-of-K − random [95% CI]")
    text = (
        "# Discovery study: random search beside best-of-K\n\n"
        "Random search draws, for every unit (instance, seed) and cell, as many ideas as a run of the cell "
        "sampled, from N(0, w²·I), and counts only the ideas whose execution succeeds (the runs' rule). Its width w "
        "is tuned per landscape, intensity and metric over 0.25 to 8 (steps of √2) on the tuning instance and "
        + (
            "seeds: these very units, so here random search is at its in-sample best width "
            if design["phase"] == "tuning"
            else "seeds, which the confirmatory study never uses "
        )
        + "(discovery_random_widths.parquet). Descriptive: not a "
        "pre-registered claim; the interval is a t-interval over the paired units. `coverage` is the mean over "
        "reachable peaks of max(0, fraction − 0.7); runs summarised before it existed do not have it (not "
        "recorded).\n\n" + md_table(header, table) + "\n"
    )
    (out / "random_search.md").write_text(text)
    (out / "random_search.json").write_text(json.dumps(rows, indent=1) + "\n")
    return [out / "random_search.md", out / "random_search.json"]


def render_discovery(out: str | Path) -> list[Path]:
    """Write the study's tables, figures and (confirmatory) verdicts into ``out``; return the paths."""
    out = Path(out)
    plan = _load_plan(out)
    design = plan["design"]
    trials, curves = summarise(out)
    written = [out / TRIALS_FILE, out / CURVES_FILE]
    check = compute_check(trials)
    summary_metrics = ["best_quality", "peaks", "best_expected", "peak_fraction_mean", "discovery_time"]
    random = load_random(out)
    every_arm = trials if random is None else pd.concat([trials, random[trials.columns.intersection(random.columns)]])
    arms_md = out / "arms.md"
    arms_md.write_text(
        f"# Discovery study ({design['phase']}): every arm\n\n{check}\n\n"
        f"Mean ± sd over (instance, seed) units; peaks at {design['threshold']:g} of a peak's height"
        + ("; random search at each metric's tuned width (random_search.md)" if random is not None else "")
        + ".\n\n"
        + arms_markdown(every_arm, summary_metrics)
    )
    written.append(arms_md)
    written.append(fig_curves(trials, curves, "peaks", "peaks reached", out / "fig_peaks_vs_samples.png"))
    written.append(
        fig_curves(trials, curves, "best_quality", "best noise-free Q", out / "fig_best_quality_vs_samples.png")
    )
    if random is not None:
        written += write_random_markdown(out, trials, random, design)
    if design["phase"] == "tuning":
        metrics = [*summary_metrics, *[c for c in trials.columns if c.startswith("peaks_at_")]]
        power = power_table(trials, metrics, alpha_family=POWER_FAMILY)
        (out / "tuning.json").write_text(json.dumps(power.to_dict("records"), indent=1) + "\n")
        (out / "tuning.md").write_text(
            "# Discovery study, tuning phase: paired effects against best-of-K\n\n"
            f"{check}\n\nPer landscape: units (instance, seed) averaged over intensities; d_z = mean / sd of "
            "the paired differences; `units_for_power`: paired units for power 0.8 (two-sided paired t-test) at "
            f"α = 0.05 / {POWER_FAMILY}, the Bonferroni level of the first Holm step in a family of "
            f"{POWER_FAMILY} claims (5 cells × 2 landscapes × 3 mechanisms × 2 primary metrics).\n\n"
            + _markdown_table(power)
        )
        written += [out / "tuning.json", out / "tuning.md"]
        return written
    verdicts = judge_design(trials, design)
    records = [v.record() for v in verdicts]
    wall = wall_time(out)
    study = {
        "preregistration_sha256": plan.get("preregistration_sha256"),
        "trials": len(trials),
        "wall_seconds": wall,
        "design": design,
        "decisions": decisions(verdicts, design),
    }
    write_verdicts(out / "verdicts.json", {**study, "verdicts": records})
    cost = f"{len(trials)} trials" + (f" in {wall / 60:.0f} min of wall time" if wall else "")
    blocks = [
        f"# Discovery study: verdicts against best-of-K\n\n{check} {cost}.\n",
        "## Decisions (the pre-registered rule)\n\n"
        + decisions_markdown(decisions(verdicts, design), design["landscapes"]),
    ]
    for tier in ("primary", "secondary"):
        part = [v for v in verdicts if v.extra["tier"] == tier]
        if part:
            blocks.append(f"## {tier.capitalize()} metrics (one Holm family)\n\n" + verdicts_markdown(part))
    (out / "verdicts.md").write_text("\n".join(blocks))
    (out / "summary.md").write_text(summary_markdown(verdicts, design, random))
    written += [out / "verdicts.json", out / "verdicts.md", out / "summary.md"]
    written.append(fig_effects(verdicts, out / "fig_effects.png"))
    return written
