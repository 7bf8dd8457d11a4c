"""`popgrpo reproduce --study lm --quick` end to end on the tiny causal LM, and its plan."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from popgrpo.study.lm import CONTROL, FULL, LM_METHODS, QUICK, build_lm_plan
from popgrpo.study.lm_report import FIGURES
from tests.services import ray_subprocess_env


def test_the_plan_is_every_method_on_every_seed_beside_a_control_that_does_not_learn(tiny_lm):
    trials = build_lm_plan(FULL, str(tiny_lm))
    assert len(FULL.seeds) >= 3
    assert len(trials) == len(LM_METHODS) * len(FULL.seeds) == len({t.key for t in trials})
    configs = {(t.memberships[0].label, t.seed): t.config() for t in trials}
    for seed in FULL.seeds:
        control, grpo = configs[(CONTROL, seed)], configs[("GRPO", seed)]
        assert control.grpo.lr == 1e-12 and grpo.grpo.lr == FULL_LR
        # The control differs from GRPO by its step size only.
        assert control.model_copy(update={"grpo": grpo.grpo}) == grpo
        assert configs[("Pop-GRPO", seed)].population.size == 2 and configs[("Pop-GRPO", seed)].scheduler.enabled
        combined = configs[("Combined (§7)", seed)]
        assert combined.qd.enabled and combined.maxent.entropy.enabled and combined.population.size == 2
        assert configs[("QD-GRPO", seed)].qd.enabled and configs[("MaxEnt-GRPO", seed)].maxent.novelty.enabled
        assert all(c.policy.causal_lm.model == str(tiny_lm) for c in configs.values())


FULL_LR = float(next(o for o in FULL.regime if o.startswith("grpo.lr=")).partition("=")[2])


@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.requires("sandbox")  # the program task executes every completion
@pytest.mark.slow  # 12 LM trials on Tune: make test-slow (docs/reference/tests.md)
def test_quick_lm_study_writes_tables_figures_and_claims_that_agree_with_its_metrics(tiny_lm, tmp_path):
    out = tmp_path / "lm-study"
    env = ray_subprocess_env("pglm-")
    cmd = [sys.executable, "-m", "popgrpo", "reproduce", "--study", "lm", "--quick", "--model", str(tiny_lm)]
    try:
        done = subprocess.run(
            [*cmd, "--out", str(out), "--num-cpus", "2", "--verbose", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=560,  # under pytest-timeout's 600 s: about 95 s at load 6-9, over 300 s at load 10+
        )
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    n_trials = len(LM_METHODS) * len(QUICK.seeds)
    assert f"{n_trials} trials in" in done.stdout
    for name in ("lm.md", "lm_table.csv", "lm_claims.json", *FIGURES):
        assert (out / name).stat().st_size > 0, name

    metrics = pd.read_parquet(out / "metrics.parquet")
    assert len(metrics) == sum(2 if "Pop" in m or "Combined" in m else 1 for m in LM_METHODS) * 2 * QUICK.epochs
    # The new columns: the program task says why every program scored what it did, so success is known.
    assert metrics["success"].between(0, 1).all() and metrics["distinct"].between(0, 1).all()
    assert (metrics["distinct"] > 0).all()
    plan = json.loads((out / "plan.json").read_text())
    label = {t["key"]: t["memberships"][0]["label"] for t in plan["trials"]}
    control_kl = metrics[metrics.trial.map(label) == CONTROL]["kl"]
    assert control_kl.abs().max() < 1e-6  # the control's weights did not move

    # The table is the metrics' last-window means, members averaged per epoch.
    table = pd.read_csv(out / "lm_table.csv")
    assert len(table) == n_trials and set(table.method) == set(LM_METHODS)
    for _, row in table.iterrows():
        trial = next(k for k, v in label.items() if v == row.method and f"-s{row.seed}-" in k)
        rows = metrics[metrics.trial == trial].groupby("epoch").mean(numeric_only=True)
        for col in ("reward_mean", "diversity", "distinct", "complexity", "success"):
            expected = rows[col].tail(QUICK.window).mean()
            assert row[col] == pytest.approx(expected, nan_ok=True), (row.method, col)

    # Each claim's difference is the mean over seeds of the table's paired differences.
    claims = json.loads((out / "lm_claims.json").read_text())
    assert len(claims) == 5 + 5 * 4
    for claim in claims:
        a = table[table.method == claim["a"]].set_index("seed")[claim["metric"]]
        b = table[table.method == claim["b"]].set_index("seed")[claim["metric"]]
        assert claim["diff_mean"] == pytest.approx(float(np.mean(a - b)), abs=1e-9, nan_ok=True)
        assert claim["n"] == len(QUICK.seeds)
    text = (out / "lm.md").read_text()
    assert all(f"| {m} |" in text for m in LM_METHODS)
    assert all(c["claim"] in text for c in claims)

    # `popgrpo report` re-renders an lm study from its Parquet files.
    again = subprocess.run(
        [sys.executable, "-m", "popgrpo", "report", str(out)], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and "lm.md" in again.stdout, again.stderr[-2000:]


def test_a_model_that_is_not_there_is_one_line_and_exit_2(tmp_path):
    args = ["--model", str(tmp_path / "none"), "--out", str(tmp_path / "o")]
    done = subprocess.run(
        [sys.executable, "-m", "popgrpo", "reproduce", "--study", "lm", "--quick", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "not a saved causal LM" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()  # refused before anything was written
