"""Tables, figures and claim checks from a study's Parquet files, without training.

``popgrpo report OUT`` reads ``OUT/plan.json``, ``OUT/metrics.parquet`` and each run's
``archive.parquet`` and writes:

- ``table1.md``: Table 1 (last-10-epoch averages, mean ± std over seeds) beside the paper's,
  the multi-seed table, a paired Pop-GRPO vs GRPO comparison, and the ablation tables;
- ``claims.md``: each of the paper's claims, the paired comparisons over seeds that test it, and
  their verdicts (:mod:`popgrpo.research.study.stats`: Holm-corrected across the report, TOST at a
  stated margin for "equivalent"); ``verdicts.json``: the same, one record per comparison;
- ``fig1_training_dynamics.png`` … ``fig7_population_size.png`` (the paper's Figures 1–7) and
  ``archive_<method>.png`` (the final MAP-Elites grid of each method, seed 42 or the first).

Numbers per trial follow :func:`popgrpo.telemetry.summary.summarise`: the mean over the last
``window`` epochs of the mean over members; ``population_max_reward`` is the best member's.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats

from popgrpo.markdown import md_table
from popgrpo.research.study.plan import (
    ABLATIONS,
    CONTROLS,
    MERGE_STRATEGIES,
    METHODS,
    PAPER_MULTISEED,
    PAPER_TABLE1,
    REGIME_METHODS,
)
from popgrpo.research.study.stats import (
    ALPHA,
    VERDICT,
    Claim,
    Column,
    Verdict,
    format_mean_sd,
    judge,
    label_column,
    verdicts_markdown,
    write_verdicts,
)
from popgrpo.telemetry.plots import save_figure
from popgrpo.telemetry.summary import population_by_epoch

__all__ = ["FIGURES", "check_claims", "holds", "render", "results_verdicts_markdown", "trial_table", "verdict_cell"]

METRICS = (
    ("mean_reward", "mean R"),
    ("max_reward", "max R"),
    ("population_max_reward", "best member's max R"),
    ("diversity", "diversity"),
    ("complexity", "complexity"),
    ("archive_coverage", "archive coverage"),
)
FIGURES = (
    "fig1_training_dynamics.png",
    "fig2_reward_diversity.png",
    "fig3_complexity_early_late.png",
    "fig4_multiseed.png",
    "fig5_entropy_target.png",
    "fig6_archive_bonus.png",
    "fig7_population_size.png",
    "fig8_merge_strategies.png",
    "fig5b_entropy_target_joint.png",
)
# The ablation figures, in the paper's numbering: (study, file, paper figure).
ABLATION_FIGURES = (
    ("entropy_target", FIGURES[4], 5),
    ("archive_bonus", FIGURES[5], 6),
    ("population_size", FIGURES[6], 7),
    ("entropy_target_joint", FIGURES[8], 5),
)
REGIME_FIGURE = "fig9_regime_map.png"  # written when the study has the regime map (the full plan)
COLORS = {
    "best-of-K GRPO": "tab:gray",
    "GRPO": "tab:red",
    "QD-GRPO": "tab:green",
    "MaxEnt-GRPO": "tab:blue",
    "Pop-GRPO": "tab:orange",
    "Combined (§7)": "tab:purple",
}
WINDOW = 10  # main paper §5: last 10 epochs


# ---- loading -------------------------------------------------------------------------------
def load(out: str | Path) -> tuple[list[dict], pd.DataFrame]:
    out = Path(out)
    plan_file, metrics_file = out / "plan.json", out / "metrics.parquet"
    for f in (plan_file, metrics_file):
        if not f.is_file():
            raise FileNotFoundError(f"{f} is missing: is {out} the --out of a popgrpo reproduce run?")
    return json.loads(plan_file.read_text())["trials"], pd.read_parquet(metrics_file)


def per_epoch(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per trial and epoch: the mean over members, plus the best member's max reward."""
    frames = []
    for (trial, seed), frame in metrics.groupby(["trial", "seed"], sort=False):
        by_epoch = population_by_epoch(frame.drop(columns=["trial", "seed"])).reset_index()
        by_epoch.insert(0, "trial", trial)
        by_epoch.insert(1, "seed", seed)
        frames.append(by_epoch)
    return pd.concat(frames, ignore_index=True)


def trial_table(plan: list[dict], metrics: pd.DataFrame, window: int = WINDOW) -> pd.DataFrame:
    """One row per (study cell, seed): the last-``window`` averages (coverage: final value)."""
    epochs = per_epoch(metrics)
    numbers = {}
    for trial, frame in epochs.groupby("trial"):
        last = frame.tail(window)
        numbers[trial] = {
            "mean_reward": last["reward_mean"].mean(),
            "max_reward": last["reward_max"].mean(),
            "population_max_reward": last["population_max_reward"].mean(),
            "diversity": last["diversity"].mean(),
            "complexity": last["complexity"].mean(),
            "entropy": last["entropy"].mean(),
            "archive_coverage": frame["archive_coverage"].iloc[-1],
            "diversity_first": frame.head(window)["diversity"].mean(),
            "complexity_first": frame.head(window)["complexity"].mean(),
        }
    rows = [
        {"study": m["study"], "label": m["label"], "value": m["value"], "seed": t["seed"], "trial": t["key"]}
        | numbers[t["key"]]
        for t in plan
        for m in t["memberships"]
    ]
    return pd.DataFrame(rows)


