"""The second discovery study's tables, figures and verdicts (``popgrpo reproduce --study
discovery2[-tuning]``; design: :mod:`popgrpo.research.study.discovery2`).

From the run directories, once, into Parquet files that are all ``popgrpo report DIR`` needs:

    OUT/discovery_trials.parquet          one row per trial (:func:`popgrpo.research.study.discovery_report.summarise`)
    OUT/discovery_curves.parquet          per trial and epoch: samples, peaks, best values so far
    OUT/discovery2_random_search.parquet  random search: one row per unit (family, instance, seed),
                                          each metric at its width, and the widths
    OUT/discovery2_random_widths.parquet  tuning only: per family × width, each metric's mean over
                                          the tuning units (what the widths are tuned on)

Inference is at the instance level: per arm and instance, the mean over its seeds; a claim is a
paired t-test on the instance means of two arms (:class:`popgrpo.research.study.stats.Claim`,
:func:`~popgrpo.research.study.stats.judge`: Holm within the family, TOST against the metric's
margin before "equivalent", a 95% percentile bootstrap interval over instances). The claims, per
family and metric: every arm but the control against best-of-K (H1), every arm and the control
against random search (H2, H4), and each coupling pair's coupled arm against its uncoupled one
(H3). The primary metrics' claims are one Holm family, the secondary metrics' another.

The tuning report writes, per family, arm, comparator and primary metric, the instance-level
effect size ``d_z``, the shrunken one (``d_z × 0.3``, magnitude capped at 1) and the instances a
confirmation needs for power 0.8 of a two-sided paired t-test at α = 0.05 / the design's
``power_family`` (statsmodels' ``TTestPower``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from typing import cast

import matplotlib.pyplot as plt
import pandas as pd

from popgrpo.markdown import md_table
from popgrpo.research.study.discovery import RANDOM_SEARCH, last_quarter
from popgrpo.research.study.discovery2 import BESIDE, CONTROL, ENTROPY_MATCHED, PRIMARY, SECONDARY, Design2
from popgrpo.research.study.discovery_report import compute_check, fig_curves, summarise, wall_time
from popgrpo.research.study.stats import (
    ALPHA,
    HOLM,
    TOST,
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

__all__ = [
    "SHRINK",
    "claims",
    "instance_means",
    "power_table",
    "render_discovery2",
    "same_as_control",
    "same_as_control_markdown",
    "shrunken",
    "summary_markdown",
]

RANDOM_FILE, WIDTH_FILE = "discovery2_random_search.parquet", "discovery2_random_widths.parquet"
ENTROPY_FILE = "discovery2_entropy.parquet"
SHRINK = 0.3
"""Study 1's confirmed instance-level effects were about 0.3 of its tuning ones (the draft's rule)."""
METRICS = (*PRIMARY, *SECONDARY)
HIGHER: dict[str, bool] = dict.fromkeys(METRICS, True)  # every judged metric: higher is better


# ---- random search ---------------------------------------------------------------------------
def _samples(trials: pd.DataFrame) -> dict[str, int]:
    """Ideas a run of each family sampled (equal across the arms: :func:`compute_check`)."""
    return {str(f): int(n) for f, n in trials.groupby("landscape")["samples"].max().items()}


def random_search(out: Path, design: Design2, trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The random-search arm of the study in ``out`` and (tuning) the width table, read from their
    Parquet files when there, else searched and written. Tuning: each metric's width is the best of
    :data:`~popgrpo.research.study.discovery.WIDTHS` on these tuning units; confirmatory: the
    design's ``random_widths``."""
    from popgrpo.research.study.discovery_random import search_unit, tune_widths, tuned_widths

    random_path, width_path = out / RANDOM_FILE, out / WIDTH_FILE
    if random_path.exists():
        return pd.read_parquet(random_path), pd.read_parquet(width_path) if width_path.exists() else None
    samples = _samples(trials)
    intensity = design.steps_per_epoch
    widths: dict[str, dict[str, float]]
    table = None
    if design.phase == "tuning":
        parts = [
            tune_widths([f], {intensity: n}, design.threshold, design.instances, design.seeds, HIGHER)
            for f, n in samples.items()
        ]
        table = pd.concat(parts, ignore_index=True)
        best = tuned_widths(table, HIGHER)
        widths = {f: {m: best[(f, intensity, m)] for m in METRICS} for f in samples}
    else:
        widths = design.random_widths
    rows = []
    units = trials[["landscape", "instance", "seed"]].drop_duplicates().sort_values(["landscape", "instance", "seed"])
    for family, instance, seed in units.itertuples(index=False):
        chosen = widths[str(family)]
        found = {
            w: search_unit(str(family), int(instance), intensity, int(seed), samples[str(family)], w, design.threshold)
            for w in sorted(set(chosen.values()))
        }
        row = {"landscape": family, "instance": int(instance), "seed": int(seed), "arm": RANDOM_SEARCH}
        row.update({m: float(found[chosen[m]][m]) for m in METRICS})
        row.update({f"width_{m}": chosen[m] for m in METRICS})
        rows.append(row)
    random = pd.DataFrame(rows)
    random.to_parquet(random_path, index=False, compression="zstd")
    if table is not None:
        table.to_parquet(width_path, index=False, compression="zstd")
    return random, table


