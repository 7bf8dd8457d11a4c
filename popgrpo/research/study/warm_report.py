"""Tables, verdicts and figures of the WARM study (:mod:`popgrpo.research.study.warm`) from its Parquet files.

Every claim is a paired comparison over **seeds** (the unit: one RM directory per seed and
setting, and every run of that seed trained against its RMs), judged with the shared
statistics of :mod:`popgrpo.research.study.stats`: a paired t-test Holm-corrected across every claim of
the report, TOST at the margin stated in :data:`MARGINS` before any "no difference", and a
bootstrap confidence interval of the mean difference. The single-RM arm enters each claim once
per seed, as the mean over that seed's RMs: M RMs of one seed share their data and are not
M independent replicates.

When a run is hacked is a **survival** question: many runs are never hacked within the epochs
trained (right-censored), so a mean "hacked epoch" is not defined. :func:`hacking_times` gives
each run a time and an event flag; the single-RM arm gives one per seed (the epoch by which
half of the seed's RMs are hacked, censored when fewer are). The survival statistics of
:mod:`popgrpo.research.study.stats` compare the arms: Kaplan–Meier curves, log-rank tests stratified by
seed, and the difference of restricted mean survival times (RMST: the area under the KM curve
up to the last epoch, in epochs) with a bootstrap interval over seeds. The log-rank tests are
their own Holm family.

``render_warm`` writes ``warm.md``, ``verdicts.json`` and the figures; ``popgrpo report DIR``
calls it for a directory that holds the study's Parquet files (e.g. the committed
``docs/results/warm``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from popgrpo.markdown import md_table
from popgrpo.research.study.stats import (
    ALPHA,
    CLAIM,
    HOLM,
    TOST,
    VERDICT,
    Claim,
    N,
    SurvivalTest,
    Verdict,
    effect,
    format_diff,
    format_mean_sd,
    format_p,
    holm_survival,
    judge,
    km_curve,
    km_median,
    label_column,
    rmst,
    survival_test,
    verdicts_markdown,
    write_verdicts,
)
from popgrpo.telemetry.plots import save_figure

__all__ = [
    "COLUMNS",
    "MARGINS",
    "TABLES",
    "WARM_FIGURES",
    "WarmStudyError",
    "hacking_summary",
    "hacking_times",
    "is_single",
    "judge_claims",
    "load_warm",
    "paper_status",
    "render_warm",
    "rl_table",
    "single_means",
    "survival_tests",
    "warm_claims",
]

WARM_FIGURES = ("fig3_lmc.png", "fig4_corruption.png", "fig6_bon.png", "fig8_rl.png", "fig8b_hacking_survival.png")
TABLES = ("lmc", "corruption", "bon", "rl")

# Equivalence margins, stated before the 16-seed results: the smallest difference a claim
# counts as one. Pair accuracy: 0.01 (one point; the RMs sit 0.01–0.02 below the oracle's
# ceiling on test pairs); control E[R] (best-of-N and RL): 0.01 (6% of the reference policy's
# 0.17, 5% of what GRPO on execution gains over 30 epochs); epochs: 1.
MARGINS = {"accuracy": 0.01, "control": 0.01, "epochs": 1.0}


def is_single(proxy: pd.Series) -> pd.Series:
    """Which proxies are one RM alone: ``single_<k>`` (RM k; ``single`` in older studies)."""
    return proxy.str.fullmatch(r"single(_\d+)?")


def single_means(table: pd.DataFrame) -> pd.DataFrame:
    """The single-RM runs of :func:`rl_table` reduced to one row per setting and seed: the mean
    of each measure over the RMs (M = 1 is then the typical RM, not one arbitrary draw), with
    ``n_rms`` the number of RMs averaged. When runs are hacked is left out (censored times have
    no mean): :func:`hacking_times` summarises it per seed."""
    singles = table[is_single(table["proxy"])]
    numeric = [c for c in singles.columns if c not in ("setting", "seed", "proxy", "hacked", "hacked_epoch")]
    grouped = singles.groupby(["setting", "seed"], sort=False)
    out = grouped[numeric].mean()
    out["n_rms"] = grouped.size()
    return out.reset_index().assign(proxy="single")


def rl_table(rl: pd.DataFrame, window: int) -> pd.DataFrame:
    """One row per RL run: :func:`hacking_summary` of its population-mean curve."""
    rows = []
    for (setting, seed, proxy), run in rl.groupby(["setting", "seed", "proxy"], sort=False):
        curve = run.groupby("epoch")[["reward_mean", "control_expected_reward", "control_reward_mean"]].mean()
        rows.append({"setting": setting, "seed": seed, "proxy": proxy, **hacking_summary(curve, window)})
    return pd.DataFrame(rows)


def hacking_summary(curve: pd.DataFrame, window: int, smooth: int = 3) -> dict:
    """Of one run's population-mean curve (epoch → reward_mean, control_expected_reward): the
    control's first value, its peak (a ``smooth``-epoch moving mean) and the epoch of that
    peak, whether and when it is hacked (the smoothed control falls back below its first value
    after the peak: ``hacked``, ``hacked_epoch``, NaN when it never does within the
    ``last_epoch`` observed), its mean over training, its final value (last ``window``
    epochs) and the drop from peak to end; the proxy's final value."""
    control = curve["control_expected_reward"]
    smoothed = control.rolling(smooth, min_periods=1, center=True).mean()
    final = float(control.tail(window).mean())
    peak_epoch = int(cast(int, smoothed.idxmax()))  # cast: pandas-stubs types index labels as Hashable
    below = smoothed[(smoothed.index > peak_epoch) & (smoothed < control.iloc[0])]
    return {
        "control_initial": float(control.iloc[0]),
        "control_peak": float(smoothed.max()),
        "peak_epoch": peak_epoch,
        "hacked": bool(len(below)),
        "hacked_epoch": float(below.index[0]) if len(below) else math.nan,
        "last_epoch": int(cast(int, control.index.max())),
        "control_mean": float(control.mean()),
        "control_final": final,
        "control_drop": float(smoothed.max() - final),
        "proxy_final": float(curve["reward_mean"].tail(window).mean()),
    }