# ---- tables --------------------------------------------------------------------------------
def table1_markdown(table: pd.DataFrame) -> str:
    t1 = table[table.study == "table1"]
    seeds = sorted(t1.seed.unique())
    lines = [
        f"## Table 1: last {WINDOW} epochs, mean ± std over seeds {', '.join(map(str, seeds))}",
        "",
        "Paper: the main paper's Table 1 (one seed). `max R` is the mean over members of each member's "
        "best reward per step; for a population, `best member's max R` is the population's discovery number.",
        "",
    ]
    body = []
    for method in METHODS:
        rows = t1[t1.label == method]
        if rows.empty:
            continue
        body.append([method, *(format_mean_sd(rows[key], 4) for key, _ in METRICS)])
        paper = PAPER_TABLE1.get(method)
        if paper:
            body.append(["*paper*", *(f"*{paper[k]:.4f}*" if k in paper else "*–*" for k, _ in METRICS)])
    lines += [md_table(["method", *(name for _, name in METRICS)], body)]
    lines += ["", "Multi-seed numbers the paper prints (§6.4):", ""]
    for (method, key), (mean, std) in PAPER_MULTISEED.items():
        ours = t1[t1.label == method][key]
        lines.append(f"- {method} {key}: paper {mean} ± {std}; ours {format_mean_sd(ours, 4)}")
    return "\n".join(lines) + "\n"


def paired(table: pd.DataFrame, a: str, b: str, key: str, study: str = "table1") -> dict:
    """Per seed ``a − b`` of ``key`` over the rows of ``study``, with a paired t-test where n ≥ 2."""
    t1 = table[table.study == study]
    left = t1[t1.label == a].set_index("seed")[key]
    right = t1[t1.label == b].set_index("seed")[key]
    seeds = sorted(set(left.index) & set(right.index))
    diff = np.array([left[s] - right[s] for s in seeds])
    p = float(stats.ttest_rel(left[seeds], right[seeds]).pvalue) if len(seeds) > 1 and diff.std() > 0 else float("nan")
    return {"seeds": seeds, "diff": diff, "wins": int((diff > 0).sum()), "mean": float(diff.mean()), "p": p}


def paired_markdown(table: pd.DataFrame) -> str:
    rows = []
    for key in ("max_reward", "population_max_reward", "diversity"):
        r = paired(table, "Pop-GRPO", "GRPO", key)
        rows.append([key, _per_seed(r), f"{r['mean']:+.4f}", f"{r['wins']}/{len(r['seeds'])}", f"{r['p']:.3g}"])
    header = ["metric", "per-seed difference", "mean", "Pop-GRPO ahead", "paired t-test p"]
    return f"## Paired: Pop-GRPO − GRPO, per seed\n\n{md_table(header, rows)}\n"


def _per_seed(r: dict) -> str:
    """The per-seed differences of :func:`paired`: ``seed: difference, …``."""
    return ", ".join(f"{s}: {d:+.3f}" for s, d in zip(r["seeds"], r["diff"], strict=True))


# The control each population claim must survive: (population label, its best-of-K control).
CONTROL_PAIRS = (("Pop-GRPO", "best-of-K GRPO"), ("Pop-GRPO, own inits", "best-of-K GRPO, own inits"))


def controls_markdown(table: pd.DataFrame) -> str:
    """Pop-GRPO against its compute-matched controls: member mean and best member, per seed."""
    rows = table[table.study == "controls"]
    if rows.empty:
        return ""
    keys = (("max_reward", "member-mean max R"), ("population_max_reward", "best member's max R"))
    keys += (("mean_reward", "member-mean R"), ("diversity", "member-mean diversity"))
    lines = [
        "## Controls: Pop-GRPO against the best of K independent GRPO runs (K = 5, the same ideas)",
        "",
        "Best-of-K GRPO is the Pop-GRPO population with the scheduler off: K GRPO members that never "
        "select, merge or mutate, scored the same way. `own inits`: population.shared_init false.",
        "",
    ]
    cells = {name: rows[rows.label == name] for name in CONTROLS}
    runs = [[name, *(format_mean_sd(cell[k], 4) for k, _ in keys)] for name, cell in cells.items() if not cell.empty]
    lines += [md_table(["run", *(name for _, name in keys)], runs), ""]
    comparisons = []
    for pop, control in CONTROL_PAIRS:
        for key in ("population_max_reward", "max_reward"):
            r = paired(table, pop, control, key, study="controls")
            mean, ahead = f"{r['mean']:+.4f}", f"{r['wins']}/{len(r['seeds'])}"
            comparisons.append([f"{pop} − {control}", key, _per_seed(r), mean, ahead, f"{r['p']:.3g}"])
    header = ["comparison", "metric", "per-seed difference", "mean", "ahead", "paired t-test p"]
    return "\n".join([*lines, md_table(header, comparisons)]) + "\n"


def _paper_diversity_order() -> list[str]:
    """The four methods of the paper's Table 1, most diverse first (Pop-GRPO > MaxEnt-GRPO > GRPO > QD-GRPO)."""
    return sorted(PAPER_TABLE1, key=lambda m: -PAPER_TABLE1[m]["diversity"])


