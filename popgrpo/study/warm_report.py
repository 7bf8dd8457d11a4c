"""Tables, claims and figures of the WARM study (:mod:`popgrpo.study.warm`) from its Parquet files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from popgrpo.telemetry.plots import save_figure

__all__ = ["WARM_FIGURES", "hacking_summary", "is_single", "render_warm", "rl_table", "single_means", "warm_claims"]

WARM_FIGURES = ("fig3_lmc.png", "fig4_corruption.png", "fig6_bon.png", "fig8_rl.png")


def _ms(values: pd.Series) -> str:
    """``mean ± sd (n)`` over seeds; the sd is left out with one seed."""
    values = values.dropna()
    if values.empty:
        return "–"
    if len(values) == 1:
        return f"{values.iloc[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}"


def is_single(proxy: pd.Series) -> pd.Series:
    """Which proxies are one RM alone: ``single_<k>`` (RM k; ``single`` in older studies)."""
    return proxy.str.fullmatch(r"single(_\d+)?")


def single_means(table: pd.DataFrame) -> pd.DataFrame:
    """The single-RM runs of :func:`rl_table` reduced to one row per setting and seed: the mean
    of each measure over the RMs (M = 1 is then the typical RM, not one arbitrary draw), with
    ``n_rms`` the number of RMs averaged."""
    singles = table[is_single(table["proxy"])]
    numeric = [c for c in singles.columns if c not in ("setting", "seed", "proxy")]
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
    peak, the epoch it is hacked (falls back below its first value), its mean over training,
    its final value (last ``window`` epochs) and the drop from peak to end; the proxy's final value."""
    control = curve["control_expected_reward"]
    smoothed = control.rolling(smooth, min_periods=1, center=True).mean()
    final = float(control.tail(window).mean())
    peak_epoch = int(cast(int, smoothed.idxmax()))  # cast: pandas-stubs types index labels as Hashable
    below = smoothed[(smoothed.index > peak_epoch) & (smoothed < control.iloc[0])]
    return {
        "control_initial": float(control.iloc[0]),
        "control_peak": float(smoothed.max()),
        "peak_epoch": peak_epoch,
        # hacked: the first epoch after the peak where the control falls below where it started
        # (the run's last epoch + 1 when it never does)
        "hacked_epoch": int(below.index[0]) if len(below) else int(control.index.max()) + 1,
        "control_mean": float(control.mean()),
        "control_final": final,
        "control_drop": float(smoothed.max() - final),
        "proxy_final": float(curve["reward_mean"].tail(window).mean()),
    }


def _diff_claim(a: pd.Series, b: pd.Series, at_least: bool = False) -> tuple[float, float, int, int]:
    """Mean and sd over seeds of a − b (paired by seed), and how many seeds are in favour of the
    claim: a > b, or a ≥ b for an "at least" claim."""
    d = (a - b).dropna()
    sd = float(d.std(ddof=1)) if len(d) > 1 else math.nan
    wins = (d >= 0) if at_least else (d > 0)
    return float(d.mean()) if len(d) else math.nan, sd, int(wins.sum()), len(d)


def verdict(mean: float, wins: int, n: int, at_least: bool = False) -> str:
    """``held`` when the mean difference points the claimed way and more than half the seeds
    agree; ``not held`` when the mean points the other way and at most half agree; ``mixed``
    otherwise (the seeds disagree with their mean)."""
    right_way = mean >= 0 if at_least else mean > 0
    if right_way and 2 * wins > n:
        return "held"
    if not right_way and 2 * wins <= n:
        return "not held"
    return "mixed"


