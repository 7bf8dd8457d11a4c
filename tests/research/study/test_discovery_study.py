"""The discovery study's plan, pre-registration, verdicts and report (popgrpo.research.study.discovery_*)."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from popgrpo.research.study.discovery_plan import (
    ARMS,
    CONTROL,
    TUNING,
    DiscoveryDesign,
    build_discovery_plan,
    load_preregistration,
    quick_design,
)
from popgrpo.research.study.discovery_report import compute_check, judge_design, render_discovery

SMALL = DiscoveryDesign(
    phase="confirmatory",
    arms=(CONTROL, "truncation", "repulsion"),
    landscapes=("collapse", "paper"),
    instances=(1, 2),
    intensities=(1, 4),
    seeds=(11, 12),
    epochs=20,
    threshold=0.8,
    metrics={"best_quality": {"tier": "primary", "margin": 0.05}, "peaks": {"tier": "secondary", "margin": 0.5}},
)


def test_every_arm_runs_every_cell_with_the_same_seeds_and_landscape():
    trials = build_discovery_plan(SMALL)
    assert len(trials) == 3 * 2 * 2 * 2 * 2
    assert len({t["key"] for t in trials}) == len(trials)
    by_cell: dict[tuple, set] = {}
    for t in trials:
        assert f"env.peak_seed={t['instance']}" in t["overrides"]
        assert f"grpo.steps_per_epoch={t['intensity']}" in t["overrides"]
        assert "eval.discovery_threshold=0.8" in t["overrides"] and "run.epochs=20" in t["overrides"]
        assert t["preset"] == ("pop_grpo" if t["landscape"] == "collapse" else "paper_pop_grpo")
        by_cell.setdefault((t["landscape"], t["instance"], t["intensity"], t["seed"]), set()).add(t["arm"])
    assert all(arms == set(SMALL.arms) for arms in by_cell.values())  # every unit paired in every arm


def test_the_control_is_k_independent_runs_and_every_arm_has_k_members():
    for arm, overrides in ARMS.items():
        assert not any(o.startswith("population.size") for o in overrides), arm  # the preset's K = 5 everywhere
    assert ARMS[CONTROL] == ("scheduler.enabled=false",)


def test_the_preregistration_confirms_on_seeds_and_instances_tuning_never_saw():
    design, sha = load_preregistration()
    assert design.phase == "confirmatory" and len(sha) == 64
    assert not set(design.seeds) & set(TUNING.seeds)
    assert not set(design.instances) & set(TUNING.instances)
    assert CONTROL in design.arms and len(design.seeds) >= 10
    assert set(design.intensities) == {1, 2, 4, 8} and set(design.landscapes) == {"collapse", "paper"}
    assert all(spec["margin"] > 0 for spec in design.metrics.values())


def test_a_design_must_name_known_arms_and_the_control(tmp_path):
    data = SMALL.to_json()
    with pytest.raises(ValueError, match="unknown arm"):
        DiscoveryDesign.from_json({**data, "arms": [CONTROL, "telepathy"]})
    with pytest.raises(ValueError, match="no 'best-of-K GRPO' arm"):
        DiscoveryDesign.from_json({**data, "arms": ["truncation"]})
    path = tmp_path / "prereg.json"
    path.write_text(json.dumps({"design": {**data, "phase": "tuning"}}))
    with pytest.raises(ValueError, match="not confirmatory"):
        load_preregistration(path)


def test_quick_keeps_every_arm_and_both_landscapes_in_a_small_plan():
    quick = quick_design(SMALL)
    assert quick.arms == SMALL.arms and quick.landscapes == SMALL.landscapes
    assert len(build_discovery_plan(quick)) == 3 * 2 * 1 * 1 * 2 and quick.epochs == 30


def _synthetic(effects: dict[str, float], noise: float = 0.02, seed: int = 0) -> pd.DataFrame:
    """A trials table: the control ~ N(1, 0.1) per unit, each arm its control plus ``effect`` plus noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for landscape in SMALL.landscapes:
        for instance in SMALL.instances:
            for intensity in SMALL.intensities:
                for s in range(10):
                    base = 1.0 + 0.1 * rng.standard_normal()
                    for arm in SMALL.arms:
                        value = base + (0.0 if arm == CONTROL else effects[arm] + noise * rng.standard_normal())
                        rows.append(
                            {
                                "key": f"{landscape}-{instance}-{intensity}-{s}-{arm}",
                                "landscape": landscape,
                                "instance": instance,
                                "intensity": intensity,
                                "arm": arm,
                                "seed": s,
                                "best_quality": value,
                                "peaks": 2.0,
                                "best_expected": value / 3,
                                "peak_fraction_mean": 0.7,
                                "discovery_time": 0.9,
                                "samples": 1000.0 * intensity,
                            }
                        )
    return pd.DataFrame(rows)