# ---- paired claims ---------------------------------------------------------------------------
def warm_claims(frames: dict[str, pd.DataFrame], window: int) -> list[Claim]:
    """Each claim of WARM that the study's tables test, as a paired comparison over seeds.

    Each claim's labels: ``family`` (``paired``), ``measure`` and ``paper_claims``: ``at least
    as good`` (equivalence within the margin supports it, as a significant gain does) or
    ``better``. RL claims compare WARM M against "one RM": per seed, the mean over that seed's
    single-RM runs (:func:`single_means`). When runs are hacked is not a paired claim but a
    survival comparison (:func:`survival_tests`).
    """
    lmc, cor, bon, rl = frames["lmc"], frames["corruption"], frames["bon"], frames["rl"]
    claims: list[Claim] = []

    def add(name: str, measure: str, a: pd.Series, b: pd.Series, kind: str, at_least: bool = False) -> None:
        """The claim ``a − b`` over the seeds both series have (indexed by seed); none without any."""
        seeds = sorted(set(a.dropna().index) & set(b.dropna().index))
        if seeds:
            paper = "at least as good" if at_least else "better"
            labels = {"family": "paired", "measure": measure, "paper_claims": paper}
            a_values, b_values = [float(a[s]) for s in seeds], [float(b[s]) for s in seeds]
            claims.append(Claim.paired(name, a_values, b_values, MARGINS[kind], labels=labels))

    M = int(cor["m"].max())
    for setting in sorted(lmc["setting"].unique()):
        for subset in ("test", "shifted"):
            mid = lmc[(lmc.setting == setting) & (lmc.subset == subset) & np.isclose(lmc.lam, 0.5)]
            if mid.empty or mid["wa"].isna().all():
                continue
            by_seed = mid.set_index("seed")
            add(
                f"LMC ({setting}, {subset}): WA at λ = 0.5 is at least the diagonal",
                "acc(WA(½)) − diagonal(½)",
                by_seed["wa"],
                by_seed["diagonal"],
                "accuracy",
                at_least=True,
            )
            add(
                f"WA vs ENS ({setting}, {subset}, λ = 0.5): WA at least as accurate",
                "acc(WA(½)) − acc(ENS(½))",
                by_seed["wa"],
                by_seed["ens"],
                "accuracy",
                at_least=True,
            )
    full = cor[(cor.setting == "corrupt") & (cor.m == M)].set_index(["seed", "subset"])
    if not full.empty:
        corrupt = full.xs("train_corrupt", level="subset")
        add(
            f"Corruption (M = {M}): WA memorises corrupted labels less than ENS",
            "acc_train_corrupt(ENS) − acc_train_corrupt(WA)",
            corrupt["ens"],
            corrupt["wa"],
            "accuracy",
        )
        for subset in ("test", "shifted"):
            part = full.xs(subset, level="subset")
            if part["wa"].isna().all():
                continue
            add(
                f"Corruption (M = {M}): WA generalises at least as well as ENS ({subset})",
                f"acc_{subset}(WA) − acc_{subset}(ENS)",
                part["wa"],
                part["ens"],
                "accuracy",
                at_least=True,
            )
    n_max = int(bon["n"].max())
    for setting in sorted(bon["setting"].unique()):
        top = bon[(bon.setting == setting) & (bon.n == n_max)]
        single = top[top.proxy.str.startswith("single_")].groupby("seed")["control"].mean()
        warm = top[top.proxy == f"warm{M}"].set_index("seed")["control"]
        ens = top[top.proxy == f"ens{M}"].set_index("seed")["control"]
        for other, name in ((single, "the mean single RM"), (ens, f"ENS M = {M}")):
            add(
                f"Best-of-{n_max} ({setting}): WARM M = {M} picks better ideas than {name}",
                "control(WARM) − control(other) at the largest N",
                warm,
                other,
                "control",
            )
    table = rl_table(rl, window)
    for setting in sorted(table["setting"].unique()):
        single = single_means(table[table.setting == setting]).set_index("seed")
        part = table[(table.setting == setting) & (table.proxy == f"warm{M}")].set_index("seed")
        if single.empty or part.empty:
            continue
        k = int(single["n_rms"].max())
        one = f"one RM (mean of {k} RMs)" if k > 1 else "one RM"
        for key, what, kind in (
            ("control_peak", "reaches a higher peak control reward", "control"),
            ("control_mean", "keeps a higher control reward on average over training", "control"),
        ):
            add(
                f"RL ({setting}): GRPO against WARM M = {M} {what} than against {one}",
                f"{key}(WARM) − {key}(single)",
                part[key],
                single[key],
                kind,
            )
        add(
            f"RL ({setting}): the control peaks later against WARM M = {M} than against {one}",
            "peak epoch(WARM) − peak epoch(single)",
            part["peak_epoch"].astype(float),
            single["peak_epoch"].astype(float),
            "epochs",
        )
    return claims


