"""Tables, claims and figures of ``popgrpo reproduce --study lm`` (:mod:`popgrpo.research.study.lm`).

Every number is read from ``OUT/metrics.parquet`` (each trial's per-epoch rows, members
averaged per epoch). A method's number for one seed is the mean of its last ``window``
epochs; tables give mean ± sd over seeds. Claims compare two methods **seed by seed** (the
same seed draws the same first prompts and the same initial programs) and are judged together
by :func:`popgrpo.research.study.stats.judge`: two-sided paired t-tests with Holm's correction across
every claim of the report, TOST against the metric's margin (:data:`MARGINS`) before any
"equivalent", bootstrap intervals. With three seeds and 25 claims only large, consistent
differences survive.

Pop-GRPO is also compared with its compute-matched control, the best of K independent GRPO
runs (:data:`popgrpo.research.study.lm.BEST_OF_K`: the same population with the scheduler off). Both
arms are scored by their **best member** per seed, the member with the highest mean reward
over the last ``window`` epochs, and judged as a family of their own (:func:`best_of_k_claims`).

Files written into ``OUT``: ``lm.md`` (tables, claims, cost), ``lm_table.csv`` (one row per
method and seed), ``lm_claims.json``, ``lm_best_members.csv`` (one row per population arm and
seed: its best member), ``lm_best_of_k_claims.json`` and the figures :data:`FIGURES`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from popgrpo.markdown import md_table
from popgrpo.research.study.lm import BEST_OF_K, CONTROL, LM_METHODS, POPULATIONS
from popgrpo.research.study.plan import Trial
from popgrpo.research.study.stats import Claim, format_mean_sd, judge, write_verdicts
from popgrpo.telemetry.plots import save_figure
from popgrpo.telemetry.summary import population_by_epoch

__all__ = [
    "BEST_OF_K_CLAIMS",
    "FIGURES",
    "METRICS",
    "best_member_table",
    "best_of_k_claims",
    "compute_per_member",
    "lm_claims",
    "lm_table",
    "render_lm",
]

# metrics column -> label
METRICS = {
    "reward_mean": "mean reward",
    "reward_max": "max reward",
    "diversity": "embedding diversity",
    "distinct": "distinct programs",
    "complexity": "length (tokens)",
    "success": "execution success",
    "pass_at_k": "pass@k",
    "entropy": "token entropy",
    "kl": "KL to the start",
}
FIGURES = ("fig1_lm_training.png", "fig2_lm_reward_diversity.png", "fig3_lm_length_early_late.png")
COLORS = {
    CONTROL: "tab:gray",
    "GRPO": "tab:red",
    "QD-GRPO": "tab:green",
    "MaxEnt-GRPO": "tab:blue",
    "Pop-GRPO": "tab:orange",
    BEST_OF_K: "tab:brown",
    "Combined (§7)": "tab:purple",
}
REMEDIES = ("QD-GRPO", "MaxEnt-GRPO", "Pop-GRPO", "Combined (§7)")
# Equivalence margins of the claims, in each metric's units. Set when the report moved to the
# shared statistics, after the study's results were known: no "equivalent" here is pre-registered.
MARGINS = {"reward_mean": 0.02, "reward_max": 0.02, "diversity": 0.01, "distinct": 0.05, "complexity": 2.0}
# Pop-GRPO against the best of K GRPO runs, best member against best member: metric -> what is
# claimed ("Pop-GRPO's best member ... than the best-of-K's"). Fixed before the arm ran, with the
# margins above (themselves set after the other arms' results were known).
BEST_OF_K_CLAIMS = {
    "reward_mean": "reaches a higher mean reward",
    "reward_max": "reaches a higher max reward",
    "diversity": "keeps more embedding diversity",
    "distinct": "keeps more distinct programs",
    "complexity": "keeps longer programs",
}


# ---- numbers --------------------------------------------------------------------------------
def epochs_by_trial(plan: dict, metrics: pd.DataFrame) -> pd.DataFrame:
    """Per trial and epoch, members averaged, with the trial's method label and seed."""
    label = {t["key"]: t["memberships"][0]["label"] for t in plan["trials"]}
    frames = []
    for (trial, seed), frame in metrics.groupby(["trial", "seed"], sort=False):
        by_epoch = population_by_epoch(frame.drop(columns=["trial", "seed"]).select_dtypes("number")).reset_index()
        by_epoch.insert(0, "method", label[trial])
        by_epoch.insert(1, "seed", seed)
        frames.append(by_epoch)
    return pd.concat(frames, ignore_index=True)


