"""The WARM study's quick form end to end (in-process), and its claim checks on made-up tables."""

import math

import pandas as pd
import pytest

from popgrpo.study.warm import QUICK, quick, run_warm_study
from popgrpo.study.warm_report import WARM_FIGURES, hacking_summary, rl_table, single_means, warm_claims


def test_quick_warm_study_writes_every_table_figure_and_claim(tmp_path):
    study = quick(QUICK, settings={"clean": 0.0, "corrupt": 0.25})
    result = run_warm_study(tmp_path, study, progress=False)
    for name in (*WARM_FIGURES, "warm.md"):
        assert (tmp_path / name).stat().st_size > 100, name
    rl = pd.read_parquet(tmp_path / "rl.parquet")
    proxies = {"execution", "single_0", "single_1", "single_2", "ens2", "warm2", "warm3"}
    assert set(rl["proxy"]) == proxies and set(rl["setting"]) == {"clean", "corrupt"}
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
    assert "## Claims" in text and ("held" in text or "mixed" in text)
    assert "single (mean of 3 RMs)" in text and "single (each of 3 RMs)" in text
    assert "than against one RM (mean of 3 RMs)" in text
    # Run again: the RM directories and runs are kept, nothing is trained twice.
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/summary.json")}
    run_warm_study(tmp_path, study, progress=False)
    assert mtimes and all(p.stat().st_mtime_ns == t for p, t in mtimes.items())
    assert result["seconds"] > 0


def test_hacking_summary_finds_the_peak_and_the_drop():
    curve = pd.DataFrame(
        {"control_expected_reward": [0.1, 0.3, 0.5, 0.4, 0.2, 0.1], "reward_mean": [0, 1, 2, 3, 4, 5]},
        index=pd.Index(range(6), name="epoch"),
    )
    s = hacking_summary(curve, window=1, smooth=1)
    assert s["peak_epoch"] == 2 and s["control_peak"] == 0.5 and s["control_mean"] == pytest.approx(1.6 / 6)
    assert s["control_final"] == pytest.approx(0.1) and s["control_drop"] == pytest.approx(0.4)
    assert s["proxy_final"] == 5 and s["control_initial"] == pytest.approx(0.1)
    assert s["hacked_epoch"] == 6  # never below 0.1 again: one past the last epoch
    assert hacking_summary(curve.assign(control_expected_reward=[0.2, 0.3, 0.1, 0, 0, 0]), 1, 1)["hacked_epoch"] == 2


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
    claims = {c["claim"]: c for c in warm_claims({"lmc": lmc, "corruption": cor, "bon": bon, "rl": rl}, window=1)}
    diag = claims["LMC (corrupt, test): WA at λ = 0.5 is at least the diagonal"]
    assert diag["value"] == pytest.approx(0.04) and diag["seeds_for"] == "2/2" and diag["verdict"] == "held"
    vs_ens = claims["WA vs ENS (corrupt, test, λ = 0.5): WA at least as accurate"]
    assert vs_ens["value"] == pytest.approx(-0.01) and vs_ens["seeds_for"] == "1/2" and not math.isnan(vs_ens["sd"])
    assert vs_ens["verdict"] == "not held"
    assert claims["Corruption (M = 2): WA memorises corrupted labels less than ENS"]["value"] == pytest.approx(0.05)
    assert claims["Best-of-4 (corrupt): WARM M = 2 picks better ideas than the mean single RM"][
        "value"
    ] == pytest.approx(0.15)
    # "One RM" is the mean over the single RMs of each measure. Smoothed (3-epoch centred) curves:
    # single_0 [0.15, 0.1, 0.05] (peak 0.15 at 0, below its start 0.2 at epoch 1, mean 0.1),
    # single_1 [0.2, 0.2, 0.2] (peak 0.2 at 0, never below: 3, mean 0.2),
    # warm2 [0.15, 0.2, 0.25] (peak 0.25 at 2, never below its start: 3, mean 0.2).
    one = "one RM (mean of 2 RMs)"
    peak = claims[f"RL (corrupt): GRPO against WARM M = 2 reaches a higher peak control reward than against {one}"]
    assert peak["value"] == pytest.approx(0.25 - 0.175) and peak["verdict"] == "held"
    average = f"RL (corrupt): GRPO against WARM M = 2 keeps a higher control reward on average over training than against {one}"
    assert claims[average]["value"] == pytest.approx(0.2 - 0.15)
    later_peak = claims[f"RL (corrupt): the control peaks later against WARM M = 2 than against {one}"]
    assert later_peak["value"] == 2 and later_peak["verdict"] == "held"
    hacked = claims[
        f"RL (corrupt): hacking is delayed — the control falls back below its start later against WARM M = 2 than against {one}"
    ]
    assert hacked["value"] == pytest.approx(3 - 2) and hacked["verdict"] == "held"
    # Against each single RM, pair by pair: control means 0.2 vs 0.1 (for) and 0.2 vs 0.2 (not), per seed.
    each = claims[
        "RL (corrupt): GRPO against WARM M = 2 keeps a higher control reward on average over training than against each single RM"
    ]
    assert each["value"] == pytest.approx(0.05) and each["seeds_for"] == "2/4" and each["verdict"] == "mixed"
    later = claims["RL (corrupt): GRPO against WARM M = 2 is hacked later than against each single RM"]
    assert later["value"] == pytest.approx(1.0) and later["seeds_for"] == "2/4"  # 3 vs 1, 3 vs 3
    table = rl_table(rl, window=1)
    means = single_means(table)
    assert list(means["n_rms"]) == [2, 2] and means["hacked_epoch"].tolist() == [2.0, 2.0]


def test_verdicts_need_most_seeds_to_agree_with_the_mean():
    from popgrpo.study.warm_report import verdict

    assert verdict(0.3, 1, 3) == "mixed"  # one seed far ahead pulls the mean: not a held claim
    assert verdict(0.3, 2, 3) == "held" and verdict(-0.1, 1, 3) == "not held" and verdict(-0.1, 2, 3) == "mixed"
    assert verdict(0.0, 3, 3, at_least=True) == "held" and verdict(0.0, 0, 3) == "not held"