def warm_claims(frames: dict[str, pd.DataFrame], window: int) -> list[dict]:
    """Each claim of WARM with the numbers that test it here and a verdict (held / not held)."""
    lmc, cor, bon, rl = frames["lmc"], frames["corruption"], frames["bon"], frames["rl"]
    claims = []
    M = int(cor["m"].max())
    for setting in sorted(lmc["setting"].unique()):
        for subset in ("test", "shifted"):
            mid = lmc[(lmc.setting == setting) & (lmc.subset == subset) & np.isclose(lmc.lam, 0.5)]
            if mid.empty or mid["wa"].isna().all():
                continue
            mean, sd, wins, n = _diff_claim(
                mid.set_index("seed")["wa"], mid.set_index("seed")["diagonal"], at_least=True
            )
            claims.append(
                {
                    "claim": f"LMC ({setting}, {subset}): WA at λ = 0.5 is at least the diagonal",
                    "measure": "acc(WA(½)) − diagonal(½)",
                    "value": mean,
                    "sd": sd,
                    "seeds_for": f"{wins}/{n}",
                    "verdict": verdict(mean, wins, n, at_least=True),
                }
            )
            mean, sd, wins, n = _diff_claim(mid.set_index("seed")["wa"], mid.set_index("seed")["ens"], at_least=True)
            claims.append(
                {
                    "claim": f"WA vs ENS ({setting}, {subset}, λ = 0.5): WA at least as accurate",
                    "measure": "acc(WA(½)) − acc(ENS(½))",
                    "value": mean,
                    "sd": sd,
                    "seeds_for": f"{wins}/{n}",
                    "verdict": verdict(mean, wins, n, at_least=True),
                }
            )
    full = cor[(cor.setting == "corrupt") & (cor.m == M)].set_index(["seed", "subset"])
    if not full.empty:
        corrupt = full.xs("train_corrupt", level="subset")
        mean, sd, wins, n = _diff_claim(corrupt["ens"], corrupt["wa"])
        claims.append(
            {
                "claim": f"Corruption (M = {M}): WA memorises corrupted labels less than ENS",
                "measure": "acc_train_corrupt(ENS) − acc_train_corrupt(WA)",
                "value": mean,
                "sd": sd,
                "seeds_for": f"{wins}/{n}",
                "verdict": verdict(mean, wins, n),
            }
        )
        for subset in ("test", "shifted"):
            part = full.xs(subset, level="subset")
            if part["wa"].isna().all():
                continue
            mean, sd, wins, n = _diff_claim(part["wa"], part["ens"], at_least=True)
            claims.append(
                {
                    "claim": f"Corruption (M = {M}): WA generalises at least as well as ENS ({subset})",
                    "measure": f"acc_{subset}(WA) − acc_{subset}(ENS)",
                    "value": mean,
                    "sd": sd,
                    "seeds_for": f"{wins}/{n}",
                    "verdict": verdict(mean, wins, n, at_least=True),
                }
            )
    n_max = int(bon["n"].max())
    for setting in sorted(bon["setting"].unique()):
        top = bon[(bon.setting == setting) & (bon.n == n_max)]
        single = top[top.proxy.str.startswith("single_")].groupby("seed")["control"].mean()
        warm = top[top.proxy == f"warm{M}"].set_index("seed")["control"]
        ens = top[top.proxy == f"ens{M}"].set_index("seed")["control"]
        for other, name in ((single, "the mean single RM"), (ens, f"ENS M = {M}")):
            mean, sd, wins, n = _diff_claim(warm, other)
            claims.append(
                {
                    "claim": f"Best-of-{n_max} ({setting}): WARM M = {M} picks better ideas than {name}",
                    "measure": "control(WARM) − control(other) at the largest N",
                    "value": mean,
                    "sd": sd,
                    "seeds_for": f"{wins}/{n}",
                    "verdict": verdict(mean, wins, n),
                }
            )
    table = rl_table(rl, window)
    for setting in sorted(table["setting"].unique()):
        singles = single_means(table[table.setting == setting])
        part = table[table.setting == setting].set_index(["seed", "proxy"])
        single = singles.set_index("seed")
        if single.empty:
            continue
        k = int(single["n_rms"].max())
        one = f"one RM (mean of {k} RMs)" if k > 1 else "one RM"
        warm = part.xs(f"warm{M}", level="proxy") if f"warm{M}" in part.index.get_level_values("proxy") else None
        if warm is None:
            continue
        for key, what in (
            ("control_peak", "reaches a higher peak control reward"),
            ("control_mean", "keeps a higher control reward on average over training"),
        ):
            mean, sd, wins, n = _diff_claim(warm[key], single[key])
            claims.append(
                {
                    "claim": f"RL ({setting}): GRPO against WARM M = {M} {what} than against {one}",
                    "measure": f"{key}(WARM) − {key}(single)",
                    "value": mean,
                    "sd": sd,
                    "seeds_for": f"{wins}/{n}",
                    "verdict": verdict(mean, wins, n),
                }
            )
        mean, sd, wins, n = _diff_claim(warm["hacked_epoch"].astype(float), single["hacked_epoch"].astype(float))
        claims.append(
            {
                "claim": f"RL ({setting}): hacking is delayed — the control falls back below its start later against WARM M = {M} than against {one}",
                "measure": "hacked epoch(WARM) − hacked epoch(single)",
                "value": mean,
                "sd": sd,
                "seeds_for": f"{wins}/{n}",
                "verdict": verdict(mean, wins, n),
            }
        )
        mean, sd, wins, n = _diff_claim(warm["peak_epoch"].astype(float), single["peak_epoch"].astype(float))
        claims.append(
            {
                "claim": f"RL ({setting}): the control peaks later against WARM M = {M} than against {one}",
                "measure": "peak epoch(WARM) − peak epoch(single)",
                "value": mean,
                "sd": sd,
                "seeds_for": f"{wins}/{n}",
                "verdict": verdict(mean, wins, n),
            }
        )
        if k > 1:
            claims += _each_single_claims(table[table.setting == setting], warm, setting, M)
    return claims