def lm_table(epochs: pd.DataFrame, window: int) -> pd.DataFrame:
    """One row per method and seed: the last ``window`` epochs' mean of every metric, and the
    first ``window`` epochs' (``<metric>_first``)."""
    rows = []
    for (method, seed), frame in epochs.groupby(["method", "seed"], sort=False):
        frame = frame.sort_values("epoch")
        # cast: pandas-stubs types group keys as Hashable; these seeds are ints
        row = {"method": method, "seed": int(cast(int, seed)), "epochs": int(frame["epoch"].max()) + 1}
        for col in METRICS:
            row[col] = float(frame[col].tail(window).mean())
            row[f"{col}_first"] = float(frame[col].head(window).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def best_member_table(plan: dict, metrics: pd.DataFrame, window: int) -> pd.DataFrame:
    """One row per population arm (:data:`~popgrpo.research.study.lm.POPULATIONS`) and seed: its best
    member, the one with the highest mean reward over the last ``window`` epochs, with that
    member's last-``window`` mean of every metric (``members``: how many it was chosen from)."""
    label = {t["key"]: t["memberships"][0]["label"] for t in plan["trials"]}
    rows = []
    for (trial, seed), frame in metrics.groupby(["trial", "seed"], sort=False):
        if label[trial] not in POPULATIONS:
            continue
        last = frame[frame["epoch"] > frame["epoch"].max() - window]
        by_member = last.groupby("member")[list(METRICS)].mean()
        best = by_member["reward_mean"].idxmax()
        row = {"method": label[trial], "seed": int(cast(int, seed)), "member": int(cast(int, best))}
        row.update({col: float(by_member.loc[best, col]) for col in METRICS})
        row["members"] = len(by_member)
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", "seed", "member", *METRICS, "members"])


def compute_per_member(trial: dict) -> dict:
    """What one member of ``trial`` (a plan.json entry) trains on: members, epochs, programs
    sampled and gradient updates per member, from the trial's resolved config."""
    config = Trial(trial["preset"], tuple(trial["overrides"]), trial["seed"]).config()
    steps = config.grpo.steps_per_epoch * config.run.epochs
    per_step = config.policy.causal_lm.prompts_per_step * config.grpo.group_size
    return {
        "members": config.population.size,
        "epochs": config.run.epochs,
        "programs": steps * per_step,
        "updates": steps * config.grpo.updates_per_batch,
    }


def best_of_k_claims(best: pd.DataFrame) -> list[dict]:
    """Pop-GRPO's best member against the best-of-K arm's, paired by seed, on each metric of
    :data:`BEST_OF_K_CLAIMS`: one family of its own (Holm across these claims only)."""
    c = [
        _claim(best, f"Pop-GRPO's best member {what} than the best of K GRPO runs'", "Pop-GRPO", BEST_OF_K, col, 1)
        for col, what in BEST_OF_K_CLAIMS.items()
    ]
    return _judged(c)


def _paired(table: pd.DataFrame, a: str, b: str, col: str) -> pd.Series:
    """``a − b`` per seed, on the seeds both have."""
    left = table[table.method == a].set_index("seed")[col]
    right = table[table.method == b].set_index("seed")[col]
    seeds = sorted(set(left.index) & set(right.index))
    return (left[seeds] - right[seeds]).dropna()


def _claim(table: pd.DataFrame, text: str, a: str, b: str, col: str, direction: int) -> Claim:
    """The claim "``a`` is ``direction`` (+1 above, −1 below) ``b`` on ``col``", labelled with both
    methods, the metric, the direction and the per-seed differences' mean, sd and wins."""
    diff = _paired(table, a, b, col)
    labels = {
        "a": a,
        "b": b,
        "metric": col,
        "direction": direction,
        "diff_mean": float(diff.mean()) if len(diff) else math.nan,
        "diff_sd": float(diff.std(ddof=1)) if len(diff) > 1 else math.nan,
        "wins": int(((diff * direction) > 0).sum()),
    }
    diffs = tuple(float(d) for d in diff)
    return Claim(text, diffs, margin=MARGINS[col], higher_is_better=direction > 0, labels=labels)


def lm_claims(table: pd.DataFrame) -> list[dict]:
    """The paper's collapse (GRPO vs the control) and its remedies (each method vs GRPO), judged
    as one family; each claim's record (:meth:`~popgrpo.research.study.stats.Verdict.record`) with its labels."""
    c = [_claim(table, "GRPO raises mean reward over the no-update control", "GRPO", CONTROL, "reward_mean", 1)]
    for col, word in (("diversity", "embedding diversity"), ("distinct", "distinct programs")):
        c.append(_claim(table, f"GRPO collapses: {word} below the control", "GRPO", CONTROL, col, -1))
    c.append(_claim(table, "GRPO collapses: programs shorter than the control's", "GRPO", CONTROL, "complexity", -1))
    # The paper's collapse leaves max reward flat: it holds when the difference is equivalent to 0.
    c.append(_claim(table, "GRPO leaves max reward flat (no rise over the control)", "GRPO", CONTROL, "reward_max", 1))
    for method in REMEDIES:
        c.append(_claim(table, f"{method} keeps more embedding diversity than GRPO", method, "GRPO", "diversity", 1))
        c.append(_claim(table, f"{method} keeps more distinct programs than GRPO", method, "GRPO", "distinct", 1))
        c.append(_claim(table, f"{method} keeps longer programs than GRPO", method, "GRPO", "complexity", 1))
        c.append(_claim(table, f"{method} reaches a higher max reward than GRPO", method, "GRPO", "reward_max", 1))
        c.append(_claim(table, f"{method} keeps mean reward above GRPO's", method, "GRPO", "reward_mean", 1))
    records = _judged(c)
    for record in records:
        if record["metric"] == "reward_max" and record["b"] == CONTROL:
            record["verdict"] = _flat_reading(record["verdict"])
    return records


def _judged(claims: list[Claim]) -> list[dict]:
    """The claims judged as one family (those with one seed or none: "not measured"), as records."""
    return [v.record() for v in judge(claims, min_n=2)]


def _flat_reading(word: str) -> str:
    """The verdict of "max reward stays flat", read from the claim "it rises"."""
    if word.startswith("equivalent"):
        return f"holds ({word})"
    if word.startswith("better"):
        return "does not hold (max reward rose)"
    if word.startswith("worse"):
        return "does not hold (max reward fell)"
    return word


# ---- markdown ---------------------------------------------------------------------------------
def table_markdown(table: pd.DataFrame, window: int, first: bool = False) -> str:
    suffix = "_first" if first else ""
    span = f"first {window}" if first else f"last {window}"
    seeds = ", ".join(str(s) for s in sorted(table.seed.unique()))
    rows = [
        [method, *(format_mean_sd(table[table.method == method][c + suffix]) for c in METRICS)]
        for method in _methods(table)
    ]
    return (
        f"Mean ± sd over seeds of each seed's mean over the {span} epoch(s); seeds: {seeds}.\n\n"
        + _metric_table("method", rows)
        + "\n"
    )


def _metric_table(first: str, rows: list[list[str]]) -> str:
    """A table of :data:`METRICS` (right-aligned) per row named in its ``first`` column."""
    return md_table([first, *METRICS.values()], rows, align="l" + "r" * len(METRICS))


def delta_markdown(table: pd.DataFrame, baseline: str) -> str:
    rows = [
        [method, *(format_mean_sd(_paired(table, method, baseline, c)) for c in METRICS)]
        for method in _methods(table)
        if method != baseline
    ]
    return (
        f"Paired differences (method − {baseline}) per seed, mean ± sd over seeds.\n\n"
        + _metric_table("method", rows)
        + "\n"
    )


def claims_markdown(claims: list[dict]) -> str:
    rows = []

    def num(x: float | None, fmt: str) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    for c in claims:
        diff = num(c["diff_mean"], "+.3f")
        if not math.isnan(c["diff_sd"]):
            diff += f" ± {c['diff_sd']:.3f}"
        if c.get("ci_low") is not None:
            diff += f" [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
        tost = f"{num(c.get('p_tost_holm'), '.3g')}, ±{MARGINS[c['metric']]:g}"
        rows.append([c["claim"], diff, f"{c['wins']}/{c['n']}", num(c.get("p_holm"), ".3g"), tost, c["verdict"]])
    header = ["claim", "difference a − b, mean ± sd over seeds [95% CI]", "seeds in the claimed direction"]
    return md_table([*header, "p (Holm)", "TOST p (Holm), margin", "verdict"], rows, align="lrrrrl") + "\n"


def best_of_k_markdown(plan: dict, best: pd.DataFrame, claims: list[dict], window: int) -> str:
    """Pop-GRPO against its compute-matched best-of-K control: what each arm trains on, both
    arms' best members, and the claims."""
    arms = [m for m in POPULATIONS if m in set(best.method)]
    if len(arms) < len(POPULATIONS):
        return f"This study has no {' and no '.join(m for m in POPULATIONS if m not in arms)} arm.\n"
    lines = [
        "Both arms train K members side by side; Pop-GRPO merges them at the end of every round, "
        f"{BEST_OF_K} (the same population with `scheduler.enabled=false`) never does, so its members "
        "are K independent GRPO runs. What one member trains on, from each trial's resolved config:\n",
    ]
    computes = []
    for arm in arms:
        trials = [t for t in plan["trials"] if t["memberships"][0]["label"] == arm]
        seeds = ", ".join(str(s) for s in sorted(t["seed"] for t in trials))
        for compute in sorted({tuple(compute_per_member(t).items()) for t in trials}):
            c = dict(compute)
            computes.append([arm, c["members"], c["epochs"], c["programs"], c["updates"], seeds])
    header = ["arm", "members K", "epochs", "programs sampled per member", "gradient updates per member", "seeds"]
    lines += [
        md_table(header, computes, align="lrrrrl"),
        "",
        f"Each arm is scored by its **best member** per seed: the member with the highest mean reward over "
        f"the last {window} epoch(s), every metric of that member (mean ± sd over seeds):\n",
        _metric_table("arm", [[arm, *(format_mean_sd(best[best.method == arm][c]) for c in METRICS)] for arm in arms]),
    ]
    lines += [
        "",
        f"Claims, paired by seed: a family of their own ({len(claims)} claims, Holm across them only, "
        "apart from the claims above). TOST margins as above, set after the other arms' results were "
        "known: post hoc here too.\n",
        claims_markdown(claims),
    ]
    return "\n".join(lines)


def cost_markdown(out: Path, plan: dict) -> str:
    """Seconds per trial and per member-epoch, from each trial's timing.json."""
    rows = []
    for t in plan["trials"]:
        path = out / "runs" / t["key"] / "timing.json"
        if not path.is_file():
            continue
        timing = json.loads(path.read_text())
        members = 2 if any(o == "population.size=2" for o in t["overrides"]) else 1
        rows.append(
            {
                "method": t["memberships"][0]["label"],
                "seconds": timing["seconds"],
                "per_member_epoch": timing["seconds"] / (plan["epochs"] * members),
                "load": timing["load_average"][0],
                "resumed": timing["resumed"],
            }
        )
    if not rows:
        return "No timing.json in the trials' run directories.\n"
    frame = pd.DataFrame(rows)
    body = []
    for method in [m for m in LM_METHODS if m in set(frame.method)]:
        rows = frame[frame.method == method]
        seconds = [format_mean_sd(rows.seconds, 0), format_mean_sd(rows.per_member_epoch, 1)]
        body.append([method, *seconds, format_mean_sd(rows.load, 1)])
    header = ["method", "seconds per trial", "seconds per member-epoch", "1-min load average at the trial's end"]
    lines = [
        "Each trial ran on one CPU (a Ray Tune trial, the members in its process, one torch thread).\n",
        md_table(header, body, align="lrrr"),
    ]
    if frame.resumed.any():
        lines.append("\nSome trials were resumed: their seconds cover the resumed part only.")
    return "\n".join(lines) + "\n"


def _methods(table: pd.DataFrame) -> list[str]:
    present = set(table.method)
    return [m for m in LM_METHODS if m in present]


# ---- figures -----------------------------------------------------------------------------------
def fig_training(epochs: pd.DataFrame, path: Path) -> Path:
    """Paper Figure 1 on programs: every metric over training, mean ± sd over seeds per method."""
    cols = ["reward_mean", "reward_max", "diversity", "distinct", "complexity", "success"]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, col in zip(axes.flat, cols, strict=True):
        for method in [m for m in LM_METHODS if m in set(epochs.method)]:
            grouped = epochs[epochs.method == method].groupby("epoch")[col]
            mean, sd = grouped.mean(), grouped.std(ddof=1).fillna(0.0)
            style = "--" if method == CONTROL else "-"
            ax.plot(mean.index, mean.values, style, color=COLORS[method], label=method)
            ax.fill_between(mean.index, mean - sd, mean + sd, color=COLORS[method], alpha=0.12)
        ax.set_title(METRICS[col])
        ax.set_xlabel("epoch")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("Training on real programs (mean ± sd over seeds)")
    return save_figure(fig, path)


def fig_reward_diversity(table: pd.DataFrame, path: Path) -> Path:
    """Paper Figure 2 on programs: final mean reward against diversity, one point per seed."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, col in zip(axes, ("diversity", "distinct"), strict=True):
        for method in _methods(table):
            rows = table[table.method == method]
            ax.scatter(rows[col], rows["reward_mean"], color=COLORS[method], label=method, s=40)
            ax.scatter(rows[col].mean(), rows["reward_mean"].mean(), color=COLORS[method], marker="*", s=220)
        ax.set_xlabel(METRICS[col])
        ax.set_ylabel("mean reward")
    axes[0].legend(fontsize=8)
    fig.suptitle("Reward against diversity at the end of training (dots: seeds; stars: means)")
    return save_figure(fig, path)


def fig_length_early_late(table: pd.DataFrame, epochs: pd.DataFrame, window: int, path: Path) -> Path:
    """Paper Figure 3 on programs: completion length quantiles, first vs last epochs, per method."""
    quantiles = ["complexity_p10", "complexity_p50", "complexity_p90"]
    methods = _methods(table)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.38
    for i, method in enumerate(methods):
        rows = epochs[epochs.method == method]
        first = rows[rows.epoch < window][quantiles].mean()
        last = rows[rows.epoch > rows.epoch.max() - window][quantiles].mean()
        for offset, values, alpha in ((-width / 2, first, 0.45), (width / 2, last, 1.0)):
            x = i + offset
            ax.vlines(x, values["complexity_p10"], values["complexity_p90"], color=COLORS[method], alpha=alpha, lw=6)
            ax.plot([x - 0.1, x + 0.1], [values["complexity_p50"]] * 2, color="black", lw=1.5)
    ax.set_xticks(range(len(methods)), methods, fontsize=8)
    ax.set_ylabel("completion length (tokens)")
    ax.set_title(f"Length p10–p90 (bar) and median (line): first {window} epoch(s) (pale) vs last {window}")
    return save_figure(fig, path)


# ---- everything --------------------------------------------------------------------------------
def render_lm(out: str | Path) -> list[Path]:
    """Write ``lm.md``, ``lm_table.csv``, ``lm_claims.json`` and the figures into ``out``."""
    out = Path(out)
    plan_file, metrics_file = out / "plan.json", out / "metrics.parquet"
    for f in (plan_file, metrics_file):
        if not f.is_file():
            raise FileNotFoundError(f"{f} is missing: is {out} the --out of a popgrpo reproduce --study lm run?")
    plan = json.loads(plan_file.read_text())
    window = int(plan["window"])
    epochs = epochs_by_trial(plan, pd.read_parquet(metrics_file))
    table = lm_table(epochs, window)
    claims = lm_claims(table)
    best = best_member_table(plan, pd.read_parquet(metrics_file), window)
    best_claims = best_of_k_claims(best)
    table.to_csv(out / "lm_table.csv", index=False)
    write_verdicts(out / "lm_claims.json", claims)
    best.to_csv(out / "lm_best_members.csv", index=False)
    write_verdicts(out / "lm_best_of_k_claims.json", best_claims)
    kind = "quick" if plan["quick"] else "full"
    text = [
        f"# The collapse study on real programs ({kind} form)\n",
        f"Model: `{plan['model']}`; {plan['epochs']} epochs per trial; {len(plan['trials'])} trials.\n",
        f"## End of training (last {window} epoch(s))\n",
        table_markdown(table, window),
        f"## Start of training (first {window} epoch(s))\n",
        table_markdown(table, window, first=True),
        "## Against the no-update control\n",
        delta_markdown(table, CONTROL),
        "## Against GRPO\n",
        delta_markdown(table, "GRPO"),
        "## Claims\n",
        claims_markdown(claims),
        "## Pop-GRPO against the best of K independent GRPO runs (compute-matched)\n",
        best_of_k_markdown(plan, best, best_claims, window),
        "## Cost\n",
        cost_markdown(out, plan),
    ]
    (out / "lm.md").write_text("\n".join(text))
    written = [
        out / "lm.md",
        out / "lm_table.csv",
        out / "lm_claims.json",
        out / "lm_best_members.csv",
        out / "lm_best_of_k_claims.json",
    ]
    written.append(fig_training(epochs, out / FIGURES[0]))
    written.append(fig_reward_diversity(table, out / FIGURES[1]))
    written.append(fig_length_early_late(table, epochs, window, out / FIGURES[2]))
    return written