def paper_status(verdict: Verdict, at_least: bool) -> str:
    """What the verdict says of WARM's claim: ``supported``, ``refuted`` or ``not shown``.

    "Better" claims are supported by a significant gain, refuted by a significant loss or by
    equivalence (no difference beyond the margin); "at least as good" claims are supported by
    a gain or by equivalence and refuted by a loss. Anything else is not shown.
    """
    if verdict.outcome == "better" or (at_least and verdict.outcome == "equivalent"):
        return "supported"
    if verdict.outcome == "worse":
        return "refuted"
    if verdict.outcome == "equivalent":
        return f"refuted (no difference beyond ±{verdict.claim.margin:g})"
    return "not shown"


def judge_claims(claims: list[Claim], alpha: float = ALPHA) -> list[Verdict]:
    """The claims judged as one Holm family (:func:`popgrpo.research.study.stats.judge`); each verdict's
    ``extra`` carries its claim's labels and :func:`paper_status`."""
    verdicts = judge(claims, alpha=alpha)
    for v in verdicts:
        v.extra["paper_claim_status"] = paper_status(v, v.extra["paper_claims"] == "at least as good")
    return verdicts


# ---- hacking as survival ---------------------------------------------------------------------
def hacking_times(table: pd.DataFrame) -> pd.DataFrame:
    """Time to hacking per seed and arm of :func:`rl_table`: ``setting, seed, arm, time, hacked, runs``.

    A run's time is its ``hacked_epoch`` (``hacked`` true) or, never hacked, the last epoch it
    was seen unhacked (``hacked`` false: right-censored there). The single-RM runs of a seed
    are one unit, arm ``single``: the epoch by which half of the seed's RMs (``ceil(k/2)`` of
    ``k``) are hacked, censored at the last epoch when fewer than half ever are.
    """
    rows = []
    for (setting, seed), part in table.groupby(["setting", "seed"], sort=False):
        singles = part[is_single(part["proxy"])]
        if not singles.empty:
            need = math.ceil(len(singles) / 2)
            times = np.sort(singles.loc[singles["hacked"], "hacked_epoch"].to_numpy(dtype=float))
            hacked = len(times) >= need
            time = float(times[need - 1]) if hacked else float(singles["last_epoch"].max())
            rows.append(
                {
                    "setting": setting,
                    "seed": seed,
                    "arm": "single",
                    "time": time,
                    "hacked": hacked,
                    "runs": len(singles),
                }
            )
        for _, run in part[~is_single(part["proxy"])].iterrows():
            hacked = bool(run["hacked"])
            time = float(run["hacked_epoch"]) if hacked else float(run["last_epoch"])
            rows.append(
                {"setting": setting, "seed": seed, "arm": run["proxy"], "time": time, "hacked": hacked, "runs": 1}
            )
    return pd.DataFrame(rows, columns=["setting", "seed", "arm", "time", "hacked", "runs"])


