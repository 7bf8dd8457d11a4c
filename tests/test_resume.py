"""An interrupted run resumes from its last complete round and equals an uninterrupted one."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.services import ray_subprocess_env

ARGS = [
    "--config",
    "pop_grpo",
    "--set",
    "run.epochs=12",  # 6 rounds: killed after round 2, three are left to resume
    "--set",
    "scheduler.interval_epochs=2",
    "--set",
    "grpo.steps_per_epoch=6",
    "--set",
    "population.size=4",
    "--set",
    "maxent.novelty.enabled=true",
    "--set",
    "qd.enabled=true",
    "--quiet",
]


def _cmd(*args):
    return [sys.executable, "-m", "popgrpo", "train", *args]


def _kill_after_round(out: Path, round_index: int) -> None:
    proc = subprocess.Popen(
        _cmd(*ARGS, "--executor", "local", "--out", str(out)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    latest = out / "checkpoints" / "latest.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        if latest.exists() and json.loads(latest.read_text())["round"] >= round_index:
            break
        if proc.poll() is not None:
            pytest.fail(f"run ended before it could be interrupted: {proc.stderr.read().decode()}")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "run"
    res = subprocess.run(_cmd(*ARGS, "--executor", "local", "--out", str(out)), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.heavy])])
def test_killed_run_resumes_to_the_same_numbers(tmp_path: Path, uninterrupted: Path, executor: str):
    out = tmp_path / "run"
    _kill_after_round(out, round_index=2)
    assert not (out / "summary.json").exists()
    env = ray_subprocess_env("pgres-")
    try:
        res = subprocess.run(
            _cmd("--resume", str(out), "--executor", executor, "--quiet"), capture_output=True, text=True, env=env
        )
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert res.returncode == 0, res.stderr
    assert (out / "summary.json").read_text() == (uninterrupted / "summary.json").read_text()
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "metrics.parquet"), pd.read_parquet(uninterrupted / "metrics.parquet")
    )
    assert (out / "lineage.jsonl").read_text() == (uninterrupted / "lineage.jsonl").read_text()
    elites = pd.read_parquet(out / "archive.parquet")
    pd.testing.assert_frame_equal(elites, pd.read_parquet(uninterrupted / "archive.parquet"))
    assert sorted(elites["archive"].unique()) == [0, 1, 2, 3]
    # TensorBoard shows one point per epoch, the resumed run's: what the killed run wrote past
    # its last checkpoint is purged, not drawn twice.
    assert _tensorboard_curve(out, "population", "reward_mean") == _tensorboard_curve(
        uninterrupted, "population", "reward_mean"
    )


def test_checkpoints_are_pruned_and_resume_refuses_finished_runs(uninterrupted: Path):
    rounds = sorted(p.name for p in (uninterrupted / "checkpoints").glob("round_*"))
    assert rounds == ["round_0004", "round_0005"]  # checkpoint_keep = 2
    assert len(list((uninterrupted / "checkpoints" / "round_0005").glob("member_*.pt"))) == 4
    res = subprocess.run(_cmd("--resume", str(uninterrupted)), capture_output=True, text=True)
    assert res.returncode == 2 and "already finished" in res.stderr
    res = subprocess.run(_cmd("--resume", str(uninterrupted), "--set", "run.epochs=3"), capture_output=True, text=True)
    assert res.returncode == 2 and "--resume" in res.stderr


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.heavy])])
def test_a_finished_run_extended_equals_one_asked_for_the_epochs_from_the_start(
    tmp_path: Path, uninterrupted: Path, executor: str
):
    """6 epochs (3 rounds), finished, then extended to 12: the same numbers, lineage, archive,
    TensorBoard curve and config as the 12-epoch run. The 6-epoch run's last round merged
    nothing; the extension carries that merge out first."""
    out = tmp_path / "run"
    first = subprocess.run(
        _cmd(*ARGS, "--set", "run.epochs=6", "--executor", "local", "--out", str(out)), capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    assert [json.loads(line)["round"] for line in (out / "lineage.jsonl").read_text().splitlines()] == [0, 1]
    env = ray_subprocess_env("pgext-")
    try:
        res = subprocess.run(
            _cmd("--resume", str(out), "--epochs", "12", "--executor", executor, "--quiet"),
            capture_output=True,
            text=True,
            env=env,
        )
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert res.returncode == 0, res.stderr
    for name in ("summary.json", "lineage.jsonl", "config.yaml"):
        assert (out / name).read_text() == (uninterrupted / name).read_text(), name
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "metrics.parquet"), pd.read_parquet(uninterrupted / "metrics.parquet")
    )
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "archive.parquet"), pd.read_parquet(uninterrupted / "archive.parquet")
    )
    assert _tensorboard_curve(out, "population", "reward_mean") == _tensorboard_curve(
        uninterrupted, "population", "reward_mean"
    )


def test_extending_refuses_what_it_cannot_continue(tmp_path: Path, uninterrupted: Path):
    res = subprocess.run(_cmd("--resume", str(uninterrupted), "--epochs", "8"), capture_output=True, text=True)
    assert res.returncode == 2 and "cannot shorten" in res.stderr
    res = subprocess.run(_cmd("--epochs", "8", "--out", str(tmp_path / "new")), capture_output=True, text=True)
    assert res.returncode == 2 and "--set run.epochs=8" in res.stderr
    odd = tmp_path / "odd"  # 3 epochs in rounds of 2: its last round was 1 epoch long
    short = ["--config", "grpo", "--set", "run.epochs=3", "--set", "scheduler.interval_epochs=2"]
    done = subprocess.run(
        _cmd(*short, "--set", "grpo.steps_per_epoch=1", "--executor", "local", "--quiet", "--out", str(odd)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    res = subprocess.run(_cmd("--resume", str(odd), "--epochs", "6"), capture_output=True, text=True)
    assert res.returncode == 2 and "not a multiple of scheduler.interval_epochs (2)" in res.stderr
    assert (odd / "summary.json").is_file() and "epochs: 3" in (odd / "config.yaml").read_text()  # untouched


def _tensorboard_curve(run_dir: Path, run: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard" / run))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]
