"""The second discovery study's design, plan and CLI (popgrpo.research.study.discovery2)."""

import copy
import json
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


def test_a_quick_confirmatory_plan_has_two_instances_of_its_one_seed_and_reloads_as_quick():
    """The committed design has one seed, so --quick runs its first two instances: two units, so
    the report's paired tests run. Its plan's design reloads only as a quick one (8 instances
    are the confirmatory minimum)."""
    design, sha = load_preregistration()
    plan = design_plan("discovery2", design, sha, True, None, None, "collapse")
    assert plan["quick"] is True
    quick = Design2.from_json(plan["design"], quick=True)
    assert quick.instances == design.instances[:2] and quick.seeds == design.seeds[:1] == (3001,)
    assert len(plan["trials"]) == len(design.quick_arms) * len(design.families) * 2
    with pytest.raises(ValueError, match="at least 8 instances"):
        Design2.from_json(plan["design"])


def test_the_confirmatory_plan_refuses_tuning_seeds():
    design, sha = load_preregistration(EXAMPLE)
    with pytest.raises(ValueError, match="tuning seeds"):
        design_plan("discovery2", design, sha, False, (8001, 9000), None, "collapse")
    assert quick_design(design).arms.keys() == set(design.quick_arms)


def test_discovery2_without_its_preregistration_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    """Before the confirmatory design is committed (here: its file name points at nothing),
    ``reproduce --study discovery2`` exits 2 with one line and makes no study directory."""
    from popgrpo.cli import main
    from popgrpo.research.study import discovery2

    monkeypatch.setattr(discovery2, "PREREGISTRATION", "not-committed.json")
    out = tmp_path / "study"
    assert main(["reproduce", "--study", "discovery2", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"the pre-registration {PREREGISTRATION_PATH} is not committed yet" in lines[0]
    assert not out.exists()


TUNING_RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results" / "discovery2-tuning"


def test_the_committed_preregistration_follows_from_the_committed_tuning():
    """preregistration/discovery2.json validates (at least 8 instances, none and no seed of
    tuning's, a margin per metric), its arms load on every family, and the numbers it took from
    tuning are tuning's: the entropy-matched arm's target is repulsion's mean entropy per family,
    and random search's widths are the ones tuning chose."""
    import pandas as pd

    design, sha = load_preregistration()
    assert design.phase == "confirmatory" and len(sha) == 64
    check_arms(design)
    assert len(build_plan(design)) == len(design.arms) * len(design.families) * len(design.instances) * len(
        design.seeds
    )
    trials = pd.read_parquet(TUNING_RESULTS / "discovery_trials.parquet")
    entropy = trials[trials.arm == "repulsion"].groupby("landscape")["entropy"].mean()
    assert design.entropy_target == {f: pytest.approx(float(entropy[f]), abs=5e-4) for f in design.families}
    random = pd.read_parquet(TUNING_RESULTS / "discovery2_random_search.parquet")
    for family, rows in random.groupby("landscape"):
        chosen = {m: float(rows[f"width_{m}"].iloc[0]) for m in design.metrics}
        assert design.random_widths[str(family)] == chosen


def test_the_committed_tuning_redraws_from_its_parquet(tmp_path):
    """``popgrpo report`` on a copy of docs/results/discovery2-tuning writes the committed
    tuning.json (effects and sizes) and arms.md again, from the Parquet files alone."""
    import shutil

    copy_dir = tmp_path / "tuning"
    shutil.copytree(TUNING_RESULTS, copy_dir)
    for name in ("tuning.json", "arms.md", "tuning.md"):
        (copy_dir / name).unlink()
    from popgrpo.research.study.discovery2_report import render_discovery2

    render_discovery2(copy_dir)
    for name in ("tuning.json", "arms.md", "tuning.md"):
        assert (copy_dir / name).read_text() == (TUNING_RESULTS / name).read_text(), name


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
