"""`popgrpo reproduce --quick` end to end: interrupted with Ctrl-C, run again, it finishes without
redoing finished trials and writes every table and figure."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from popgrpo.research.study.plan import METHODS, build_plan
from popgrpo.research.study.report import FIGURES
from tests.services import ray_subprocess_env

# 64 trials on Tune, twice: make test-slow (docs/reference/tests.md).
pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow]


def test_quick_reproduce_resumes_after_an_interrupt_and_writes_everything(tmp_path):
    out = tmp_path / "study"
    env = ray_subprocess_env("pgrep-")
    # The quick plan at 10 epochs: every trial and figure of --quick, a third of its training.
    cmd = [
        sys.executable,
        "-m",
        "popgrpo",
        "reproduce",
        "--quick",
        "--epochs",
        "10",
        "--out",
        str(out),
        "--verbose",
        "0",
    ]
    n_trials = len(build_plan(quick=True, epochs=10))
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 480  # make test-slow runs it beside another slow test
        while time.time() < deadline and len(list(out.glob("runs/*/summary.json"))) < 6:
            assert first.poll() is None, first.stdout.read().decode()[-3000:]
            time.sleep(0.5)
        first.send_signal(signal.SIGINT)  # Ctrl-C: Tune saves the experiment and stops
        output = first.communicate(timeout=120)[0].decode()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    finished = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    assert 6 <= len(finished) < n_trials, output[-3000:]
    assert first.returncode != 0

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert len(list(out.glob("runs/*/summary.json"))) == n_trials
    for path, mtime in finished.items():
        assert path.stat().st_mtime_ns == mtime, f"{path.parent.name} was trained again"
    assert f"{n_trials} trials in" in second.stdout
    # The plan is kept: a resume that asks for other epochs is refused with one line.
    other = subprocess.run([*cmd[:6], "20", *cmd[7:]], env=env, capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "holds a study of 10-epoch trials" in other.stderr, other.stderr
    for name in (*FIGURES, "table1.md", "claims.md", *(f"archive_{p}.png" for p in METHODS.values())):
        assert (out / name).stat().st_size > 100 and str(out / name) in second.stdout, name
    # Where to watch, printed at start; every trial is a TensorBoard run of its own.
    assert "popgrpo: Ray dashboard: http://127.0.0.1:" in second.stderr
    assert f"popgrpo: TensorBoard: tensorboard --logdir {out.resolve() / 'runs'}" in second.stderr
    for trial in out.glob("runs/*/summary.json"):
        assert list((trial.parent / "tensorboard" / "population").glob("events.out.tfevents.*")), trial.parent.name
