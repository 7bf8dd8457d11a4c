"""`--study discovery2-tuning --quick` and `--study discovery2 --quick` end to end in this process (no Ray): every trial of the quick
plan trained by run_trial, a rerun training nothing, random search tuned, the tuning report written
and redrawn by `popgrpo report`'s kind."""

import json

import pandas as pd
import pytest

from popgrpo.research.study.discovery import RANDOM_SEARCH
from popgrpo.research.study.discovery2 import CONTROL, PRIMARY, discovery2_tuning_plan, load_tuning
from popgrpo.research.study.discovery2_report import RANDOM_FILE, WIDTH_FILE
from popgrpo.research.study.kinds import report_kind
from popgrpo.research.study.run import run_trial

# 30 trials of 2 epochs in one process: over a minute on 2 cores (make test-slow).
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_quick_tuning_study_in_process_resumes_and_reports(tmp_path):
    out = tmp_path / "study"
    plan = discovery2_tuning_plan("discovery2-tuning", True, None, 2, "collapse", None)
    out.mkdir()
    (out / "plan.json").write_text(json.dumps(plan))
    design = load_tuning()
    assert len(plan["trials"]) == len(design.quick_arms) * 3 * 2
    for trial in plan["trials"]:
        run_trial(trial, str(out / "runs"))
    summaries = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    assert len(summaries) == len(plan["trials"])
    for trial in plan["trials"]:  # a rerun: every trial is finished
        run_trial(trial, str(out / "runs"))
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")} == summaries
    written = report_kind(out).redraw(out)
    assert out / "tuning.md" in written and out / WIDTH_FILE in written
    trials = pd.read_parquet(out / "discovery_trials.parquet")
    assert set(trials["arm"]) == set(design.quick_arms) and len(trials) == len(plan["trials"])
    random = pd.read_parquet(out / RANDOM_FILE)
    assert set(random["arm"]) == {RANDOM_SEARCH} and len(random) == 3 * 2  # one per (family, seed) of the instance
    tuning = json.loads((out / "tuning.json").read_text())
    arms = {(r["family"], r["arm"], r["comparator"], r["metric"]) for r in tuning}
    for family in design.families:
        for metric in PRIMARY:
            assert (family, CONTROL, RANDOM_SEARCH, metric) in arms
            assert (family, "repulsion", "repulsion, uncoupled", metric) in arms
    assert "instances_for_power" in (out / "tuning.md").read_text()


def test_quick_confirmatory_study_runs_its_two_instances_and_judges_them_as_a_smoke_run(tmp_path):
    """`--study discovery2 --quick`: the committed design's quick arms on its first two instances
    (one seed), reported with paired claims on two units and marked as not a result."""
    from popgrpo.research.study.discovery2 import discovery2_plan, load_preregistration

    out = tmp_path / "study"
    plan = discovery2_plan("discovery2", True, None, 2, "collapse", None)
    out.mkdir()
    (out / "plan.json").write_text(json.dumps(plan))
    design, sha = load_preregistration()
    assert len(plan["trials"]) == len(design.quick_arms) * len(design.families) * 2
    for trial in plan["trials"]:
        run_trial(trial, str(out / "runs"))
    written = report_kind(out).redraw(out)
    assert out / "verdicts.json" in written and out / "summary.md" in written and out / "entropy.md" in written
    saved = json.loads((out / "verdicts.json").read_text())
    assert saved["preregistration_sha256"] == sha
    assert {r["instances"] for r in saved["verdicts"]} == {2}
    for name in ("verdicts.md", "arms.md", "summary.md", "entropy.md"):
        assert "not a result" in (out / name).read_text(), name