def survival_tests(
    times: pd.DataFrame,
    pairs: list[tuple[str, str]],
    *,
    alpha: float = ALPHA,
    n_resamples: int = 999,
    seed: int = 0,
) -> list[SurvivalTest]:
    """:func:`popgrpo.research.study.stats.survival_test` of each pair of arms in each setting, Holm across all.

    ``times`` from :func:`hacking_times`; a pair enters a setting where both arms have seeds
    in common (its units, paired by seed). The RMST differences' bootstrap draws come from one
    generator seeded ``seed``, in the order of the tests.
    """
    rng = np.random.default_rng(seed)
    tests: list[SurvivalTest] = []
    for setting in sorted(times["setting"].unique()):
        part = times[times.setting == setting]
        for a, b in pairs:
            ta, tb = (part[part.arm == arm].set_index("seed") for arm in (a, b))
            seeds = sorted(set(ta.index) & set(tb.index))
            if not seeds:
                continue
            (time_a, hacked_a), (time_b, hacked_b) = (
                (t.loc[seeds, "time"].to_numpy(float), t.loc[seeds, "hacked"].to_numpy(bool)) for t in (ta, tb)
            )
            name = f"RL ({setting}): hacked later against {a} than against {b}"
            tests.append(
                survival_test(
                    name,
                    time_a,
                    hacked_a,
                    time_b,
                    hacked_b,
                    rng=rng,
                    n_resamples=n_resamples,
                    alpha=alpha,
                    labels={"family": "survival"},
                )
            )
    return holm_survival(tests, alpha)


def _survival_pairs(times: pd.DataFrame) -> list[tuple[str, str]]:
    """The comparisons the report makes: WARM M against one RM and against ENS M = 2, and
    Pop-GRPO against WARM M, where the study has those arms."""
    arms = set(times["arm"])
    warms = [a for a in arms if a.startswith("warm")]
    if not warms:
        return []
    M = max(int(a.removeprefix("warm")) for a in warms)
    pairs = [(f"warm{M}", "single"), (f"warm{M}", "ens2"), (f"pop_warm{M}", f"warm{M}")]
    return [(a, b) for a, b in pairs if a in arms and b in arms]


# ---- figures ---------------------------------------------------------------------------------
def fig_lmc(lmc: pd.DataFrame, path: Path) -> Path:
    settings = sorted(lmc["setting"].unique())
    fig, axes = plt.subplots(len(settings), 2, figsize=(9, 3.3 * len(settings)), squeeze=False)
    for i, setting in enumerate(settings):
        for j, subset in enumerate(("test", "shifted")):
            ax = axes[i][j]
            part = (
                lmc[(lmc.setting == setting) & (lmc.subset == subset)].groupby("lam")[["wa", "ens", "diagonal"]].mean()
            )
            ax.plot(part.index, part["wa"], "o-", label="weights (WA)")
            ax.plot(part.index, part["ens"], "s--", label="predictions (ENS)")
            ax.plot(part.index, part["diagonal"], ":", color="grey", label="diagonal")
            ax.set(title=f"{setting}: {subset} pairs", xlabel="λ (RM 0 → RM 1)", ylabel="accuracy")
            ax.legend(fontsize=7)
    return save_figure(fig, path)