def regime_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Per training intensity (GRPO updates per epoch): the three main claims, over seeds.

    * ``ordering``: Kendall's τ between the four methods' mean diversity and the paper's Table 1
      order (Pop-GRPO > MaxEnt-GRPO > GRPO > QD-GRPO); 1 is the paper's order.
    * ``pop_minus_control`` / ``pop_ahead`` / ``pop_verdict``: Pop-GRPO's best member's max R minus
      that of the best of K GRPO runs, mean over seeds, in how many seeds it is ahead, and the
      verdict of :func:`check_claims` (Holm-corrected with every other comparison of the report).
    * ``grpo_complexity_ratio``: GRPO's complexity in the last 10 epochs over the first 10
      (< 1: complexity collapses); ``grpo_diversity``: GRPO's last-10 diversity.
    * ``diversity_in_paper_order``: the four methods' mean diversity, in the paper's order (what
      ``ordering`` ranks).
    """
    rows = table[table.study == "regime"]
    paper_order = _paper_diversity_order()
    verdicts = {v.claim.name: v.word for v in check_claims(table) if v.claim.name.endswith("(regime)")}
    out = []
    for intensity, cell in rows.groupby("value"):
        diversity = cell.groupby("label")["diversity"].mean().reindex(paper_order)
        # scipy's annotations miss the result's statistic attribute
        tau = float(stats.kendalltau(range(len(paper_order)), -diversity.values).statistic)  # pyright: ignore[reportAttributeAccessIssue]
        pop = cell[cell.label == "Pop-GRPO"].set_index("seed")["population_max_reward"]
        control = cell[cell.label == "best-of-K GRPO"].set_index("seed")["population_max_reward"]
        seeds = sorted(set(pop.index) & set(control.index))
        diff = np.array([pop[s] - control[s] for s in seeds])
        grpo = cell[cell.label == "GRPO"]
        out.append(
            {
                "updates_per_epoch": int(intensity),
                "ordering": tau,
                "pop_minus_control": float(diff.mean()) if len(diff) else float("nan"),
                "pop_ahead": f"{int((diff > 0).sum())}/{len(seeds)}",
                "pop_verdict": verdicts.get(_regime_comparison(intensity), "inconclusive"),
                "grpo_complexity_ratio": float((grpo.complexity / grpo.complexity_first).mean()),
                "grpo_diversity": float(grpo.diversity.mean()),
                "diversity_in_paper_order": ", ".join(f"{d:.3f}" for d in diversity.values),
            }
        )
    return pd.DataFrame(out)


def regime_markdown(table: pd.DataFrame) -> str:
    regime = regime_rows(table)
    if regime.empty:
        return ""
    order = _paper_diversity_order()
    lines = [
        "## Regime map: the main claims by training intensity (GRPO updates per epoch, fixed epochs)",
        "",
        "ordering: Kendall's τ of the four methods' diversity with the paper's order (1 = as in Table 1); "
        "Pop − best-of-K: best member's max R; GRPO complexity last/first: < 1 is a collapse.",
        "",
    ]
    header = ["updates/epoch", "diversity ordering τ", "Pop − best-of-K (mean)", "Pop ahead", "verdict (Holm)"]
    header += ["GRPO complexity last/first", "GRPO diversity", f"diversity of {', '.join(order)}"]
    rows = []
    for r in regime.itertuples():
        claims = [r.updates_per_epoch, f"{r.ordering:+.2f}", f"{r.pop_minus_control:+.3f}", r.pop_ahead, r.pop_verdict]
        grpo = [f"{r.grpo_complexity_ratio:.3f}", f"{r.grpo_diversity:.3f}", r.diversity_in_paper_order]
        rows.append([*claims, *grpo])
    return "\n".join([*lines, md_table(header, rows)]) + "\n"


def ablation_markdown(table: pd.DataFrame) -> str:
    lines = []
    for study, (preset, symbol, _, _) in ABLATIONS.items():
        rows = table[table.study == study]
        if rows.empty:
            continue
        body = [
            [f"{value:g}", *(format_mean_sd(cell[key], 4) for key, _ in METRICS)]
            for value, cell in rows.groupby("value")
        ]
        lines += [f"## Ablation: {symbol} ({preset}), mean ± std over seeds", ""]
        lines += [md_table([symbol, *(name for _, name in METRICS)], body), ""]
    return "\n".join(lines)


def merge_markdown(table: pd.DataFrame) -> str:
    """The merge-strategy ablation (docs/MERGING.md) and which strategy wins, across seeds."""
    rows = table[table.study == "merge_strategy"]
    if rows.empty:
        return ""
    keys = ("max_reward", "population_max_reward", "diversity", "mean_reward")
    cells = {name: rows[rows.label == name] for name in MERGE_STRATEGIES}
    body = [[name, *(format_mean_sd(cell[k], 4) for k in keys)] for name, cell in cells.items() if not cell.empty]
    lines = [
        "## Merge strategies (Pop-GRPO setting), mean ± std over seeds",
        "",
        md_table(["strategy", *keys], body),
        "",
    ]
    for key in ("population_max_reward", "max_reward", "diversity"):
        best, wins = merge_winner(rows, key)
        lines.append(f"- best on {key}: **{best}** (highest mean; best in {wins} of {rows.seed.nunique()} seeds)")
    return "\n".join(lines) + "\n"


def merge_winner(rows: pd.DataFrame, key: str) -> tuple[str, int]:
    """The strategy with the highest mean ``key``, and in how many seeds it was the best."""
    best = str(rows.groupby("label")[key].mean().idxmax())
    per_seed = rows.loc[rows.groupby("seed")[key].idxmax(), "label"]
    return best, int((per_seed == best).sum())


# ---- claims --------------------------------------------------------------------------------
# Equivalence margins, stated before any result: the smallest difference a claim about the
# metric counts as one. Rewards: 0.05, a sixth of the execution noise σ = 0.3 and 2% of the
# highest peak's quality; diversity (a cosine distance) and archive coverage (a share of cells):
# 0.02; complexity (‖x‖): 0.1. A difference that is significant but bounded inside its margin
# by TOST is reported as such (popgrpo.research.study.stats.Verdict.word).
MARGINS = {
    "mean_reward": 0.05,
    "max_reward": 0.05,
    "population_max_reward": 0.05,
    "diversity": 0.02,
    "complexity": 0.1,
    "archive_coverage": 0.02,
}


def holds(verdict: Verdict) -> bool:
    """The comparison came out as the paper's claim predicts (``expected``), whatever the margin says."""
    return verdict.word.split(",")[0] == verdict.extra["expected"]