def _each_single_claims(part: pd.DataFrame, warm: pd.DataFrame, setting: str, M: int) -> list[dict]:
    """WARM against every single RM's run of the same seed: the mean difference over the
    seed × RM pairs and how many pairs favour WARM (a few RMs that happen to be good proxies pull
    the mean over RMs, not the count)."""
    each = part[is_single(part["proxy"])].set_index("seed")
    out = []
    for key, what in (
        ("control_mean", "keeps a higher control reward on average over training"),
        ("hacked_epoch", "is hacked later"),
    ):
        d = (warm[key].reindex(each.index).astype(float) - each[key].astype(float)).dropna()
        mean = float(d.mean())
        wins, n = int((d > 0).sum()), len(d)
        out.append(
            {
                "claim": f"RL ({setting}): GRPO against WARM M = {M} {what} than against each single RM",
                "measure": f"{key}(WARM) − {key}(RM k), over seed × RM pairs (count: pairs in favour)",
                "value": mean,
                "sd": float(d.std(ddof=1)) if n > 1 else math.nan,
                "seeds_for": f"{wins}/{n}",
                "verdict": verdict(mean, wins, n),
            }
        )
    return out


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


def _claims_md(claims: list[dict]) -> str:
    lines = [
        "| claim | measure | value (mean ± sd over seeds) | seeds in favour | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in claims:
        sd = "" if math.isnan(c["sd"]) else f" ± {c['sd']:.3f}"
        lines.append(f"| {c['claim']} | {c['measure']} | {c['value']:+.3f}{sd} | {c['seeds_for']} | {c['verdict']} |")
    return "\n".join(lines) + "\n"


def _corruption_md(cor: pd.DataFrame) -> str:
    M = int(cor["m"].max())
    lines = [
        f"| setting | subset | oracle E[R] | single RM (M = 1) | ENS M = {M} | WA M = {M} |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for setting in ("clean", "corrupt"):
        for subset in ("train_clean", "train_corrupt", "test", "shifted"):
            p = cor[(cor.setting == setting) & (cor.subset == subset)]
            if p.empty or p["wa"].isna().all():
                continue
            lines.append(
                f"| {setting} | {subset} | {_ms(p[p.m == 1]['oracle'])} | {_ms(p[p.m == 1]['wa'])} "
                f"| {_ms(p[p.m == M]['ens'])} | {_ms(p[p.m == M]['wa'])} |"
            )
    return "\n".join(lines) + "\n"


def _rl_md(table: pd.DataFrame) -> str:
    """One row per proxy, mean ± sd over seeds; the single RMs as two rows: the mean over the RMs
    of each seed (± sd over seeds, comparable with the other rows) and every RM's run on its own
    (± sd over seeds × RMs: the spread between individual RMs)."""
    lines = [
        "| setting | proxy | control E[R] first epoch | control peak (epoch) | hacked epoch | control mean | control final | proxy final |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(setting, name, p):
        lines.append(
            f"| {setting} | {name} | {_ms(p['control_initial'])} | {_ms(p['control_peak'])} ({_ms(p['peak_epoch'].astype(float))}) "
            f"| {_ms(p['hacked_epoch'].astype(float))} | {_ms(p['control_mean'])} | {_ms(p['control_final'])} | {_ms(p['proxy_final'])} |"
        )

    for setting, part in table.groupby("setting", sort=False):
        single = is_single(part["proxy"])
        singles_done = False
        for proxy, p in part.groupby("proxy", sort=False):
            if not single[p.index].all():
                row(setting, proxy, p)
            elif not singles_done:
                singles_done = True
                means = single_means(part)
                k = int(means["n_rms"].max())
                row(setting, f"single (mean of {k} RMs)", means)
                if k > 1:
                    row(setting, f"single (each of {k} RMs)", part[single])
    return "\n".join(lines) + "\n"


def _bon_md(bon: pd.DataFrame) -> str:
    ns = sorted(bon["n"].unique())
    M = max(int(p.removeprefix("warm")) for p in bon["proxy"].unique() if p.startswith("warm"))
    lines = ["| setting | proxy | " + " | ".join(f"N={n}" for n in ns) + " |", "| --- | --- |" + " --- |" * len(ns)]
    for setting in sorted(bon["setting"].unique()):
        part = bon[bon.setting == setting]
        single = part[part.proxy.str.startswith("single_")].assign(proxy="single (mean)")
        for name, p in [
            ("single (mean)", single),
            *((n, part[part.proxy == n]) for n in ("ens2", f"ens{M}", "warm2", f"warm{M}")),
        ]:
            cells = [_ms(p[p.n == n].groupby("seed")["control"].mean()) for n in ns]
            lines.append(f"| {setting} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_warm(out: str | Path, frames: dict[str, pd.DataFrame] | None, study, seconds: float | None) -> list[Path]:
    """Write the figures and ``warm.md`` (tables and claims) into ``out``; return the paths."""
    out = Path(out)
    if frames is None:
        frames = {n: pd.read_parquet(out / f"{n}.parquet") for n in ("lmc", "corruption", "bon", "rl")}
    written = [
        fig_lmc(frames["lmc"], out / WARM_FIGURES[0]),
        fig_corruption(frames["corruption"], out / WARM_FIGURES[1]),
        fig_bon(frames["bon"], out / WARM_FIGURES[2]),
        fig_rl(frames["rl"], out / WARM_FIGURES[3]),
    ]
    window = study.rl_window
    claims = warm_claims(frames, window)
    seeds = sorted(frames["rl"]["seed"].unique())
    text = [
        "# WARM study",
        "",
        f"Seeds {', '.join(map(str, seeds))}; M = {int(frames['corruption']['m'].max())}; "
        f"RL {int(frames['rl']['epoch'].max()) + 1} epochs; numbers are mean ± sd over seeds"
        + (f"; {seconds:.0f} s." if seconds is not None else "."),
        "",
        "## Claims",
        "",
        _claims_md(claims),
        "## Accuracies: WA vs ENS (Figs. 4–5)",
        "",
        _corruption_md(frames["corruption"]),
        "## Best-of-N: control E[R] of the chosen idea (Fig. 6)",
        "",
        _bon_md(frames["bon"]),
        "## RL: control reward of GRPO against each proxy (Figs. 1b, 8)",
        "",
        _rl_md(rl_table(frames["rl"], window)),
    ]
    (out / "warm.md").write_text("\n".join(text))
    return [*written, out / "warm.md"]