def fig_corruption(cor: pd.DataFrame, path: Path) -> Path:
    subsets = ("train_clean", "train_corrupt", "test", "shifted")
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.3))
    for ax, subset in zip(axes, subsets, strict=True):
        for setting, style in (("clean", "-"), ("corrupt", "--")):
            part = cor[(cor.setting == setting) & (cor.subset == subset)].groupby("m")[["wa", "ens"]].mean()
            if part.empty or part["wa"].isna().all():
                continue
            ax.plot(part.index, part["wa"], "o" + style, color="C0", label=f"WA {setting}")
            ax.plot(part.index, part["ens"], "s" + style, color="C1", label=f"ENS {setting}")
        ax.set(title=subset, xlabel="M", ylabel="accuracy")
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def fig_bon(bon: pd.DataFrame, path: Path) -> Path:
    settings = sorted(bon["setting"].unique())
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 3.6), squeeze=False)
    M = max(int(p.removeprefix("warm")) for p in bon["proxy"].unique() if p.startswith("warm"))
    for ax, setting in zip(axes[0], settings, strict=True):
        part = bon[bon.setting == setting]
        single = part[part.proxy.str.startswith("single_")].groupby("kl")["control"].mean()
        ax.plot(single.index, single.values, "k:", label="single RM (mean)")
        for name in ("ens2", f"ens{M}", *(f"warm{m}" for m in range(2, M + 1))):
            curve = part[part.proxy == name].groupby("kl")["control"].mean()
            ax.plot(curve.index, curve.values, "s--" if name.startswith("ens") else "o-", label=name, ms=3)
        ax.set(title=f"best-of-N ({setting})", xlabel="KL = log N − (N−1)/N", ylabel="control E[R] of the chosen idea")
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def fig_rl(rl: pd.DataFrame, path: Path) -> Path:
    settings = sorted(rl["setting"].unique())
    fig, axes = plt.subplots(2, len(settings), figsize=(6 * len(settings), 7), squeeze=False)
    for j, setting in enumerate(settings):
        part = rl[rl.setting == setting]
        single = is_single(part["proxy"])
        # The single RMs as one line (their mean) in a band (the lowest and highest RM, seed-averaged).
        runs = [(p, r) for p, r in part[~single].groupby("proxy", sort=False)]
        if single.any():
            k = part.loc[single, "proxy"].nunique()
            runs.insert(1, (f"single (mean of {k})", part[single]))
            per_rm = part[single].groupby(["proxy", "epoch"])["control_expected_reward"].mean().unstack("proxy")
            axes[0][j].fill_between(per_rm.index, per_rm.min(1), per_rm.max(1), color="grey", alpha=0.2, lw=0)
        for proxy, run in runs:
            curve = run.groupby("epoch")[["control_expected_reward", "reward_mean"]].mean()
            style = "k-" if proxy == "execution" else ("--" if proxy.startswith(("single", "ens")) else "-")
            axes[0][j].plot(curve.index, curve["control_expected_reward"], style, label=proxy, lw=1.2)
            if proxy != "execution":
                axes[1][j].plot(curve.index, curve["reward_mean"], style, label=proxy, lw=1.2)
        axes[0][j].set(title=f"RL ({setting}): control reward E[R]", xlabel="epoch", ylabel="control E[R] (noise-free)")
        axes[1][j].set(title=f"RL ({setting}): proxy reward trained on", xlabel="epoch", ylabel="proxy score")
        axes[0][j].legend(fontsize=7)
    return save_figure(fig, path)


def _km_arms(times: pd.DataFrame) -> list[str]:
    """The arms the KM figure and table show, in a fixed order: single, ENS, WARM, Pop-GRPO, execution."""
    arms = list(dict.fromkeys(times["arm"]))
    order = {"single": 0, "ens": 1, "warm": 2, "pop_warm": 3, "execution": 4}

    def key(arm: str) -> tuple[int, str]:
        kind = next((k for k in ("single", "pop_warm", "ens", "warm", "execution") if arm.startswith(k)), arm)
        return order.get(kind, 5), f"{arm:>12}"

    return sorted(arms, key=key)


def fig_survival(times: pd.DataFrame, path: Path) -> Path:
    """Kaplan–Meier curves of P(not yet hacked) per arm and setting; + marks censored units."""
    settings = sorted(times["setting"].unique())
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 3.8), squeeze=False)
    warms = [a for a in set(times["arm"]) if a.startswith("warm")]
    largest = max(warms, key=lambda a: int(a.removeprefix("warm"))) if warms else None
    for ax, setting in zip(axes[0], settings, strict=True):
        part = times[times.setting == setting]
        faint_labelled = False
        for arm in _km_arms(part):
            rows = part[part.arm == arm]
            t, s = km_curve(rows["time"].to_numpy(float), rows["hacked"].to_numpy(bool))
            end = float(rows["time"].max())
            t, s = np.append(t, end), np.append(s, s[-1])
            if arm.startswith("warm") and arm != largest:  # the smaller WARMs: faint, one legend entry
                label = None if faint_labelled else f"warm2…warm{int(str(largest).removeprefix('warm')) - 1}"
                faint_labelled = True
                ax.step(t, s, "-", where="post", color="grey", alpha=0.35, lw=1.0, label=label)
                continue
            label = "single (half of the seed's RMs)" if arm == "single" else arm
            style = "k-" if arm == "execution" else ("--" if arm.startswith(("single", "ens")) else "-")
            (line,) = ax.step(t, s, style, where="post", label=f"{label} (n = {len(rows)})", lw=1.6)
            censored = rows[~rows["hacked"]]
            if len(censored):
                ax.plot(censored["time"], np.full(len(censored), s[-1]), "+", color=line.get_color(), ms=8)
        ax.set(
            title=f"time to hacking ({setting}), Kaplan–Meier",
            xlabel="epoch",
            ylabel="share of seeds not yet hacked",
            ylim=(-0.03, 1.03),
        )
        ax.legend(fontsize=7)
    return save_figure(fig, path)