def _seed_means(table: pd.DataFrame, study: str, key: str, *, label: str | None = None, values=None) -> pd.Series:
    """Per seed, ``key`` of ``study``'s rows (of one ``label``, and the mean over ``values`` of the study's setting)."""
    rows = table[table.study == study]
    if label is not None:
        rows = rows[rows.label == label]
    if values is not None:
        rows = rows[rows.value.isin(list(values))]
    return rows.groupby("seed")[key].mean()


def _part(claim: str, comparison: str, expected: str, key: str, a: pd.Series, b: pd.Series, note: str = "") -> Claim:
    """The paired comparison ``a − b`` of ``key`` over the seeds both have, named ``comparison``;
    labelled with the paper's ``claim`` and the verdict it predicts (``expected``), and noting the
    per-seed differences (and ``note``) for claims.md."""
    seeds = sorted(set(a.index) & set(b.index))
    diffs = [float(a[s] - b[s]) for s in seeds]
    evidence = f"per seed {', '.join(f'{s}: {d:+.3f}' for s, d in zip(seeds, diffs, strict=True))}"
    evidence += f"; ahead in {sum(d > 0 for d in diffs)}/{len(seeds)} seeds" + (f"; {note}" if note else "")
    labels = {"paper_claim": claim, "comparison": comparison, "expected": expected}
    return Claim(comparison, tuple(diffs), MARGINS[key], labels=labels, note=evidence)


def _means(table: pd.DataFrame, study: str, key: str) -> pd.Series:
    return table[table.study == study].groupby("value" if study != "table1" else "label")[key].mean()


def claim_parts(table: pd.DataFrame) -> list[Claim]:
    """Every comparison the report judges: the paper's §6 claims, the controls, the ablations
    and each cell of the regime map, as paired differences over seeds."""
    parts: list[Claim] = []
    t1 = table[table.study == "table1"]
    grpo = t1[t1.label == "GRPO"].set_index("seed")
    collapse = "GRPO's diversity and complexity fall over training (collapse)."
    for key in ("diversity", "complexity"):
        parts.append(
            _part(
                collapse,
                f"GRPO {key}, last {WINDOW} − first {WINDOW} epochs",
                "worse",
                key,
                grpo[key],
                grpo[f"{key}_first"],
            )
        )
    for key, what in (("max_reward", "member-mean max R"), ("population_max_reward", "best member's max R")):
        parts.append(
            _part(
                f"Pop-GRPO's max reward beats GRPO's ({what}).",
                f"Pop-GRPO − GRPO, {key}",
                "better",
                key,
                _seed_means(table, "table1", key, label="Pop-GRPO"),
                _seed_means(table, "table1", key, label="GRPO"),
            )
        )
    four = [m for m in METHODS if m in PAPER_TABLE1 and m != "MaxEnt-GRPO"]
    maxent_claim = "MaxEnt-GRPO has the highest diversity and complexity and the lowest reward."
    others = t1[t1.label.isin(four)].groupby("label")[["mean_reward", "max_reward", "diversity", "complexity"]].mean()
    if (t1.label == "MaxEnt-GRPO").any() and len(others):
        expectations = (
            ("diversity", "better"),
            ("complexity", "better"),
            ("mean_reward", "worse"),
            ("max_reward", "worse"),
        )
        for key, expected in expectations:
            # against the other method closest to MaxEnt on the claimed side: the strongest rival
            rival = str(others[key].idxmax() if expected == "better" else others[key].idxmin())
            parts.append(
                _part(
                    maxent_claim,
                    f"MaxEnt-GRPO − {rival}, {key}",
                    expected,
                    key,
                    _seed_means(table, "table1", key, label="MaxEnt-GRPO"),
                    _seed_means(table, "table1", key, label=rival),
                )
            )
    parts.append(
        _part(
            "QD-GRPO covers more of the archive than GRPO.",
            "QD-GRPO − GRPO, final archive_coverage",
            "better",
            "archive_coverage",
            _seed_means(table, "table1", "archive_coverage", label="QD-GRPO"),
            _seed_means(table, "table1", "archive_coverage", label="GRPO"),
        )
    )
    if (table.study == "controls").any():
        for pop, control in CONTROL_PAIRS:
            key = "population_max_reward"
            parts.append(
                _part(
                    f"{pop}'s best member beats the best of K independent GRPO runs ({control}; same K, same ideas).",
                    f"{pop} − {control}, {key}",
                    "better",
                    key,
                    _seed_means(table, "controls", key, label=pop),
                    _seed_means(table, "controls", key, label=control),
                )
            )
    parts += _ablation_parts(table)
    rows = table[table.study == "regime"]
    for intensity in sorted(rows.value.unique()):
        key = "population_max_reward"
        parts.append(
            _part(
                f"Pop-GRPO's best member beats the best of K GRPO runs at {intensity:g} updates/epoch (regime map).",
                _regime_comparison(intensity),
                "better",
                key,
                _seed_means(table, "regime", key, label="Pop-GRPO", values=[intensity]),
                _seed_means(table, "regime", key, label="best-of-K GRPO", values=[intensity]),
            )
        )
    return parts