def test_verdicts_find_a_real_gain_and_bound_a_null_one():
    trials = _synthetic({"truncation": 0.2, "repulsion": 0.0})
    verdicts = {
        (v.extra["landscape"], v.extra["intensity"], v.extra["mechanism"], v.extra["metric"]): v
        for v in judge_design(trials, SMALL.to_json())
    }
    # Per landscape: pooled + 2 intensities, 2 mechanisms, 1 primary + 1 secondary metric.
    assert len(verdicts) == 2 * 3 * 2 * 2
    assert verdicts[("paper", "pooled", "truncation", "best_quality")].outcome == "better"
    assert verdicts[("paper", "pooled", "repulsion", "best_quality")].outcome == "equivalent"
    pooled = verdicts[("collapse", "pooled", "truncation", "best_quality")]
    assert pooled.test.n == 20 and 0.18 < pooled.test.mean < 0.22 and pooled.ci[0] < 0.2 < pooled.ci[1]
    # A metric that never differs is equivalent within its margin, in its own (secondary) family.
    assert verdicts[("collapse", 4, "repulsion", "peaks")].outcome == "equivalent"
    assert verdicts[("collapse", 4, "repulsion", "peaks")].extra["tier"] == "secondary"


def test_the_decision_rule_needs_a_pooled_gain_on_every_landscape():
    from popgrpo.research.study.discovery_report import decisions

    trials = _synthetic({"truncation": 0.2, "repulsion": 0.0})
    trials.loc[(trials["arm"] == "truncation") & (trials["landscape"] == "paper"), "best_quality"] -= 0.2
    rows = {r["mechanism"]: r for r in decisions(judge_design(trials, SMALL.to_json()), SMALL.to_json())}
    assert rows["truncation"]["collapse"] and not rows["truncation"]["paper"]
    assert not rows["truncation"]["beats_best_of_k"] and not rows["repulsion"]["beats_best_of_k"]


def test_a_harmful_mechanism_is_called_worse():
    verdicts = judge_design(_synthetic({"truncation": -0.3, "repulsion": 0.0}), SMALL.to_json())
    words = {v.extra["mechanism"] for v in verdicts if v.outcome == "worse"}
    assert words == {"truncation"}


def test_compute_check_refuses_arms_that_sampled_differently():
    trials = _synthetic({"truncation": 0.0, "repulsion": 0.0})
    assert "exactly the same number of ideas" in compute_check(trials)
    trials.loc[trials["arm"] == "repulsion", "samples"] += 1
    with pytest.raises(ValueError, match="not compute-matched"):
        compute_check(trials)