# ---- tables ----------------------------------------------------------------------------------
def _claims_md(verdicts: list[Verdict]) -> str:
    columns = [CLAIM, label_column("measure", "measure"), N, effect(), HOLM, TOST, VERDICT]
    return verdicts_markdown(verdicts, [*columns, label_column("WARM's claim", "paper_claim_status")])


def _km_md(times: pd.DataFrame) -> str:
    rows = []
    for setting in sorted(times["setting"].unique()):
        part = times[times.setting == setting]
        tau = float(part["time"].max())
        for arm in _km_arms(part):
            units = part[part.arm == arm]
            time, hacked = units["time"].to_numpy(float), units["hacked"].to_numpy(bool)
            median, low, high = km_median(time, hacked)
            med = "not reached" if math.isnan(median) else f"{median:g}{_median_ci(low, high)}"
            name = "single (half of the seed's RMs)" if arm == "single" else arm
            hacked_n, censored = int(hacked.sum()), int((~hacked).sum())
            rows.append([setting, name, len(units), hacked_n, censored, med, f"{rmst(time, hacked, tau):.2f}"])
    header = ["setting", "arm", "units (seeds)", "hacked", "censored", "KM median epoch [95% CI]", "RMST (epochs)"]
    return md_table(header, rows) + "\n"


def _median_ci(low: float, high: float) -> str:
    """`` [low, high]`` of a KM median: ``not reached`` for an upper bound the curve never
    reaches, ``n/a`` where statsmodels' interval is undefined (e.g. every unit hacked at once)."""
    if math.isnan(low) or math.isnan(high):
        return " [n/a]"
    return f" [{low:g}, {'not reached' if math.isinf(high) else f'{high:g}'}]"


def _survival_md(tests: list[SurvivalTest]) -> str:
    header = ["comparison", "n seeds", "seeds: later / same / earlier", "RMST a − b, epochs [95% CI]"]
    header += ["log-rank χ²", "p", "p (Holm)", "verdict"]
    rows = [
        [
            t.name,
            t.n,
            " / ".join(map(str, t.order)),
            f"{t.rmst_a:.2f} − {t.rmst_b:.2f} = {format_diff(t.diff, 2)} "
            f"[{format_diff(t.ci[0], 2)}, {format_diff(t.ci[1], 2)}]",
            "n/a" if math.isnan(t.chisq) else f"{t.chisq:.2f}",
            format_p(t.p),
            format_p(t.p_holm),
            f"**{t.outcome}**",
        ]
        for t in tests
    ]
    return md_table(header, rows) + "\n"


def _corruption_md(cor: pd.DataFrame) -> str:
    M = int(cor["m"].max())
    rows = []
    for setting in ("clean", "corrupt"):
        for subset in ("train_clean", "train_corrupt", "test", "shifted"):
            p = cor[(cor.setting == setting) & (cor.subset == subset)]
            if p.empty or p["wa"].isna().all():
                continue
            one, full = p[p.m == 1], p[p.m == M]
            rows.append(
                [
                    setting,
                    subset,
                    format_mean_sd(one["oracle"]),
                    format_mean_sd(one["wa"]),
                    format_mean_sd(full["ens"]),
                    format_mean_sd(full["wa"]),
                ]
            )
    header = ["setting", "subset", "oracle E[R]", "single RM (M = 1)", f"ENS M = {M}", f"WA M = {M}"]
    return md_table(header, rows) + "\n"


