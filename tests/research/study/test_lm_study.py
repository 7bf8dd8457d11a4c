"""`popgrpo reproduce --study lm --quick` end to end on the tiny causal LM, and its plan."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from popgrpo.research.study.lm import BEST_OF_K, CONTROL, FULL, LM_METHODS, QUICK, build_lm_plan
from popgrpo.research.study.lm_report import (
    BEST_OF_K_CLAIMS,
    FIGURES,
    METRICS,
    best_member_table,
    best_of_k_claims,
    compute_per_member,
    render_lm,
)
from popgrpo.research.study.stats import holm
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


@pytest.mark.parametrize("study", [FULL, QUICK], ids=["full", "quick"])
def test_the_best_of_k_arm_is_pop_grpo_without_its_scheduler_on_the_same_seeds_and_compute(study):
    trials = build_lm_plan(study, "/models/program-lm")
    by_arm = {
        arm: {t.seed: t for t in trials if t.memberships[0].label == arm} for arm in ("Pop-GRPO", BEST_OF_K, "GRPO")
    }
    assert set(by_arm[BEST_OF_K]) == set(by_arm["Pop-GRPO"]) == set(study.seeds)
    for seed in study.seeds:
        pop, bok = by_arm["Pop-GRPO"][seed], by_arm[BEST_OF_K][seed]
        pop_config, bok_config = pop.config(), bok.config()
        assert bok_config.population.size == pop_config.population.size == 2 and not bok_config.scheduler.enabled
        # The resolved configs differ in the scheduler switch only: same K, seed, samples, updates, step size.
        assert bok_config.model_copy(update={"scheduler": pop_config.scheduler}) == pop_config
        assert bok.key != pop.key
        pop_compute, bok_compute = compute_per_member(pop.to_json()), compute_per_member(bok.to_json())
        assert pop_compute == bok_compute
        # Per member, the same programs and updates as one GRPO run: the arm is K GRPO runs.
        assert compute_per_member(by_arm["GRPO"][seed].to_json()) == {**bok_compute, "members": 1}
    pop_compute = compute_per_member(by_arm["Pop-GRPO"][study.seeds[0]].to_json())
    size = dict(o.split("=", 1) for o in study.regime)
    expected_steps = study.epochs * int(size["grpo.steps_per_epoch"])
    assert pop_compute["updates"] == expected_steps  # one update per batch (the preset's)
    programs_per_step = int(size["policy.causal_lm.prompts_per_step"]) * int(size["grpo.group_size"])
    assert pop_compute["programs"] == expected_steps * programs_per_step


def _synthetic_study(tmp_path, seeds=(42, 142, 242)):
    """plan.json and metrics.parquet of a full-size plan with made-up per-member numbers, 4 epochs:
    member 1 of a population has the higher mean reward on even seeds, member 0 on odd ones."""
    trials = [t.to_json() for t in build_lm_plan(FULL, "/models/program-lm", seeds)]
    rng = np.random.default_rng(0)
    rows = []
    for t in trials:
        members = compute_per_member(t)["members"]
        for member in range(members):
            for epoch in range(4):
                row = {"trial": t["key"], "seed": t["seed"], "epoch": epoch, "member": member}
                row.update({col: float(rng.random()) for col in METRICS})
                row.update({f"complexity_p{q}": 40.0 + q / 10 for q in (10, 50, 90)})
                if members == 2:
                    lead = member == (t["seed"] // 2) % 2  # which member leads on mean reward
                    row["reward_mean"] = (0.7 + 0.1 * epoch if lead else 0.2) + 0.01 * rng.random()
                    if t["memberships"][0]["label"] == "Pop-GRPO":
                        row["diversity"] += 0.5  # Pop-GRPO's members keep more diversity
                rows.append(row)
    plan = {"study": "lm", "quick": False, "epochs": 4, "window": 2, "model": "/models/program-lm", "trials": trials}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    metrics = pd.DataFrame(rows)
    metrics.to_parquet(tmp_path / "metrics.parquet", index=False)
    return plan, metrics


def test_each_population_arm_is_scored_by_its_best_member_by_mean_reward(tmp_path):
    plan, metrics = _synthetic_study(tmp_path)
    best = best_member_table(plan, metrics, window=2)
    assert sorted(best.method.unique()) == sorted(["Pop-GRPO", BEST_OF_K])
    assert len(best) == 2 * 3 and (best.members == 2).all()
    label = {t["key"]: t["memberships"][0]["label"] for t in plan["trials"]}
    for _, row in best.iterrows():
        assert row.member == (row.seed // 2) % 2
        trial = next(k for k, v in label.items() if v == row.method and f"-s{row.seed}-" in k)
        member = metrics[(metrics.trial == trial) & (metrics.member == row.member) & (metrics.epoch >= 2)]
        for col in METRICS:  # every metric is the chosen member's mean over the last 2 epochs
            assert row[col] == pytest.approx(member[col].mean())


def test_best_of_k_claims_are_their_own_family_on_the_best_members_paired_by_seed(tmp_path):
    plan, metrics = _synthetic_study(tmp_path)
    best = best_member_table(plan, metrics, window=2)
    claims = best_of_k_claims(best)
    assert [c["metric"] for c in claims] == list(BEST_OF_K_CLAIMS)
    for c in claims:
        pop = best[best.method == "Pop-GRPO"].set_index("seed")[c["metric"]]
        bok = best[best.method == BEST_OF_K].set_index("seed")[c["metric"]]
        assert (c["a"], c["b"], c["n"]) == ("Pop-GRPO", BEST_OF_K, 3)
        assert c["diff_mean"] == pytest.approx(float((pop - bok).mean()))
        assert c["wins"] == int(((pop - bok) > 0).sum())
    # Holm across these five claims only, not the 25 of the rest of the report.
    assert [c["p_holm"] for c in claims] == pytest.approx(holm([c["p"] for c in claims])[0])
    diversity = next(c for c in claims if c["metric"] == "diversity")
    assert diversity["diff_mean"] > 0.4 and diversity["wins"] == 3


def test_the_report_writes_the_best_of_k_section_from_the_metrics(tmp_path):
    _synthetic_study(tmp_path)
    written = render_lm(tmp_path)
    assert {p.name for p in written} >= {"lm.md", "lm_best_members.csv", "lm_best_of_k_claims.json", *FIGURES}
    text = (tmp_path / "lm.md").read_text()
    section = text.split("## Pop-GRPO against the best of K")[1].split("## Cost")[0]
    # What each arm trains on, from the trials' configs: the same for both (FULL: 8 epochs of 4 steps of 16).
    for arm in ("Pop-GRPO", BEST_OF_K):
        assert f"| {arm} | 2 | 8 | 512 | 32 | 42, 142, 242 |" in section
    claims = json.loads((tmp_path / "lm_best_of_k_claims.json").read_text())
    assert len(claims) == len(BEST_OF_K_CLAIMS) and all(c["claim"] in section for c in claims)
    assert "5 claims, Holm across them only" in section and "post hoc" in section
    best = pd.read_csv(tmp_path / "lm_best_members.csv")
    assert set(best.method) == {"Pop-GRPO", BEST_OF_K}
    # The main claims are unchanged in number: the best-of-K arm is not one of GRPO's remedies.
    assert len(json.loads((tmp_path / "lm_claims.json").read_text())) == 5 + 5 * 4


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
    plan = json.loads((out / "plan.json").read_text())
    members = sum(compute_per_member(t)["members"] for t in plan["trials"])
    assert members == sum(2 if "Pop" in m or "Combined" in m or m == BEST_OF_K else 1 for m in LM_METHODS) * 2
    assert len(metrics) == members * QUICK.epochs
    # The new columns: the program task says why every program scored what it did, so success is known.
    assert metrics["success"].between(0, 1).all() and metrics["distinct"].between(0, 1).all()
    assert (metrics["distinct"] > 0).all()
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
    # Pop-GRPO against its best-of-K control, best member against best member, on both seeds.
    best_claims = json.loads((out / "lm_best_of_k_claims.json").read_text())
    assert len(best_claims) == len(BEST_OF_K_CLAIMS) and all(c["n"] == len(QUICK.seeds) for c in best_claims)
    assert all(c["claim"] in text for c in best_claims)

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


def test_the_committed_lm_study_redraws_its_tables_and_claims_unchanged(tmp_path):
    """docs/results/lm/study holds the study's per-epoch data: `popgrpo report` on a copy writes
    the committed tables and claims (the best-of-K ones too) again, without training."""
    committed = Path("docs/results/lm/study")
    copy = tmp_path / "study"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("*.png", "*.md", "*.csv", "lm_*.json"))
    done = subprocess.run(
        [sys.executable, "-m", "popgrpo", "report", str(copy)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = ("lm.md", "lm_table.csv", "lm_claims.json", "lm_best_members.csv", "lm_best_of_k_claims.json")
    for name in names:
        assert (copy / name).read_text() == (committed / name).read_text(), name
    plan = json.loads((committed / "plan.json").read_text())
    assert {t["memberships"][0]["label"] for t in plan["trials"]} == set(LM_METHODS)


def test_in_the_committed_study_best_of_k_is_pop_grpo_until_its_first_round():
    """The two arms share seeds and every sample and update until Pop-GRPO's first merge: their
    per-member rows of the first round are equal; after it they part (the merge is the only difference)."""
    committed = Path("docs/results/lm/study")
    plan = json.loads((committed / "plan.json").read_text())
    metrics = pd.read_parquet(committed / "metrics.parquet")
    key = {(t["memberships"][0]["label"], t["seed"]): t["key"] for t in plan["trials"]}
    first_round = FULL.interval_epochs
    columns = ["reward_mean", "reward_max", "diversity", "complexity", "success", "entropy", "kl"]
    for seed in FULL.seeds:
        pop, bok = (
            metrics[metrics.trial == key[(arm, seed)]].sort_values(["epoch", "member"]).set_index(["epoch", "member"])
            for arm in ("Pop-GRPO", BEST_OF_K)
        )
        assert list(pop.index) == list(bok.index) and len(pop) == 2 * FULL.epochs
        early = pop.index.get_level_values("epoch") < first_round
        pd.testing.assert_frame_equal(pop.loc[early, columns], bok.loc[early, columns])
        assert not pop.loc[~early, columns].equals(bok.loc[~early, columns])


def test_in_the_committed_study_best_of_k_member_0_is_the_grpo_run():
    """Each best-of-K member is a whole GRPO run: member 0 draws the GRPO arm's seeds, row for row."""
    committed = Path("docs/results/lm/study")
    plan = json.loads((committed / "plan.json").read_text())
    metrics = pd.read_parquet(committed / "metrics.parquet")
    key = {(t["memberships"][0]["label"], t["seed"]): t["key"] for t in plan["trials"]}
    columns = [c for c in metrics.columns if c not in ("trial", "seed", "member")]
    for seed in FULL.seeds:
        grpo = metrics[metrics.trial == key[("GRPO", seed)]].sort_values("epoch")
        bok = metrics[metrics.trial == key[(BEST_OF_K, seed)]]
        member0 = bok[bok.member == 0].sort_values("epoch")
        pd.testing.assert_frame_equal(grpo[columns].reset_index(drop=True), member0[columns].reset_index(drop=True))
        assert not bok[bok.member == 1]["reward_mean"].equals(member0["reward_mean"])


def test_results_lm_quotes_the_redrawn_best_of_k_tables():
    """Every table row of RESULTS_LM.md §3.5 is a row of the redrawn lm.md."""
    doc = Path("docs/RESULTS_LM.md").read_text().split("### 3.5 ")[1].split("\n## ")[0]
    lm = Path("docs/results/lm/study/lm.md").read_text().splitlines()
    rows = [line for line in doc.splitlines() if line.startswith(("| Pop-GRPO", "| best-of-K GRPO"))]
    assert len(rows) == 2 + 2 + 2 + 5  # compute, best members, members averaged, claims
    assert all(row in lm for row in rows)