def test_the_report_redraws_from_its_parquet_files_alone(tmp_path):
    trials = _synthetic({"truncation": 0.2, "repulsion": 0.0})
    curves = pd.DataFrame(
        [
            {"key": k, "epoch": e, "samples": 100 * (e + 1), "peaks": e // 2, "best_expected": 0.3, "best_quality": 1.0}
            for k in trials["key"]
            for e in range(3)
        ]
    )
    trials.to_parquet(tmp_path / "discovery_trials.parquet")
    curves.to_parquet(tmp_path / "discovery_curves.parquet")
    (tmp_path / "plan.json").write_text(
        json.dumps({"study": "discovery", "design": SMALL.to_json(), "preregistration_sha256": "ab" * 32, "trials": []})
    )
    # No run directories: `popgrpo report` reads the Parquet files.
    result = subprocess.run(
        [sys.executable, "-m", "popgrpo", "report", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    saved = json.loads((tmp_path / "verdicts.json").read_text())
    assert saved["preregistration_sha256"] == "ab" * 32
    record = next(
        r
        for r in saved["verdicts"]
        if r["landscape"] == "paper"
        and r["intensity"] == "pooled"
        and r["mechanism"] == "truncation"
        and r["metric"] == "best_quality"
    )
    assert record["verdict"] == "better" and record["ci_low"] > 0 and record["p_holm"] < 0.05
    for name in ("verdicts.md", "arms.md", "fig_effects.png", "fig_peaks_vs_samples.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "truncation" in (tmp_path / "verdicts.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "1,x"], "comma-separated integers"),
        (["--seeds", "3,3"], "repeated"),
        (["--seeds", "7001,12"], "tuning seeds"),
        (["--landscape", "paper"], "runs its design's landscapes"),
    ],
)
def test_bad_study_arguments_exit_2_with_one_line(tmp_path, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "popgrpo", "reproduce", "--study", "discovery", "--out", str(tmp_path / "s"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]  # argparse's usage lines, then the one error line
    assert not (tmp_path / "s").exists()


def test_the_committed_discovery_results_redraw_and_the_docs_quote_them(tmp_path):
    """docs/DISCOVERY.md's table is summary.md, and summary.md is what `popgrpo report` writes from
    the committed Parquet files (no training)."""
    import shutil
    from pathlib import Path

    committed = Path("docs/results/discovery")
    for name in (
        "plan.json",
        "discovery_trials.parquet",
        "discovery_curves.parquet",
        "wall.jsonl",
        "discovery_random_search.parquet",
        "discovery_random_widths.parquet",
    ):
        shutil.copy(committed / name, tmp_path / name)
    render_discovery(tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert summary == (committed / "summary.md").read_text()
    assert "| best-of-K | random search |" in summary  # random search in every table the page shows
    for name in ("arms.md", "random_search.md", "verdicts.md"):
        assert (tmp_path / name).read_text() == (committed / name).read_text()
    assert "| random search |" in (tmp_path / "arms.md").read_text()
    assert summary in Path("docs/DISCOVERY.md").read_text()
    saved = json.loads((tmp_path / "verdicts.json").read_text())
    assert saved["trials"] == 640 and saved["preregistration_sha256"] == load_preregistration()[1]
    assert saved == json.loads((committed / "verdicts.json").read_text())


def test_a_design_runs_the_stepping_stones_family_with_its_overrides():
    from popgrpo.registry import STUDY_LANDSCAPES
    from popgrpo.research.study.plan import landscape_overrides

    design = DiscoveryDesign.from_json({**SMALL.to_json(), "landscapes": ["stepping_stones", "collapse"]})
    trials = build_discovery_plan(design)
    stones = [t for t in trials if t["landscape"] == "stepping_stones"]
    assert stones and all(t["preset"] == "pop_grpo" for t in stones)
    assert all(t["overrides"][: len(landscape_overrides("stepping_stones"))] == list(
        landscape_overrides("stepping_stones")
    ) for t in stones)  # fmt: skip
    assert "env.landscape=stepping_stones" in STUDY_LANDSCAPES.get("stepping_stones").overrides
    collapse = [t for t in trials if t["landscape"] == "collapse"]
    assert not any("env.landscape" in o for t in collapse for o in t["overrides"])
    with pytest.raises(ValueError, match="stepping_stones"):
        build_discovery_plan(DiscoveryDesign.from_json({**SMALL.to_json(), "landscapes": ["stepping_stone"]}))
