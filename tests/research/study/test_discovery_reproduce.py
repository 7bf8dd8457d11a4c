"""`popgrpo reproduce --study discovery --quick` end to end on an embedded Ray: every arm of the
pre-registered design on both landscapes, verdicts and decisions written, a second run trains nothing."""

import json
import shutil
import subprocess
import sys

import pytest

from popgrpo.research.study.discovery_plan import CONTROL, load_preregistration
from tests.services import ray_subprocess_env

# 16 trials on Tune: make test-slow (docs/reference/tests.md).
pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow]


def test_quick_discovery_study_writes_verdicts_for_every_mechanism_and_resumes(tmp_path):
    out = tmp_path / "study"
    env = ray_subprocess_env("pgdisc-")
    cmd = [sys.executable, "-m", "popgrpo", "reproduce", "--study", "discovery", "--quick", "--epochs", "4"]
    cmd += ["--seeds", "5001,5002", "--out", str(out), "--verbose", "0"]
    try:
        first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        design, sha = load_preregistration()
        n_trials = len(design.arms) * len(design.landscapes) * 2
        assert f"{n_trials} trials in" in first.stdout
        summaries = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
        assert len(summaries) == n_trials
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stderr[-3000:]
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    for path, mtime in summaries.items():
        assert path.stat().st_mtime_ns == mtime, f"{path.parent.name} was trained again"
    saved = json.loads((out / "verdicts.json").read_text())
    assert saved["preregistration_sha256"] == sha and saved["trials"] == n_trials
    assert saved["wall_seconds"] > 0 and len((out / "wall.jsonl").read_text().splitlines()) == 2
    mechanisms = [a for a in design.arms if a != CONTROL]
    assert {d["mechanism"] for d in saved["decisions"]} == set(mechanisms)
    primary = [m for m, spec in design.metrics.items() if spec["tier"] == "primary"]
    pooled = {(r["landscape"], r["mechanism"], r["metric"]) for r in saved["verdicts"] if r["intensity"] == "pooled"}
    assert {(x, m, k) for x in design.landscapes for m in mechanisms for k in primary} <= pooled
    assert all(r["verdict"] for r in saved["verdicts"])
    for name in ("verdicts.md", "arms.md", "fig_effects.png", "fig_peaks_vs_samples.png"):
        assert (out / name).stat().st_size > 100