# ---- instance-level claims -------------------------------------------------------------------
def instance_means(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per family and instance (rows) and arm (columns): the mean of ``metric`` over the seeds."""
    return frame.groupby(["landscape", "instance", "arm"])[metric].mean().unstack("arm")


def _comparisons(design: Design2) -> list[tuple[str, str, str]]:
    """(arm, comparator, hypothesis) of every claim per family and metric."""
    mechanisms = [a for a in design.arms if a != CONTROL]
    return [
        *((a, CONTROL, "H1") for a in mechanisms),
        *((a, RANDOM_SEARCH, "H2") for a in mechanisms),
        (CONTROL, RANDOM_SEARCH, "H4"),
        *((coupled, uncoupled, "H3") for coupled, uncoupled in design.coupling),
    ]


def _instance_pairs(
    every_arm: pd.DataFrame, design: Design2, metrics: list[str]
) -> Iterator[tuple[str, str, str, str, str, pd.DataFrame]]:
    """(metric, family, arm, comparator, hypothesis, instance means of the two arms) of every
    comparison of :func:`_comparisons` that both arms ran, per metric and family."""
    for metric in metrics:
        means = instance_means(every_arm, metric)
        for family in design.families:
            if family not in means.index.get_level_values("landscape"):
                continue
            part = means.loc[family]
            for arm, comparator, hypothesis in _comparisons(design):
                if arm in part.columns and comparator in part.columns:
                    yield (
                        metric,
                        family,
                        arm,
                        comparator,
                        hypothesis,
                        cast(pd.DataFrame, part[[arm, comparator]]).dropna(),
                    )


def claims(every_arm: pd.DataFrame, design: Design2, tier: str) -> list[Claim]:
    """The claims of one Holm family (``tier``), each on the instance means of its two arms."""
    metrics = [m for m, spec in design.metrics.items() if spec["tier"] == tier]
    out: list[Claim] = []
    for metric, family, arm, comparator, hypothesis, pair in _instance_pairs(every_arm, design, metrics):
        labels = {
            "family": family,
            "hypothesis": hypothesis,
            "arm": arm,
            "comparator": comparator,
            "metric": metric,
            "tier": tier,
            "instances": len(pair),
            "arm_mean": float(pair[arm].mean()),
            "comparator_mean": float(pair[comparator].mean()),
        }
        out.append(
            Claim.paired(
                f"{family}: {arm} − {comparator}, {metric}",
                pair[arm].to_numpy(),
                pair[comparator].to_numpy(),
                margin=float(design.metrics[metric]["margin"]),
                higher_is_better=HIGHER[metric],
                labels=labels,
            )
        )
    return out


def judge_design(every_arm: pd.DataFrame, design: Design2) -> list[Verdict]:
    """Every claim of the design, judged in two Holm families (primary, secondary)."""
    return [v for tier in ("primary", "secondary") for v in judge(claims(every_arm, design, tier))]


def shrunken(dz: float) -> float:
    """``dz × SHRINK`` with its magnitude capped at 1 (NaN stays NaN)."""
    if math.isnan(dz):
        return math.nan
    return math.copysign(min(abs(dz) * SHRINK, 1.0), dz)


def power_table(every_arm: pd.DataFrame, design: Design2, power: float = 0.8) -> pd.DataFrame:
    """Tuning: per family × (arm, comparator) × primary metric, the instance-level paired effect
    ``dz``, its shrunken value and the instances for ``power`` at α = 0.05 / ``design.power_family``
    from the shrunken one (NaN where its magnitude is at most 0.05)."""
    from statsmodels.stats.power import TTestPower

    analysis, alpha = TTestPower(), ALPHA / design.power_family
    rows = []
    for metric, family, arm, comparator, hypothesis, pair in _instance_pairs(every_arm, design, list(PRIMARY)):
        d = (pair[arm] - pair[comparator]).to_numpy()
        sd = float(d.std(ddof=1)) if len(d) > 1 else math.nan
        dz = float(d.mean() / sd) if sd > 0 else math.nan
        small = shrunken(dz)
        needed = math.nan
        if not math.isnan(small) and abs(small) > 0.05:
            needed = float(
                analysis.solve_power(effect_size=abs(small), alpha=alpha, power=power, alternative="two-sided")
            )
        rows.append(
            {
                "family": family,
                "hypothesis": hypothesis,
                "arm": arm,
                "comparator": comparator,
                "metric": metric,
                "instances": len(d),
                "mean_diff": float(d.mean()) if len(d) else math.nan,
                "dz": dz,
                "dz_shrunk": small,
                "instances_for_power": needed,
            }
        )
    return pd.DataFrame(rows)


# ---- pages -----------------------------------------------------------------------------------
def _format(frame: pd.DataFrame, digits: int = 3) -> str:
    rows = [[f"{v:.{digits}f}" if isinstance(v, float) else v for v in row] for _, row in frame.iterrows()]
    return md_table(list(frame.columns), rows) + "\n"


def _per_arm(every_arm: pd.DataFrame, design: Design2, columns: list[str]) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(family, arm, its instance means of ``columns``) for every family and arm (random search
    last) that the table has, in the design's order."""
    per_instance = every_arm.groupby(["landscape", "arm", "instance"])[columns].mean()
    present = per_instance.index.droplevel("instance")
    for family in design.families:
        for arm in [*design.arms, RANDOM_SEARCH]:
            if (family, arm) in present:
                yield family, arm, cast(pd.DataFrame, per_instance.loc[(family, arm)])


def arms_markdown(every_arm: pd.DataFrame, design: Design2) -> str:
    """Per family × arm: mean ± sd over instance means of every judged metric, then the policy's
    spread, entropy and diversity where the trials have them (reported beside, not judged)."""
    beside = [c for c in BESIDE if c in every_arm.columns]
    columns = [*METRICS, *beside]
    rows = []
    for family, arm, part in _per_arm(every_arm, design, columns):
        cells = ["–" if part[c].isna().all() else f"{part[c].mean():.3f} ± {part[c].std(ddof=1):.3f}" for c in columns]
        rows.append([family, arm, len(part), *cells])
    return md_table(["family", "arm", "instances", *columns], rows) + "\n"


def entropy_control(out: Path, plan: dict) -> pd.DataFrame | None:
    """Per trial: the policy entropy (nats per idea dimension) and the entropy coefficient α of
    its members, from ``OUT/discovery2_entropy.parquet`` when it is there, else from the run
    directories (and written); None when neither is there.

    Columns: ``key``, ``arm``, ``landscape``, ``instance``; ``entropy_last_quarter`` (mean over
    members and the last quarter of epochs), ``entropy_lowest`` (each member's lowest epoch,
    averaged over members), ``alpha_positive`` (the share of member-epochs with α > 0),
    ``alpha_max`` and ``alpha_last_quarter``."""
    path = out / ENTROPY_FILE
    if path.exists():
        return pd.read_parquet(path)
    if not plan["trials"]:
        return None
    rows = []
    for trial in plan["trials"]:
        run = out / "runs" / trial["key"] / "metrics.parquet"
        if not run.exists():
            return None
        metrics = pd.read_parquet(run, columns=["epoch", "member", "entropy", "alpha"])
        last = last_quarter(metrics)
        rows.append(
            {
                **{k: trial[k] for k in ("key", "arm", "landscape", "instance")},
                "entropy_last_quarter": float(last["entropy"].mean()),
                "entropy_lowest": float(metrics.groupby("member")["entropy"].min().mean()),
                "alpha_positive": float((metrics["alpha"] > 0).mean()),
                "alpha_max": float(metrics["alpha"].max()),
                "alpha_last_quarter": float(last["alpha"].mean()),
            }
        )
    frame = pd.DataFrame(rows)
    frame.to_parquet(path, index=False, compression="zstd")
    return frame


def entropy_markdown(frame: pd.DataFrame, design: Design2) -> str:
    """Per family × arm: the means over instances of :func:`entropy_control`'s columns, and the
    entropy-matched arm's target."""
    columns = ["entropy_last_quarter", "entropy_lowest", "alpha_positive", "alpha_max", "alpha_last_quarter"]
    means = frame.groupby(["landscape", "arm"])[columns].mean()
    rows = []
    for family in design.families:
        for arm in design.arms:
            if (family, arm) in means.index:
                target = (design.entropy_target or {}).get(family) if arm == ENTROPY_MATCHED else None
                rows.append(
                    [
                        family,
                        arm,
                        "–" if target is None else f"{target:g}",
                        *(f"{v:.3f}" for v in cast(pd.Series, means.loc[(family, arm)]).to_numpy(dtype=float)),
                    ]
                )
    return md_table(["family", "arm", "target", *columns], rows) + "\n"


def same_as_control(trials: pd.DataFrame, arm: str = ENTROPY_MATCHED) -> pd.DataFrame:
    """Per family (the trials' order): the units (instance, seed) that both ``arm`` and the control
    ran, and on how many of them ``arm``'s value equals the control's bit for bit (``==`` on the
    stored floats) for each primary metric, for every primary metric at once, and for the policy
    entropy (``entropy``, the last quarter's). Empty when the trials have no ``arm``.

    On such a unit the paired difference of the metric is exactly 0. The entropy column says
    whether the two runs themselves differed."""
    units = ["landscape", "instance", "seed"]
    columns = [*PRIMARY, *(c for c in ("entropy",) if c in trials.columns)]
    mine = trials[trials["arm"] == arm].set_index(units)[columns]
    control = trials[trials["arm"] == CONTROL].set_index(units)[columns]
    both = mine.index.intersection(control.index)
    rows = []
    for family in dict.fromkeys(both.get_level_values("landscape")):
        part = both[both.get_level_values("landscape") == family]
        equal = mine.loc[part] == control.loc[part]
        rows.append(
            {
                "family": family,
                "units": len(part),
                **{metric: int(equal[metric].sum()) for metric in PRIMARY},
                "every primary metric": int(equal[list(PRIMARY)].all(axis=1).sum()),
                **({"entropy": int(equal["entropy"].sum())} if "entropy" in columns else {}),
            }
        )
    return pd.DataFrame(rows)


def same_as_control_markdown(table: pd.DataFrame, arm: str = ENTROPY_MATCHED) -> str:
    """:func:`same_as_control`'s table, with a sentence that says what its counts are."""
    return (
        f"Per family: the units (instance, seed) {arm} and {CONTROL} both ran, and on how many of them "
        f"{arm}'s value equals {CONTROL}'s bit for bit, per primary metric, for every primary metric at once, "
        "and for the last-quarter policy entropy (the runs differ where it does). On those units the paired "
        "difference of the metric is exactly 0.\n\n" + md_table(list(table.columns), table.to_numpy().tolist()) + "\n"
    )


def _primary_outcomes(verdicts: list[Verdict], family: str, arm: str, comparator: str) -> list[str]:
    """The outcomes of ``arm``'s primary claims against ``comparator`` on ``family``."""
    return [
        v.outcome
        for v in verdicts
        if v.extra["tier"] == "primary"
        and (v.extra["family"], v.extra["arm"], v.extra["comparator"]) == (family, arm, comparator)
    ]


def _beats(verdicts: list[Verdict], family: str, arm: str, comparator: str) -> bool:
    """The pre-registered licence: one primary claim of ``arm`` against ``comparator`` on
    ``family`` is better and none is worse."""
    outcomes = _primary_outcomes(verdicts, family, arm, comparator)
    return "better" in outcomes and "worse" not in outcomes


def _coupling(verdicts: list[Verdict], family: str, pair: tuple[str, str]) -> str:
    """What the H3 claims of ``pair`` on ``family`` license: matters on a better or worse,
    does not matter beyond the margins when every one is equivalent, else not determined."""
    outcomes = _primary_outcomes(verdicts, family, *pair)
    if not outcomes:
        return "not measured"
    if {"better", "worse"} & set(outcomes):
        return "matters"
    if set(outcomes) == {"equivalent"}:
        return "does not matter beyond the margins"
    return "not determined"


def summary_markdown(verdicts: list[Verdict], design: Design2, every_arm: pd.DataFrame) -> str:
    """The pre-registered decision rule applied to the verdicts, and per family the primary
    metrics of every arm (random search included) beside the policy's entropy, spread and
    diversity, with each arm's H1 and H2 verdicts."""
    mechanisms = [a for a in design.arms if a != CONTROL]
    yes = {True: "yes", False: "no"}
    rows = []
    for arm in mechanisms:
        for family in design.families:
            h1, h2 = _beats(verdicts, family, arm, CONTROL), _beats(verdicts, family, arm, RANDOM_SEARCH)
            rows.append([arm, family, yes[h1], yes[h2], f"**{yes[h1 and h2]}**"])
    decision = md_table(["arm", "family", "beats best-of-K", "beats random search", "recommended"], rows)
    coupling = md_table(
        ["coupled arm", "uncoupled arm", *design.families],
        [[*pair, *(_coupling(verdicts, f, pair) for f in design.families)] for pair in design.coupling],
    )
    word = {
        (v.extra["family"], v.extra["arm"], v.extra["comparator"], v.extra["metric"]): v.word
        for v in verdicts
        if v.extra["tier"] == "primary"
    }
    beside = [c for c in BESIDE if c in every_arm.columns]
    columns = [*PRIMARY, *beside]
    rows_of: dict[str, list[list[str]]] = {family: [] for family in design.families}
    for family, arm, part in _per_arm(every_arm, design, columns):
        cells = ["–" if part[c].isna().all() else f"{part[c].mean():.3f}" for c in columns]
        judged = [
            word.get((family, arm, comparator, metric), "–")
            for comparator in (CONTROL, RANDOM_SEARCH)
            for metric in PRIMARY
        ]
        rows_of[family].append([arm, *cells, *judged])
    header = ["arm", *columns, *(f"{m} vs {who}" for who in ("best-of-K", "random search") for m in PRIMARY)]
    blocks = [f"**{family}** (means over instances)\n\n" + md_table(header, rows) for family, rows in rows_of.items()]
    return (
        "A mechanism beats a comparator on a family when one of its primary claims there is better "
        "and none is worse; it is recommended for the family when it beats both best-of-K GRPO and "
        "random search (the pre-registered rule).\n\n"
        + decision
        + "\n\nThe population coupling (H3, the coupled arm against the same mechanism uncoupled): it "
        "matters on a better or worse primary claim, does not matter beyond the margins when every "
        "primary claim is equivalent, and is not determined otherwise.\n\n"
        + coupling
        + "\n\n"
        + "\n\n".join(blocks)
        + "\n"
    )


def fig_effects(verdicts: list[Verdict], path: Path) -> Path:
    """Forest plot of the primary claims: mean instance-level difference, 95% CI, coloured by verdict."""
    primary = [v for v in verdicts if v.extra["tier"] == "primary"]
    metrics = list(dict.fromkeys(v.extra["metric"] for v in primary)) or ["none"]
    height = 0.22 * max(1, len(primary) // len(metrics)) + 1.5
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.5 * len(metrics), height), squeeze=False)
    colours = {"better": "tab:green", "worse": "tab:red", "equivalent": "tab:blue", "inconclusive": "grey"}
    for ax, metric in zip(axes[0], metrics, strict=True):
        rows = [v for v in primary if v.extra["metric"] == metric]
        for y, v in enumerate(rows):
            colour = colours.get(v.outcome, "black")
            ax.plot(list(v.ci), [y, y], color=colour, linewidth=2)
            ax.plot([v.test.mean], [y], "o", color=colour, markersize=4)
        ax.axvline(0, color="black", linewidth=0.8)
        if rows:
            ax.axvspan(-rows[0].claim.margin, rows[0].claim.margin, color="tab:blue", alpha=0.08)
        ax.set_yticks(
            range(len(rows)),
            [f"{v.extra['family']}: {v.extra['arm']} − {v.extra['comparator']}" for v in rows],
            fontsize=6,
        )
        ax.invert_yaxis()
        ax.set_title(f"{metric}: instance-level difference (95% CI; band: ±margin)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig_widths(table: pd.DataFrame, path: Path) -> Path:
    """Tuning: random search's mean of each primary metric against its width, a line per family."""
    fig, axes = plt.subplots(1, len(PRIMARY), figsize=(5.0 * len(PRIMARY), 3.2), squeeze=False)
    for ax, metric in zip(axes[0], PRIMARY, strict=True):
        for family, part in table.groupby("landscape"):
            ax.plot(part["width"], part[metric], marker="o", label=str(family))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("random search width")
        ax.set_title(f"{metric} (tuning units)", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _widths_markdown(random: pd.DataFrame) -> str:
    rows = [
        [family, *(f"{part[f'width_{m}'].iloc[0]:g}" for m in METRICS)] for family, part in random.groupby("landscape")
    ]
    return md_table(["family", *(f"width for {m}" for m in METRICS)], rows) + "\n"


def render_discovery2(out: str | Path) -> list[Path]:
    """Write the study's tables, figures and (confirmatory) verdicts into ``out``; return the paths."""
    out = Path(out)
    plan = json.loads((out / "plan.json").read_text())
    quick = bool(plan.get("quick", False))
    design = Design2.from_json(plan["design"], quick=quick)
    smoke = "**A `--quick` run: every code path on two units, not a result.**\n\n" if quick else ""
    trials, curves = summarise(out)
    compute_check(trials)  # a ValueError when the arms of a family sampled different numbers of ideas
    per_family = ", ".join(f"{n:,} on {f}" for f, n in _samples(trials).items())
    check = (
        f"Compute: every arm sampled and executed the same ideas per run in each family ({per_family}), with the "
        "same gradient steps (K = 5 members × epochs × updates/epoch); random search draws as many per unit."
    )
    random, widths = random_search(out, design, trials)
    every_arm = pd.concat([trials, random[random.columns.intersection(trials.columns)]], ignore_index=True)
    written = [out / "discovery_trials.parquet", out / "discovery_curves.parquet", out / RANDOM_FILE]
    entropy = entropy_control(out, plan)
    same = same_as_control(trials)
    sections = []
    if entropy is not None:
        sections.append(
            "Per family and arm, means over instances of each trial's: policy entropy (nats per idea dimension) "
            "over its members and the last quarter of epochs; each member's lowest entropy over the run, averaged "
            "over members; the share of member-epochs with α > 0; the largest α; α over the last quarter. "
            "α is the entropy coefficient (maxent.entropy, α ≥ 0), 0 in every arm without it.\n\n"
            + entropy_markdown(entropy, design)
        )
        written.append(out / ENTROPY_FILE)
    if not same.empty:
        sections.append(f"## {ENTROPY_MATCHED} against {CONTROL}, unit by unit\n\n" + same_as_control_markdown(same))
    if sections:
        (out / "entropy.md").write_text(
            f"# Second discovery study ({design.phase}): policy entropy and the entropy coefficient\n\n{smoke}"
            + "\n".join(sections)
        )
        written.append(out / "entropy.md")
    where = (
        f"code {plan.get('commit', 'unknown')}, plan started {plan.get('started', 'unknown')}; "
        f"{len(trials)} trials; random search: as many ideas per unit as a run, at each metric's width "
        + ("tuned on these tuning units (in-sample)" if design.phase == "tuning" else "pre-registered from tuning")
    )
    (out / "arms.md").write_text(
        f"# Second discovery study ({design.phase}): every arm\n\n{smoke}{check}\n\n{where}.\n\n"
        "Mean ± sd over instances of each instance's mean over seeds; coverage metrics at "
        f"{design.threshold:g} of a peak's height.\n\n"
        + arms_markdown(every_arm, design)
        + "\n## Random search's widths\n\n"
        + _widths_markdown(random)
    )
    written.append(out / "arms.md")
    written.append(fig_curves(trials, curves, "peaks", "peaks reached", out / "fig_peaks_vs_samples.png"))
    written.append(
        fig_curves(trials, curves, "best_quality", "best noise-free Q", out / "fig_best_quality_vs_samples.png")
    )
    if widths is not None:
        written += [out / WIDTH_FILE, fig_widths(widths, out / "fig_random_widths.png")]
    if design.phase == "tuning":
        power = power_table(every_arm, design)
        (out / "tuning.json").write_text(json.dumps(power.to_dict("records"), indent=1) + "\n")
        (out / "tuning.md").write_text(
            "# Second discovery study, tuning phase: instance-level effects and the confirmation's size\n\n"
            f"{check}\n\n{where}.\n\nPer family, arm and comparator: the instance means' paired differences "
            f"(mean over seeds per instance); `dz` = mean / sd of the differences; `dz_shrunk` = dz × {SHRINK:g}, "
            "magnitude capped at 1; `instances_for_power`: instances for power 0.8 of a two-sided paired t-test "
            f"at α = 0.05 / {design.power_family} (statsmodels TTestPower on |dz_shrunk|; NaN where it is at "
            "most 0.05).\n\n" + _format(power)
        )
        return [*written, out / "tuning.json", out / "tuning.md"]
    verdicts = judge_design(every_arm, design)
    wall = wall_time(out)
    study = {
        "preregistration_sha256": plan.get("preregistration_sha256"),
        "commit": plan.get("commit"),
        "started": plan.get("started"),
        "trials": len(trials),
        "wall_seconds": wall,
        "design": design.to_json(),
    }
    write_verdicts(out / "verdicts.json", {**study, "verdicts": [v.record() for v in verdicts]})
    columns: list[Column] = [
        label_column("hypothesis", "hypothesis"),
        label_column("arm", "arm"),
        label_column("against", "comparator"),
        label_column("metric", "metric"),
        label_column("instances", "instances"),
        ("arm mean", lambda v: f"{v.extra['arm_mean']:.3f}"),
        ("against mean", lambda v: f"{v.extra['comparator_mean']:.3f}"),
        effect(),
        HOLM,
        TOST,
        VERDICT,
    ]
    blocks = [
        f"# Second discovery study: verdicts\n\n{smoke}{check}\n\n{where}; pre-registration SHA-256 {study['preregistration_sha256']}.\n"
    ]
    for tier in ("primary", "secondary"):
        for family in design.families:
            part = [v for v in verdicts if v.extra["tier"] == tier and v.extra["family"] == family]
            if part:
                blocks.append(f"## {family}, {tier} metrics (one Holm family per tier, over every family)\n\n")
                blocks.append(verdicts_markdown(part, columns))
    (out / "verdicts.md").write_text("\n".join(blocks))
    (out / "summary.md").write_text(smoke + summary_markdown(verdicts, design, every_arm))
    written += [
        out / "verdicts.json",
        out / "verdicts.md",
        out / "summary.md",
        fig_effects(verdicts, out / "fig_effects.png"),
    ]
    return written
