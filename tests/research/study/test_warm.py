"""The WARM study's quick form end to end (in-process), its claims and survival analysis on made-up tables."""

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from popgrpo.cli import main
from popgrpo.research.study.stats import km_curve
from popgrpo.research.study.warm import QUICK, quick, run_warm_study
from popgrpo.research.study.warm_report import (
    TABLES,
    WARM_FIGURES,
    hacking_summary,
    hacking_times,
    judge_claims,
    rl_table,
    single_means,
    survival_tests,
    warm_claims,
)


@pytest.mark.heavy
def test_quick_warm_study_writes_every_table_figure_and_claim(tmp_path, capsys):
    study = quick(QUICK, settings={"clean": 0.0, "corrupt": 0.25})
    result = run_warm_study(tmp_path, study, progress=False)
    for name in (*WARM_FIGURES, "warm.md", "verdicts.json"):
        assert (tmp_path / name).stat().st_size > 100, name
    rl = pd.read_parquet(tmp_path / "rl.parquet")
    proxies = {"execution", "single_0", "single_1", "single_2", "ens2", "warm2", "warm3"}
    assert set(rl["proxy"]) == proxies and set(rl["setting"]) == {"clean", "corrupt"}
    # one row per run and epoch: the population means of the run's metrics
    assert len(rl) == len(proxies) * 2 * QUICK.rl_epochs and (rl["members"] == 1).all()
    assert rl["control_expected_reward"].notna().all()
    trained_on_proxy = rl[rl.proxy != "execution"]
    assert (trained_on_proxy["reward_mean"] != trained_on_proxy["control_reward_mean"]).all()
    on_execution = rl[rl.proxy == "execution"]
    assert (on_execution["reward_mean"] == on_execution["control_reward_mean"]).all()
    corruption = pd.read_parquet(tmp_path / "corruption.parquet")
    assert sorted(corruption["m"].unique()) == [1, 2, 3]
    one = corruption[corruption.m == 1]
    assert one["wa"].equals(one["ens"])  # one RM: its weight average and its ensemble are itself
    lmc = pd.read_parquet(tmp_path / "lmc.parquet")
    ends = lmc[lmc.lam.isin([0.0, 1.0])].dropna()  # clean labels: no corrupted subset (NaN)
    assert len(ends) >= 6
    assert ((ends["wa"] - ends["diagonal"]).abs() < 1e-6).all() and (
        (ends["ens"] - ends["diagonal"]).abs() < 1e-6
    ).all()
    bon = pd.read_parquet(tmp_path / "bon.parquet")
    assert sorted(bon["n"].unique()) == list(QUICK.bon_ns)
    n1 = bon[bon.n == 1]  # best-of-1 is the reference policy's first idea, whatever the proxy
    assert n1.groupby("setting")["control"].nunique().eq(1).all()
    # Each single RM is its own run against RM k; against distinct RMs the proxy rewards differ.
    singles = rl[rl.proxy.str.startswith("single_")].groupby("proxy")["reward_mean"].mean()
    assert singles.nunique() == 3
    text = (tmp_path / "warm.md").read_text()
    assert "## Claims" in text and "## When is a run hacked (survival)" in text
    assert "single (mean of 3 RMs)" in text and "single (each of 3 RMs)" in text
    assert "than against one RM (mean of 3 RMs)" in text
    records = json.loads((tmp_path / "verdicts.json").read_text())
    paired = [r for r in records if r["family"] == "paired"]
    survival = [r for r in records if r["family"] == "survival"]
    assert paired and all(r["n"] == 1 and r["verdict"] == "inconclusive" for r in paired)  # one seed
    assert {r["claim"] for r in survival} == {
        f"RL ({s}): hacked later against warm3 than against {b}"
        for s in ("clean", "corrupt")
        for b in ("single", "ens2")
    }
    recorded = json.loads((tmp_path / "study.json").read_text())
    assert [i["runs_trained"] for i in recorded["invocations"]] == [len(proxies) * 2]
    # Run again: the RM directories and runs are kept, nothing is trained twice.
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/summary.json")}
    run_warm_study(tmp_path, study, progress=False)
    assert mtimes and all(p.stat().st_mtime_ns == t for p, t in mtimes.items())
    assert result["seconds"] > 0
    recorded = json.loads((tmp_path / "study.json").read_text())
    assert [i["runs_trained"] for i in recorded["invocations"]] == [len(proxies) * 2, 0]
    # `popgrpo report` redraws the tables and verdicts from the Parquet files and study.json alone.
    committed = tmp_path / "committed"
    committed.mkdir()
    for name in (*TABLES, "study"):
        suffix = ".json" if name == "study" else ".parquet"
        shutil.copy(tmp_path / f"{name}{suffix}", committed / f"{name}{suffix}")
    assert main(["report", str(committed)]) == 0
    assert (committed / "warm.md").read_text() == (tmp_path / "warm.md").read_text()
    assert (committed / "verdicts.json").read_text() == (tmp_path / "verdicts.json").read_text()
    assert all((committed / name).is_file() for name in WARM_FIGURES)
    # Bad input: exit 2 and one line naming the file.
    bon = pd.read_parquet(committed / "bon.parquet")
    for damage, says in (
        (lambda: (committed / "bon.parquet").write_bytes(b"not parquet"), "not a Parquet table"),
        (lambda: bon.drop(columns=["control"]).to_parquet(committed / "bon.parquet"), "no column control"),
        (lambda: (committed / "study.json").write_text("{"), "study.json: not JSON"),
        (lambda: (committed / "bon.parquet").unlink(), "bon.parquet missing"),
    ):
        damage()
        capsys.readouterr()
        assert main(["report", str(committed)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("popgrpo: ") and "\n" not in err and says in err, err
        bon.to_parquet(committed / "bon.parquet")
        shutil.copy(tmp_path / "study.json", committed / "study.json")
    (committed / "bon.parquet").unlink()


def test_hacking_summary_finds_the_peak_and_the_drop():
    curve = pd.DataFrame(
        {"control_expected_reward": [0.1, 0.3, 0.5, 0.4, 0.2, 0.1], "reward_mean": [0, 1, 2, 3, 4, 5]},
        index=pd.Index(range(6), name="epoch"),
    )
    s = hacking_summary(curve, window=1, smooth=1)
    assert s["peak_epoch"] == 2 and s["control_peak"] == 0.5 and s["control_mean"] == pytest.approx(1.6 / 6)
    assert s["control_final"] == pytest.approx(0.1) and s["control_drop"] == pytest.approx(0.4)
    assert s["proxy_final"] == 5 and s["control_initial"] == pytest.approx(0.1)
    # never below 0.1 again: not hacked, censored at the last epoch (no made-up hacking time)
    assert not s["hacked"] and math.isnan(s["hacked_epoch"]) and s["last_epoch"] == 5
    hacked = hacking_summary(curve.assign(control_expected_reward=[0.2, 0.3, 0.1, 0, 0, 0]), 1, 1)
    assert hacked["hacked"] and hacked["hacked_epoch"] == 2


def test_claims_compare_wa_with_ens_and_the_diagonal_per_seed():
    rows = []
    for seed, wa in ((1, 0.70), (2, 0.64)):
        for subset in ("test", "shifted"):
            rows.append(
                {
                    "setting": "corrupt",
                    "seed": seed,
                    "lam": 0.5,
                    "subset": subset,
                    "wa": wa,
                    "ens": 0.68,
                    "diagonal": 0.63,
                }
            )
    lmc = pd.DataFrame(rows)
    cor = pd.DataFrame(
        [
            {"setting": "corrupt", "seed": s, "m": 2, "subset": sub, "wa": wa, "ens": ens}
            for s in (1, 2)
            for sub, wa, ens in (
                ("train_corrupt", 0.40, 0.45),
                ("test", 0.6, 0.6),
                ("shifted", 0.6, 0.5),
                ("train_clean", 0.7, 0.7),
            )
        ]
    )
    bon = pd.DataFrame(
        [
            {"setting": "corrupt", "seed": s, "proxy": p, "n": 4, "kl": 0.64, "control": c}
            for s in (1, 2)
            for p, c in (("single_0", 0.1), ("single_1", 0.2), ("ens2", 0.2), ("warm2", 0.3))
        ]
    )
    rl = pd.DataFrame(
        [
            {
                "setting": "corrupt",
                "seed": s,
                "proxy": p,
                "epoch": e,
                "member": 0,
                "reward_mean": 1.0,
                "control_reward_mean": 0.0,
                "control_expected_reward": v,
            }
            for s in (1, 2)
            for p, curve in (
                ("single_0", [0.2, 0.1, 0.0]),
                ("single_1", [0.2, 0.2, 0.2]),
                ("warm2", [0.1, 0.2, 0.3]),
            )
            for e, v in enumerate(curve)
        ]
    )
    claims = {c.name: c for c in warm_claims({"lmc": lmc, "corruption": cor, "bon": bon, "rl": rl}, window=1)}
    diag = claims["LMC (corrupt, test): WA at λ = 0.5 is at least the diagonal"]
    assert diag.diffs == pytest.approx((0.07, 0.01)) and diag.margin == 0.01
    assert diag.labels["paper_claims"] == "at least as good"
    vs_ens = claims["WA vs ENS (corrupt, test, λ = 0.5): WA at least as accurate"]
    assert vs_ens.diffs == pytest.approx((0.02, -0.04))
    assert claims["Corruption (M = 2): WA memorises corrupted labels less than ENS"].diffs == pytest.approx(
        (0.05, 0.05)
    )
    bon_claim = claims["Best-of-4 (corrupt): WARM M = 2 picks better ideas than the mean single RM"]
    assert bon_claim.diffs == pytest.approx((0.15, 0.15)) and bon_claim.labels["paper_claims"] == "better"
    # "One RM" is the mean over the single RMs of each measure, per seed. Smoothed (3-epoch centred)
    # curves: single_0 [0.15, 0.1, 0.05] (peak 0.15 at 0, mean 0.1), single_1 [0.2, 0.2, 0.2]
    # (peak 0.2 at 0, mean 0.2), warm2 [0.15, 0.2, 0.25] (peak 0.25 at 2, mean 0.2).
    one = "one RM (mean of 2 RMs)"
    peak = claims[f"RL (corrupt): GRPO against WARM M = 2 reaches a higher peak control reward than against {one}"]
    assert peak.diffs == pytest.approx((0.25 - 0.175,) * 2)
    average = f"RL (corrupt): GRPO against WARM M = 2 keeps a higher control reward on average over training than against {one}"
    assert claims[average].diffs == pytest.approx((0.2 - 0.15,) * 2)
    later_peak = claims[f"RL (corrupt): the control peaks later against WARM M = 2 than against {one}"]
    assert later_peak.diffs == (2.0, 2.0) and later_peak.margin == 1.0
    # No paired "hacked epoch" claim (censored times have no mean) and no claim over seed × RM pairs.
    assert not any("hack" in name or "each single RM" in name for name in claims)
    verdicts = {v.claim.name: v for v in judge_claims(list(claims.values()))}
    # every difference the same positive value: t = inf, p 0, significant after Holm
    assert verdicts[later_peak.name].outcome == "better"
    assert verdicts[later_peak.name].extra["paper_claim_status"] == "supported"
    # two seeds that disagree in sign: not significant, and TOST cannot bound it: not shown
    assert verdicts[vs_ens.name].outcome == "inconclusive"
    assert verdicts[vs_ens.name].extra["paper_claim_status"] == "not shown"
    table = rl_table(rl, window=1)
    means = single_means(table)
    assert list(means["n_rms"]) == [2, 2] and "hacked_epoch" not in means
    times = hacking_times(table).set_index(["seed", "arm"])
    # single_0 hacked at epoch 1, single_1 never: half of the 2 RMs (1) hacked at epoch 1
    assert times.loc[(1, "single"), "time"] == 1 and times.loc[(1, "single"), "hacked"]
    assert times.loc[(1, "single"), "runs"] == 2
    # warm2 never hacked: censored at its last epoch (2), not capped at a made-up time
    assert times.loc[(1, "warm2"), "time"] == 2 and not times.loc[(1, "warm2"), "hacked"]


def _times(arms: dict[str, list[tuple[float, bool]]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"setting": "clean", "seed": seed, "arm": arm, "time": t, "hacked": h, "runs": 1}
            for arm, units in arms.items()
            for seed, (t, h) in enumerate(units)
        ]
    )


def test_single_arm_is_one_unit_per_seed_hacked_when_half_its_rms_are():
    rows = []
    for seed, hacked_epochs in ((1, [3.0, 5.0, math.nan, 7.0]), (2, [4.0, math.nan, math.nan, math.nan])):
        for k, e in enumerate(hacked_epochs):
            rows.append(
                {
                    "setting": "clean",
                    "seed": seed,
                    "proxy": f"single_{k}",
                    "hacked": not math.isnan(e),
                    "hacked_epoch": e,
                    "last_epoch": 29,
                }
            )
    times = hacking_times(pd.DataFrame(rows)).set_index("seed")
    assert len(times) == 2 and (times["arm"] == "single").all() and (times["runs"] == 4).all()
    assert times.loc[1, "time"] == 5 and times.loc[1, "hacked"]  # 2 of 4 hacked by epoch 5
    assert times.loc[2, "time"] == 29 and not times.loc[2, "hacked"]  # 1 of 4 ever: censored at 29


def test_kaplan_meier_and_rmst_match_hand_computed_values():
    # times 2 (event), 3 (censored), 4 (event), 6 (censored): S = 1 → 3/4 at 2 → 3/4·(1 − 1/2) = 3/8 at 4
    t, s = km_curve(np.array([2.0, 3.0, 4.0, 6.0]), np.array([True, False, True, False]))
    assert t.tolist() == [0.0, 2.0, 4.0] and s == pytest.approx([1.0, 0.75, 0.375])
    # RMST up to 6: 2·1 + 2·0.75 + 2·0.375
    tests = survival_tests(
        _times({"a": [(2, True), (3, False), (4, True), (6, False)], "b": [(1, True)] * 4}), [("a", "b")]
    )
    assert tests[0].rmst_a == pytest.approx(2 + 1.5 + 0.75) and tests[0].rmst_b == pytest.approx(1.0)


def test_log_rank_finds_later_hacking_and_not_a_tie():
    never = [(29.0, False)] * 10
    early = [(float(5 + i % 3), True) for i in range(10)]
    tests = survival_tests(
        _times({"warm6": never, "single": early, "ens2": early[::-1]}), [("warm6", "single"), ("ens2", "single")]
    )
    later, tie = tests
    assert later.outcome == "later" and later.p_holm < 0.01 and later.diff > 20 and later.ci[0] > 0
    assert later.order == (10, 0, 0)  # never hacked: later than every seed's hacking
    assert tie.order == (3, 4, 3)  # early[::-1] against early: 5 = 5 four times, 7 vs 6 and 6 vs 7 three times each
    # the same times in other seeds: same KM curve, no difference
    assert tie.outcome == "inconclusive" and tie.diff == pytest.approx(0) and tie.p_holm > 0.5
    # Holm across the family: the adjusted p is at least the raw one
    assert later.p_holm >= later.p and later.record()["family"] == "survival"
    # earlier: the same comparison the other way round
    (earlier,) = survival_tests(_times({"single": early, "warm6": never}), [("single", "warm6")])
    assert earlier.outcome == "earlier"
    # nothing ever hacked: no test, no verdict
    (none,) = survival_tests(_times({"warm6": never, "single": never}), [("warm6", "single")])
    assert math.isnan(none.p) and none.outcome == "inconclusive"
