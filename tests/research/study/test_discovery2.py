"""The second discovery study's design, plan and CLI (popgrpo.research.study.discovery2)."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from popgrpo.research.study.discovery2 import (
    CONTROL,
    ENTROPY_MATCHED,
    PREREGISTRATION_PATH,
    Design2,
    build_plan,
    check_arms,
    design_plan,
    load_preregistration,
    load_tuning,
    quick_design,
)
from popgrpo.research.study.kinds import report_kind, study_kind
from popgrpo.research.study.run import run_trial

EXAMPLE = Path(__file__).parent / "fixtures" / "discovery2_example.json"


def _example() -> dict:
    return json.loads(EXAMPLE.read_text())["design"]


def test_the_tuning_plan_runs_every_arm_on_every_unit_of_every_family():
    design = load_tuning()
    assert design.families == ("stepping_stones", "collapse", "paper") and design.primary_family == "stepping_stones"
    assert design.instances == (1001, 1002, 1003, 1004) and design.seeds == (8001, 8002)
    assert design.steps_per_epoch == 4 and design.arms[CONTROL] == ("scheduler.enabled=false",)
    trials = build_plan(design)
    assert len(trials) == len(design.arms) * 3 * 4 * 2
    assert len({t["key"] for t in trials}) == len(trials)
    served: dict[tuple, set] = {}
    for t in trials:
        assert f"env.peak_seed={t['instance']}" in t["overrides"] and "grpo.steps_per_epoch=4" in t["overrides"]
        assert t["overrides"][-len(design.arms[t["arm"]]) :] == list(design.arms[t["arm"]])
        served.setdefault((t["landscape"], t["instance"], t["seed"]), set()).add(t["arm"])
    assert len(served) == 3 * 4 * 2 and all(arms == set(design.arms) for arms in served.values())


def test_quick_is_one_instance_two_seeds_and_the_quick_arms(tmp_path):
    design = load_tuning()
    plan = design_plan("discovery2-tuning", design, None, True, None, None, "collapse")
    quick = Design2.from_json(plan["design"])
    assert quick.instances == (1001,) and quick.seeds == (8001, 8002) and set(quick.arms) == set(design.quick_arms)
    assert len(plan["trials"]) == len(design.quick_arms) * 3 * 2
    assert plan["commit"] and plan["started"].endswith("+00:00") and plan["landscape"] == "both"
    seeds = design_plan("discovery2-tuning", design, None, True, (5, 6, 7), 3, "collapse")
    assert {t["seed"] for t in seeds["trials"]} == {5, 6, 7} and seeds["epochs"] == 3


def test_the_example_confirmatory_design_loads_with_its_hash_and_its_arms_validate():
    design, sha = load_preregistration(EXAMPLE)
    assert design.phase == "confirmatory" and len(sha) == 64 and len(design.instances) >= 8
    assert design.entropy_target == {"stepping_stones": -1.1, "collapse": -0.2, "paper": 0.5}
    check_arms(design)
    trials = build_plan(design)
    assert len(trials) == len(design.arms) * 3 * 8 * 2
    # The entropy-matched arm runs each family's target, appended to its overrides; no other arm has one.
    for t in trials:
        targets = [o for o in t["overrides"] if o.startswith("maxent.entropy.target=")]
        wanted = [f"maxent.entropy.target={design.entropy_target[t['landscape']]}"]
        assert targets == (wanted if t["arm"] == ENTROPY_MATCHED else [])
    one = Design2.from_json({**_example(), "entropy_target": 0.7})  # one number: every family's
    assert one.entropy_target == dict.fromkeys(design.families, 0.7)


def _mutated(change) -> dict:
    data = copy.deepcopy(_example())
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(instances=[1, 2, 3]), "at least 8 instances"),
        (lambda d: d.update(seeds=[8001, 3002]), "tuning's"),
        (lambda d: d.update(instances=[*range(1, 8), 1001]), "tuning's"),
        (lambda d: d["metrics"]["far_coverage"].update(margin=None), "margin > 0"),
        (lambda d: d["random_widths"]["paper"].pop("best_quality"), "no tuned width"),
        (lambda d: d.update(entropy_target={"collapse": 0.9}), r"entropy_target for \['stepping_stones', 'paper'\]"),
        (lambda d: d["arms"][ENTROPY_MATCHED].append("maxent.entropy.target=0.9"), "exactly the control"),
        (lambda d: d["arms"].update({CONTROL: ["scheduler.enabled=false", "grpo.lr=0.01"]}), "exactly"),
        (lambda d: d["arms"]["repulsion"].append("population.size=3"), "owns"),
        (lambda d: d.update(coupling=[["repulsion", "islands"]]), "does not run"),
        (lambda d: d.update(families=["stepping_stones", "nowhere"]), "not a study landscape"),
        (lambda d: d.update(threshold=0.8), "coverage metrics"),
    ],
)
def test_the_confirmatory_validator_refuses(change, message):
    with pytest.raises(ValueError, match=message):
        Design2.from_json(_mutated(change))


def test_an_override_the_config_does_not_know_fails_the_arm_check():
    data = _mutated(lambda d: d["arms"]["repulsion"].append("scheduler.repulsion_strenght=1.0"))
    with pytest.raises(ValueError, match="arm 'repulsion' on stepping_stones"):
        check_arms(Design2.from_json(data))
    soup = _mutated(lambda d: d["arms"].update({"soup": []}))
    with pytest.raises(ValueError, match=r"eval\.merged=false"):
        check_arms(Design2.from_json(soup))
    check_arms(Design2.from_json(_mutated(lambda d: d["arms"].update({"soup": ["eval.merged=false"]}))))


def test_the_confirmatory_plan_refuses_tuning_seeds():
    design, sha = load_preregistration(EXAMPLE)
    with pytest.raises(ValueError, match="tuning seeds"):
        design_plan("discovery2", design, sha, False, (8001, 9000), None, "collapse")
    assert quick_design(design).arms.keys() == set(design.quick_arms)


def test_discovery2_without_its_preregistration_exits_2_with_one_line(tmp_path):
    if Path(PREREGISTRATION_PATH).exists():
        pytest.skip("the pre-registration is committed")
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "popgrpo", "reproduce", "--study", "discovery2", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"the pre-registration {PREREGISTRATION_PATH} is not committed yet" in lines[0]
    assert not out.exists()


def test_the_kinds_are_registered_and_report_recognises_their_directories(tmp_path):
    for name in ("discovery2", "discovery2-tuning"):
        kind = study_kind(name)
        assert kind.reproducible and kind.unused(["seeds", "address", "landscape"]) == ["landscape"]
        (tmp_path / name).mkdir()
        (tmp_path / name / "plan.json").write_text(json.dumps({"study": name}))
        assert report_kind(tmp_path / name) is kind


def test_a_finished_trial_is_not_trained_again(tmp_path):
    trial = build_plan(quick_design(load_tuning()))[0]
    run_dir = tmp_path / "runs" / trial["key"]
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"marker": 1}))
    assert run_trial(trial, str(tmp_path / "runs")) == {"marker": 1}
    assert sorted(p.name for p in run_dir.iterdir()) == ["summary.json"]