def _rl_md(table: pd.DataFrame, times: pd.DataFrame) -> str:
    """One row per proxy, mean ± sd over seeds; the single RMs as two rows: the mean over the RMs
    of each seed (± sd over seeds, the unit every claim uses) and every RM's run on its own
    (± sd over seeds × RMs: the spread between individual RMs, descriptive only). "hacked"
    counts units hacked within the epochs trained (the single-RM unit: half of a seed's RMs)."""
    rows = []

    def row(setting: str, name: str, p: pd.DataFrame, hacked: str) -> None:
        peak = f"{format_mean_sd(p['control_peak'])} ({format_mean_sd(p['peak_epoch'].astype(float))})"
        after = [
            format_mean_sd(p["control_mean"]),
            format_mean_sd(p["control_final"]),
            format_mean_sd(p["proxy_final"]),
        ]
        rows.append([setting, name, format_mean_sd(p["control_initial"]), peak, hacked, *after])

    for setting, part in table.groupby("setting", sort=False):
        single = is_single(part["proxy"])
        singles_done = False
        for proxy, p in part.groupby("proxy", sort=False):
            if not single[p.index].all():
                row(str(setting), str(proxy), p, f"{int(p['hacked'].sum())}/{len(p)} seeds")
            elif not singles_done:
                singles_done = True
                means = single_means(part)
                k = int(means["n_rms"].max())
                units = times[(times.setting == setting) & (times.arm == "single")]
                row(
                    str(setting), f"single (mean of {k} RMs)", means, f"{int(units['hacked'].sum())}/{len(units)} seeds"
                )
                if k > 1:
                    each = part[single]
                    row(
                        str(setting), f"single (each of {k} RMs)", each, f"{int(each['hacked'].sum())}/{len(each)} runs"
                    )
    header = ["setting", "proxy", "control E[R] first epoch", "control peak (epoch)", "hacked", "control mean"]
    return md_table([*header, "control final", "proxy final"], rows) + "\n"


def _bon_md(bon: pd.DataFrame) -> str:
    ns = sorted(bon["n"].unique())
    M = max(int(p.removeprefix("warm")) for p in bon["proxy"].unique() if p.startswith("warm"))
    rows = []
    for setting in sorted(bon["setting"].unique()):
        part = bon[bon.setting == setting]
        single = part[part.proxy.str.startswith("single_")].assign(proxy="single (mean)")
        for name, p in [
            ("single (mean)", single),
            *((n, part[part.proxy == n]) for n in ("ens2", f"ens{M}", "warm2", f"warm{M}")),
        ]:
            rows.append([setting, name, *(format_mean_sd(p[p.n == n].groupby("seed")["control"].mean()) for n in ns)])
    return md_table(["setting", "proxy", *(f"N={n}" for n in ns)], rows) + "\n"


def _invocations_md(invocations: list[dict]) -> list[str]:
    """What each recorded invocation of the study cost (``study.json``), as Markdown lines."""
    if not invocations:
        return []
    rows = []
    for inv in invocations:
        seeds = ", ".join(map(str, inv.get("seeds", [])))
        rows.append([inv.get("finished", "?"), seeds, inv.get("runs_trained", "?"), f"{inv['seconds']:.0f}"])
    header = ["invocation finished", "seeds", "RL runs trained", "wall seconds"]
    return [*md_table(header, rows).split("\n"), ""]


# ---- all of it -------------------------------------------------------------------------------
# The columns the report reads of each table.
COLUMNS = {
    "lmc": ("setting", "seed", "lam", "subset", "wa", "ens", "diagonal"),
    "corruption": ("setting", "seed", "m", "subset", "wa", "ens", "oracle"),
    "bon": ("setting", "seed", "proxy", "n", "kl", "control"),
    "rl": ("setting", "seed", "proxy", "epoch", "reward_mean", "control_reward_mean", "control_expected_reward"),
}


class WarmStudyError(ValueError):
    """A directory's WARM tables or study.json cannot be read as the study wrote them."""


def load_warm(out: str | Path) -> dict[str, pd.DataFrame]:
    """The study's tables (``lmc``, ``corruption``, ``bon``, ``rl``) from ``out``'s Parquet files.

    FileNotFoundError when one is missing; :class:`WarmStudyError` when one is not Parquet or
    lacks a column the report reads (:data:`COLUMNS`).
    """
    out = Path(out)
    missing = [name for name in TABLES if not (out / f"{name}.parquet").is_file()]
    if missing:
        raise FileNotFoundError(f"{out} holds no WARM study: {', '.join(f'{m}.parquet' for m in missing)} missing")
    frames = {}
    for name in TABLES:
        path = out / f"{name}.parquet"
        try:
            frames[name] = pd.read_parquet(path)
        except Exception as exc:  # pyarrow's errors for a damaged or foreign file
            raise WarmStudyError(f"{path}: not a Parquet table: {str(exc).splitlines()[0][:200]}") from None
        lacking = [c for c in COLUMNS[name] if c not in frames[name].columns]
        if lacking or frames[name].empty:
            what = f"no column {', '.join(lacking)}" if lacking else "no rows"
            raise WarmStudyError(f"{path}: not the WARM study's {name} table ({what})")
    return frames