def _regime_comparison(intensity: float) -> str:
    return f"Pop-GRPO − best-of-K GRPO, population_max_reward, {intensity:g} updates/epoch (regime)"


def _trend(series: pd.Series) -> float:
    """Spearman rank correlation of a mean curve with its x values (+1: monotone rising)."""
    if len(series) < 3 or np.ptp(series.to_numpy()) == 0:
        return 0.0  # flat (or too short): no trend
    # scipy's annotations miss the result's statistic attribute
    return float(stats.spearmanr(series.index, series.values).statistic)  # pyright: ignore[reportAttributeAccessIssue]


def _ablation_parts(table: pd.DataFrame) -> list[Claim]:
    """The paper's ablation claims, each part a paired comparison of two settings over seeds
    (a trend's endpoints, or the settings the claim names), so that curves flat to the third
    decimal do not pass on their rank order. Spearman's ρ of the mean curve is evidence only."""
    parts: list[Claim] = []
    for study, reading in (("entropy_target", ""), ("entropy_target_joint", " (H* as the joint entropy)")):
        if not (table.study == study).any():
            continue
        claim = f"Entropy target H*{reading}: diversity rises with H*; max reward falls once H* > 1."
        div, mx = _means(table, study, "diversity"), _means(table, study, "max_reward")
        lo, hi = div.index.min(), div.index.max()
        parts.append(
            _part(
                claim,
                f"diversity, H* = {hi:g} − H* = {lo:g} ({study})",
                "better",
                "diversity",
                _seed_means(table, study, "diversity", values=[hi]),
                _seed_means(table, study, "diversity", values=[lo]),
                f"diversity by H* {_fmt(div)} (Spearman ρ = {_trend(div):+.2f})",
            )
        )
        beyond = [v for v in mx.index if v > 1.0]
        if beyond and 1.0 in mx.index:
            parts.append(
                _part(
                    claim,
                    f"max_reward, H* > 1 − H* = 1 ({study})",
                    "worse",
                    "max_reward",
                    _seed_means(table, study, "max_reward", values=beyond),
                    _seed_means(table, study, "max_reward", values=[1.0]),
                    f"max R by H* {_fmt(mx)}",
                )
            )
    if (table.study == "archive_bonus").any():
        claim = "Archive bonus β: moderate β (0.3–0.5) raises coverage over β = 0; β ≥ 2 costs reward."
        cov, mx = _means(table, "archive_bonus", "archive_coverage"), _means(table, "archive_bonus", "max_reward")
        moderate = [v for v in cov.index if 0.3 <= v <= 0.5]
        large = [v for v in mx.index if v >= 2.0]
        parts.append(
            _part(
                claim,
                "archive_coverage, β 0.3–0.5 − β = 0",
                "better",
                "archive_coverage",
                _seed_means(table, "archive_bonus", "archive_coverage", values=moderate),
                _seed_means(table, "archive_bonus", "archive_coverage", values=[0.0]),
                f"coverage by β {_fmt(cov)}",
            )
        )
        parts.append(
            _part(
                claim,
                "max_reward, β ≥ 2 − β 0.3–0.5",
                "worse",
                "max_reward",
                _seed_means(table, "archive_bonus", "max_reward", values=large),
                _seed_means(table, "archive_bonus", "max_reward", values=moderate),
                f"max R by β {_fmt(mx)}",
            )
        )
    if (table.study == "population_size").any():
        claim = "Population size K: diversity rises with K; max reward peaks at K = 5."
        div = _means(table, "population_size", "diversity")
        mx = _means(table, "population_size", "population_max_reward")
        lo, hi = div.index.min(), div.index.max()
        parts.append(
            _part(
                claim,
                f"diversity, K = {hi:g} − K = {lo:g}",
                "better",
                "diversity",
                _seed_means(table, "population_size", "diversity", values=[hi]),
                _seed_means(table, "population_size", "diversity", values=[lo]),
                f"diversity by K {_fmt(div)} (Spearman ρ = {_trend(div):+.2f})",
            )
        )
        if 5 in mx.index and len(mx) > 1:
            rival = mx.drop(5).idxmax()  # the strongest other K, by mean
            parts.append(
                _part(
                    claim,
                    f"population_max_reward, K = 5 − K = {rival:g}",
                    "better",
                    "population_max_reward",
                    _seed_means(table, "population_size", "population_max_reward", values=[5]),
                    _seed_means(table, "population_size", "population_max_reward", values=[rival]),
                    f"best member's max R by K {_fmt(mx)}",
                )
            )
    return parts