def _recorded(out: Path) -> dict:
    """``out/study.json`` (the plan and the invocations), ``{}`` when there is none."""
    path = out / "study.json"
    if not path.is_file():
        return {}
    try:
        recorded = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise WarmStudyError(f"{path}: not JSON: {exc}") from None
    if not isinstance(recorded, dict):
        raise WarmStudyError(f"{path}: not a JSON object")
    return recorded


def render_warm(
    out: str | Path, frames: dict[str, pd.DataFrame] | None = None, study: Any = None, seconds: float | None = None
) -> list[Path]:
    """Write the figures, ``warm.md`` and ``verdicts.json`` into ``out``; return the paths.

    ``frames`` default to ``out``'s Parquet files; ``study`` (a :class:`popgrpo.research.study.warm.WarmStudy`)
    and ``seconds`` to what ``out/study.json`` recorded, so a committed study redraws as it ran.
    """
    out = Path(out)
    if frames is None:
        frames = load_warm(out)
    recorded = _recorded(out)
    window = int(study.rl_window if study is not None else recorded.get("study", {}).get("rl_window", 5))
    if seconds is None:
        seconds = recorded.get("seconds")
    written = [
        fig_lmc(frames["lmc"], out / WARM_FIGURES[0]),
        fig_corruption(frames["corruption"], out / WARM_FIGURES[1]),
        fig_bon(frames["bon"], out / WARM_FIGURES[2]),
        fig_rl(frames["rl"], out / WARM_FIGURES[3]),
    ]
    table = rl_table(frames["rl"], window)
    times = hacking_times(table)
    written.append(fig_survival(times, out / WARM_FIGURES[4]))
    verdicts = judge_claims(warm_claims(frames, window))
    tests = survival_tests(times, _survival_pairs(times))
    seeds = sorted(frames["rl"]["seed"].unique())
    M = int(frames["corruption"]["m"].max())
    text = [
        "# WARM study",
        "",
        f"{len(seeds)} seeds ({', '.join(map(str, seeds))}); M = {M}; RL {int(frames['rl']['epoch'].max()) + 1} "
        f"epochs; tables give mean ± sd over seeds"
        + (f"; this invocation {seconds:.0f} s." if seconds is not None else "."),
        "",
        *_invocations_md(recorded.get("invocations", [])),
        "## Claims",
        "",
        f"Paired over seeds; one Holm family of {len(verdicts)} claims (α = {ALPHA}); `equivalent within ±m` "
        'needs TOST at the stated margin m (popgrpo.research.study.stats). "One RM" is, per seed, the mean over its '
        "single-RM runs. WARM's claim: supported, refuted or not shown by the verdict.",
        "",
        _claims_md(verdicts),
        "## When is a run hacked (survival)",
        "",
        "Time to hacking: the first epoch after its peak where a run's smoothed control falls below its first "
        "value; runs never hacked are right-censored at their last epoch. One unit per seed and arm (single "
        "RMs: the epoch by which half of the seed's RMs are hacked). Kaplan–Meier per arm; log-rank tests "
        f"stratified by seed, Holm across the {len(tests)} tests; RMST = restricted mean survival time up to "
        'the last epoch, its difference with a bootstrap CI over seeds; "later / same / earlier" counts '
        "seeds by which arm was hacked first (same: the same epoch, or neither hacked).",
        "",
        _km_md(times),
        _survival_md(tests),
        "## Accuracies: WA vs ENS (Figs. 4–5)",
        "",
        _corruption_md(frames["corruption"]),
        "## Best-of-N: control E[R] of the chosen idea (Fig. 6)",
        "",
        _bon_md(frames["bon"]),
        "## RL: control reward of GRPO against each proxy (Figs. 1b, 8)",
        "",
        _rl_md(table, times),
    ]
    (out / "warm.md").write_text("\n".join(text))
    records = [v.record(first=("family",)) for v in verdicts] + [t.record() for t in tests]
    return [*written, out / "warm.md", write_verdicts(out / "verdicts.json", records)]