def check_claims(table: pd.DataFrame, *, alpha: float = ALPHA) -> list[Verdict]:
    """Every comparison of :func:`claim_parts`, judged as one Holm family by
    :func:`popgrpo.research.study.stats.judge` (paired t-test, TOST at the metric's margin, bootstrap CI);
    a comparison without a seed both sides have is ``not measured``."""
    return judge(claim_parts(table), alpha=alpha, min_n=1)


def _fmt(series: pd.Series) -> str:
    return ", ".join(f"{k:g}: {v:.3f}" for k, v in series.items())


def _measured(verdict: Verdict) -> str:
    """What claims.md says a comparison measured: the effect, the seeds, and the tests' p."""
    if verdict.outcome == "not measured":
        return verdict.claim.note
    lo, hi = verdict.ci
    return (
        f"mean {verdict.test.mean:+.4f} [95% CI {lo:+.3f}, {hi:+.3f}]; {verdict.claim.note}; "
        f"t-test p = {verdict.p:.3g}, Holm p = {verdict.p_holm:.3g}; TOST ±{verdict.claim.margin:g} "
        f"Holm p = {verdict.p_tost:.3g}"
    )


CLAIM_COLUMNS: list[Column] = [
    label_column("claim", "paper_claim"),
    label_column("comparison", "comparison"),
    ("measured", _measured),
    label_column("claimed", "expected"),
    VERDICT,
]


def claims_markdown(verdicts: list[Verdict]) -> str:
    lines = [
        "## Claims",
        "",
        f"Each row is a paired comparison over seeds; verdicts are Holm-corrected across all {len(verdicts)} rows "
        f"(α = {ALPHA}); `equivalent within ±m` needs TOST at the stated margin m (popgrpo.research.study.stats).",
        "",
    ]
    return "\n".join(lines) + "\n" + verdicts_markdown(verdicts, CLAIM_COLUMNS)


def verdict_cell(record: dict) -> str:
    """A verdict as the results pages state it: bold verdict, then (mean [95% CI], Holm p), and
    the TOST Holm p where the verdict rests on it (equivalent, or within the margin)."""
    p = "n/a" if record["p_holm"] is None else f"{record['p_holm']:.3g}"
    numbers = f"{record['mean_diff']:+.4f} [{record['ci_low']:+.3f}, {record['ci_high']:+.3f}], Holm p = {p}"
    if "within" in record["verdict"]:
        numbers += f", TOST Holm p = {record['p_tost_holm']:.3g}"
    return f"**{record['verdict']}** ({numbers})"


def results_verdicts_markdown(landscapes: dict[str, list[dict]]) -> str:
    """One table of every judged comparison of several landscapes' studies, side by side.

    ``landscapes`` maps a column header to that study's ``verdicts.json`` records; the studies
    must judge the same paper claims in the same order (one row per comparison). A cell reads
    ``**verdict** (mean difference [95% CI], Holm p)``; where a landscape compares against
    another rival than the first (MaxEnt-GRPO's closest method differs), its cell names its
    comparison. Under the table, per landscape, how many comparisons came out as the paper
    claims, the other way (significant against the claim), equivalent, or inconclusive.
    docs/RESULTS.md includes this table (``docs/gen_reference.py`` writes it).
    """
    columns = list(landscapes.values())
    if not columns or len({len(c) for c in columns}) != 1:
        raise ValueError("every landscape needs the same number of verdicts")
    rows = []
    previous = None
    for row in zip(*columns, strict=True):
        first = row[0]
        if any(r["paper_claim"] != first["paper_claim"] for r in row):
            raise ValueError(f"the landscapes judge different claims: {[r['paper_claim'] for r in row]}")
        cells = [
            verdict_cell(r) if r["comparison"] == first["comparison"] else f"{r['comparison']}: {verdict_cell(r)}"
            for r in row
        ]
        claim = first["paper_claim"] if first["paper_claim"] != previous else "…"
        previous = first["paper_claim"]
        rows.append([claim, first["comparison"], *cells])
    lines = [md_table(["claim (paper)", "comparison, paired by seed", *landscapes], rows), ""]
    for name, records in landscapes.items():
        outcomes = [
            "as claimed"
            if r["outcome"] == r["expected"]
            else "the other way"
            if r["outcome"] in ("better", "worse")
            else r["outcome"]
            for r in records
        ]
        counts = ", ".join(
            f"{outcomes.count(o)} {o}" for o in ("as claimed", "the other way", "equivalent", "inconclusive")
        )
        lines.append(f"- {name}: of {len(records)} comparisons, {counts}.")
    return "\n".join(lines) + "\n"


# ---- figures -------------------------------------------------------------------------------
def _method_epochs(plan: list[dict], epochs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    out = {}
    for method in METHODS:
        keys = [t["key"] for t in plan for m in t["memberships"] if m["study"] == "table1" and m["label"] == method]
        if keys:
            out[method] = epochs[epochs.trial.isin(keys)]
    return out


def fig_training_dynamics(by_method: dict[str, pd.DataFrame], path: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    panels = (
        ("reward_mean", "mean reward"),
        ("reward_max", "max reward"),
        ("diversity", "diversity"),
        ("complexity", "complexity"),
    )
    for ax, (col, label) in zip(axes.flat, panels, strict=True):
        for method, frame in by_method.items():
            curve = frame.groupby("epoch")[col].agg(["mean", "std"]).fillna(0.0)
            ax.plot(curve.index, curve["mean"], label=method, color=COLORS.get(method), lw=1.6)
            ax.fill_between(
                curve.index,
                curve["mean"] - curve["std"],
                curve["mean"] + curve["std"],
                alpha=0.15,
                color=COLORS.get(method),
            )
        ax.set_title(label)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("epoch")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("Training dynamics (mean ± std over seeds; paper Figure 1)")
    return save_figure(fig, path)


def fig_reward_diversity(by_method: dict[str, pd.DataFrame], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 5.5))
    for method, frame in by_method.items():
        half = frame[frame.epoch >= frame.epoch.max() / 2]
        ax.scatter(half.diversity, half.reward_max, s=8, alpha=0.35, color=COLORS.get(method), label=method)
        ax.scatter(
            half.diversity.mean(), half.reward_max.mean(), marker="D", s=90, edgecolor="black", color=COLORS.get(method)
        )
    ax.set_xlabel("diversity")
    ax.set_ylabel("max reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Reward–diversity, second half of training (◆ = mean; paper Figure 2)")
    return save_figure(fig, path)


def fig_complexity_early_late(by_method: dict[str, pd.DataFrame], metrics: pd.DataFrame, path: Path) -> Path:
    """Box plots of per-idea complexity: the epochs' quantiles (p10/p25/p50/p75/p90), early vs late."""
    # Own y scale per method: MaxEnt's ideas are ~10× longer than the others'.
    fig, axes = plt.subplots(1, len(by_method), figsize=(3.2 * len(by_method), 4.2), squeeze=False)
    quantiles = ["complexity_p10", "complexity_p25", "complexity_p50", "complexity_p75", "complexity_p90"]
    for ax, (method, frame) in zip(axes[0], by_method.items(), strict=True):
        rows = metrics[metrics.trial.isin(frame.trial.unique())]
        last = rows.epoch.max()
        boxes = []
        for phase, sel in (("early", rows.epoch < WINDOW), ("late", rows.epoch > last - WINDOW)):
            q = rows.loc[sel, quantiles].mean()
            boxes.append(
                {
                    "label": phase,
                    "whislo": q.iloc[0],
                    "q1": q.iloc[1],
                    "med": q.iloc[2],
                    "q3": q.iloc[3],
                    "whishi": q.iloc[4],
                    "fliers": [],
                }
            )
        parts = ax.bxp(boxes, showfliers=False, patch_artist=True)
        for patch, color in zip(parts["boxes"], ("tab:blue", "tab:red"), strict=True):
            patch.set_facecolor(color)
            patch.set_alpha(0.5)
        ax.set_title(method, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("idea complexity (L2 norm)")
    fig.suptitle(f"Complexity of ideas: first vs last {WINDOW} epochs (p10–p90 whiskers; paper Figure 3)")
    return save_figure(fig, path)


def fig_multiseed(table: pd.DataFrame, path: Path) -> Path:
    t1 = table[table.study == "table1"]
    keys = ("mean_reward", "max_reward", "diversity", "complexity")
    fig, axes = plt.subplots(1, 4, figsize=(15, 4))
    methods = [m for m in METHODS if (t1.label == m).any()]
    for ax, key in zip(axes, keys, strict=True):
        stats_ = t1.groupby("label")[key].agg(["mean", "std"]).reindex(methods)
        ax.bar(
            range(len(methods)),
            stats_["mean"],
            yerr=stats_["std"].fillna(0),
            capsize=4,
            color=[COLORS.get(m, "tab:purple") for m in methods],
        )
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right", fontsize=8)
        ax.set_title(key)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Multi-seed comparison (n = {t1.seed.nunique()}, mean ± std; paper Figure 4)")
    return save_figure(fig, path)


def fig_regime(table: pd.DataFrame, path: Path) -> Path:
    """Diversity, best member's max R and complexity of each method against training intensity."""
    rows = table[table.study == "regime"]
    keys = (("diversity", "diversity"), ("population_max_reward", "best member's max R"), ("complexity", "complexity"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, title) in zip(axes, keys, strict=True):
        for label in REGIME_METHODS:
            cell = rows[rows.label == label].groupby("value")[key].agg(["mean", "std"])
            if cell.empty:
                continue
            ax.errorbar(
                cell.index,
                cell["mean"],
                yerr=cell["std"].fillna(0),
                marker="o",
                capsize=3,
                label=label,
                color=COLORS.get(label, "tab:purple"),
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GRPO updates per epoch")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Regime map: where the paper's conclusions hold (n = {rows.seed.nunique()} seeds, mean ± std)")
    return save_figure(fig, path)


def fig_ablation(table: pd.DataFrame, study: str, path: Path, figure_no: int) -> Path:
    preset, symbol, _, _ = ABLATIONS[study]
    rows = table[table.study == study]
    keys = ("max_reward", "diversity", "complexity", "archive_coverage")
    if study == "population_size":
        keys = ("population_max_reward", *keys[1:])
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    for ax, key in zip(axes, keys, strict=True):
        curve = rows.groupby("value")[key].agg(["mean", "std"]).fillna(0.0)
        ax.errorbar(curve.index, curve["mean"], yerr=curve["std"], marker="o", capsize=3)
        ax.set_xlabel(symbol)
        ax.set_title(key)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Ablation on {symbol} ({preset}; mean ± std over seeds; paper Figure {figure_no})")
    return save_figure(fig, path)


def fig_merge_strategies(table: pd.DataFrame, path: Path) -> Path:
    rows = table[table.study == "merge_strategy"]
    labels = [m for m in MERGE_STRATEGIES if (rows.label == m).any()]
    keys = ("population_max_reward", "max_reward", "diversity")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key in zip(axes, keys, strict=True):
        stats_ = rows.groupby("label")[key].agg(["mean", "std"]).reindex(labels)
        ax.bar(range(len(labels)), stats_["mean"], yerr=stats_["std"].fillna(0), capsize=4, color="tab:orange")
        ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
        low = (stats_["mean"] - stats_["std"].fillna(0)).min()
        ax.set_ylim(bottom=max(0.0, low - 0.1 * abs(low)))
        ax.set_title(key)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Merge and mutation strategies on Pop-GRPO (n = {rows.seed.nunique()} seeds, mean ± std)")
    return save_figure(fig, path)


def fig_archive(archive: pd.DataFrame, cells_per_dim: int, title: str, path: Path) -> Path:
    """The final grid of a run's first archive: each cell coloured by its elite's reward."""
    grid = np.full((cells_per_dim, cells_per_dim), np.nan)
    first = archive[archive.archive == archive.archive.min()] if len(archive) else archive
    for cell, reward in zip(first.cell, first.reward, strict=True):
        i, j = divmod(int(cell), cells_per_dim)
        grid[i, j] = reward
    fig, ax = plt.subplots(figsize=(4.6, 4))
    image = ax.imshow(grid, origin="lower", cmap="viridis")
    fig.colorbar(image, ax=ax, label="elite reward")
    coverage = np.isfinite(grid).mean()
    ax.set_title(f"{title}\ncoverage {coverage:.2f}", fontsize=9)
    ax.set_xlabel("behaviour dim 2 (cell)")
    ax.set_ylabel("behaviour dim 1 (cell)")
    return save_figure(fig, path)


# ---- all of it -----------------------------------------------------------------------------
def render(out: str | Path) -> list[Path]:
    """Write every table and figure for the study in ``out``; return the paths written."""
    from popgrpo.config import load_config

    out = Path(out)
    plan, metrics = load(out)
    table = trial_table(plan, metrics)
    table.to_parquet(out / "study_table.parquet", index=False)
    written = []
    sections = (table1_markdown(table), paired_markdown(table), controls_markdown(table), regime_markdown(table))
    text = "\n".join((*sections, ablation_markdown(table), merge_markdown(table)))
    (out / "table1.md").write_text(text)
    verdicts = check_claims(table)
    (out / "claims.md").write_text(claims_markdown(verdicts))
    records = [v.record(first=("paper_claim", "comparison", "expected")) for v in verdicts]
    written += [out / "table1.md", out / "claims.md", write_verdicts(out / "verdicts.json", records)]

    by_method = _method_epochs(plan, per_epoch(metrics))
    written.append(fig_training_dynamics(by_method, out / FIGURES[0]))
    written.append(fig_reward_diversity(by_method, out / FIGURES[1]))
    written.append(fig_complexity_early_late(by_method, metrics, out / FIGURES[2]))
    written.append(fig_multiseed(table, out / FIGURES[3]))
    for study, name, figure_no in ABLATION_FIGURES:
        written.append(fig_ablation(table, study, out / name, figure_no))
    written.append(fig_merge_strategies(table, out / FIGURES[7]))
    if (table.study == "regime").any():
        written.append(fig_regime(table, out / REGIME_FIGURE))
    for method in METHODS:
        trials = [t for t in plan for m in t["memberships"] if m["study"] == "table1" and m["label"] == method]
        if not trials:
            continue
        trial = min(trials, key=lambda t: t["seed"])
        run_dir = out / "runs" / trial["key"]
        cells = load_config(run_dir / "config.yaml").archive.cells_per_dim
        archive = pd.read_parquet(run_dir / "archive.parquet")
        slug = METHODS[method]
        title = f"{method}, seed {trial['seed']} (member 0's archive)" if len(archive) else method
        written.append(fig_archive(archive, cells, title, out / f"archive_{slug}.png"))
    return written
