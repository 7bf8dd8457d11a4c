"""The background writer: order, backpressure, failures raised in the driver, nothing lost at
exit or on a SIGKILL; and the metrics parts it appends, read back and compacted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import popgrpo.train as train_module
from popgrpo.config import load_config, preset_path
from popgrpo.telemetry.loggers import Loggers
from popgrpo.telemetry.run_dir import PARTS_DIR, RunDirectory
from popgrpo.telemetry.writer import BackgroundWriter, WriterError

REPO = Path(__file__).resolve().parents[2]


# ---- the writer ---------------------------------------------------------------------------------


def test_tasks_run_in_the_order_submitted_and_close_runs_what_is_queued():
    done: list[int] = []
    gate = threading.Event()
    writer = BackgroundWriter(max_pending=100)
    writer.submit(gate.wait)
    for i in range(50):
        writer.submit(done.append, i)
    assert done == []  # all queued behind the first task
    gate.set()
    writer.close()
    assert done == list(range(50))
    writer.close()  # again: nothing happens
    with pytest.raises(RuntimeError, match="after close"):
        writer.submit(done.append, 50)


def test_a_full_queue_blocks_the_submitter_until_the_thread_takes_a_task():
    gate = threading.Event()
    writer = BackgroundWriter(max_pending=1)
    writer.submit(gate.wait)  # taken by the thread, which then waits
    while writer._queue.qsize():  # until the thread holds the first task
        time.sleep(0.01)
    writer.submit(lambda: None)  # fills the one slot
    third = threading.Thread(target=writer.submit, args=(lambda: None,))
    third.start()
    third.join(timeout=0.3)
    assert third.is_alive()  # blocked: backpressure
    gate.set()
    third.join(timeout=30)
    assert not third.is_alive()
    writer.close()


def test_an_exception_in_a_task_is_raised_in_the_submitting_thread_and_later_tasks_are_dropped():
    ran: list[str] = []

    def fails() -> None:
        raise OSError("disk full")

    writer = BackgroundWriter()
    writer.submit(fails)
    writer.submit(ran.append, "after the failure")  # a checkpoint after rows that were not written
    with pytest.raises(WriterError, match="disk full") as info:
        writer.flush()
    assert isinstance(info.value.__cause__, OSError)
    assert ran == []
    with pytest.raises(WriterError):
        writer.submit(ran.append, "later")
    with pytest.raises(WriterError):
        writer.close()
    writer.close(raise_error=False)  # a caller already unwinding keeps its own exception


def test_a_writer_left_open_is_flushed_at_interpreter_exit(tmp_path: Path):
    target = tmp_path / "lines.txt"
    script = textwrap.dedent(
        f"""
        import time
        from popgrpo.telemetry.writer import BackgroundWriter

        def line(i):
            time.sleep(0.01)
            with open({str(target)!r}, "a") as fh:
                fh.write(f"{{i}}\\n")

        writer = BackgroundWriter(max_pending=100)
        for i in range(20):
            writer.submit(line, i)
        """
    )  # no close(): the atexit hook runs what is queued
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert target.read_text().split() == [str(i) for i in range(20)]


# ---- metrics parts ---------------------------------------------------------------------------


def _rows(epoch: int, members: int = 2) -> list[dict]:
    return [{"epoch": epoch, "member": k, "reward_mean": float(epoch + k), "reward_max": 1.0} for k in range(members)]


def test_metrics_are_appended_as_parts_read_in_order_and_compacted(tmp_path: Path):
    out = RunDirectory(tmp_path / "run").create()
    for epoch in range(3):
        out.append_metrics(_rows(epoch))
    assert len(list((out.path / PARTS_DIR).glob("part-*.parquet"))) == 3
    assert not (out.path / "metrics.parquet").exists()
    with pytest.raises(FileExistsError):
        RunDirectory(out.path).create()  # parts are a run too
    frame = out.read_metrics()
    assert frame[["epoch", "member"]].values.tolist() == [[e, k] for e in range(3) for k in range(2)]
    out.compact_metrics()
    assert not (out.path / PARTS_DIR).exists()
    pd.testing.assert_frame_equal(pd.read_parquet(out.path / "metrics.parquet"), frame)
    out.append_metrics(_rows(3))  # a resumed run appends after the compacted file
    assert out.read_metrics()["epoch"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_parts_already_compacted_are_not_read_twice(tmp_path: Path):
    """A run killed after writing metrics.parquet but before deleting the parts it holds."""
    out = RunDirectory(tmp_path / "run").create()
    for epoch in range(2):
        out.append_metrics(_rows(epoch))
    kept = {p.name: p.read_bytes() for p in (out.path / PARTS_DIR).iterdir()}
    out.compact_metrics()
    (out.path / PARTS_DIR).mkdir()
    for name, data in kept.items():
        (out.path / PARTS_DIR / name).write_bytes(data)
    out.append_metrics(_rows(2))
    assert out.read_metrics()["epoch"].tolist() == [0, 0, 1, 1, 2, 2]
    out.write_metrics(_rows(0))  # a resume keeping only epoch 0
    assert out.read_metrics()["epoch"].tolist() == [0, 0]


# ---- a run ---------------------------------------------------------------------------------------

ARGS = [
    "--config", "pop_grpo", "--executor", "local", "--quiet",
    "--set", "population.size=2", "--set", "scheduler.top_m=2", "--set", "run.epochs=40",
    "--set", "scheduler.interval_epochs=2", "--set", "grpo.steps_per_epoch=1", "--set", "run.loggers=[tensorboard]",
]  # fmt: skip


@pytest.mark.parametrize(
    "mode", [pytest.param("sync", marks=pytest.mark.heavy), pytest.param("async", marks=pytest.mark.slow)]
)
def test_sigkill_mid_run_leaves_the_rows_of_every_checkpointed_round_on_disk(tmp_path: Path, mode: str):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "popgrpo", "train", *ARGS, "--set", f"scheduler.mode={mode}", "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    latest = out / "checkpoints" / "latest.json"
    deadline = time.time() + 240
    try:
        while not (latest.exists() and json.loads(latest.read_text())["round"] >= 3):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.time() < deadline, "round 3 was never checkpointed"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    info = json.loads(latest.read_text())
    frame = RunDirectory(out).read_metrics()
    written = set(zip(frame["member"], frame["epoch"], strict=True))
    if mode == "sync":  # every epoch before the checkpoint's end, of every member
        assert {(k, e) for k in range(2) for e in range(info["epoch_end"])} <= written
    else:  # the rows the checkpoint counts
        assert len(frame) >= info["extra"]["async"]["rows"]
    lineage = [json.loads(line)["round"] for line in (out / "lineage.jsonl").read_text().splitlines()]
    assert set(range(info["round"] + 1)) <= set(lineage)
    resumed = subprocess.run(
        [sys.executable, "-m", "popgrpo", "train", "--resume", str(out), "--executor", "local", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert sorted(zip(metrics["member"], metrics["epoch"], strict=True)) == [
        (k, e) for k in range(2) for e in range(40)
    ]
    assert not (out / PARTS_DIR).exists()


def test_a_failing_logger_stops_the_run_with_its_error_and_no_checkpoint_follows(tmp_path: Path, monkeypatch):
    class Broken:
        def log_round(self, report) -> None:
            raise ValueError("tracker refused the event")

        def close(self, failed: bool = False) -> None:
            pass

    monkeypatch.setattr(train_module, "make_loggers", lambda *a, **kw: Loggers([Broken()]))
    config = load_config(
        preset_path("pop_grpo"),
        ["population.size=2", "scheduler.top_m=2", "run.epochs=8", "scheduler.interval_epochs=2",
         "grpo.steps_per_epoch=1"],
    )  # fmt: skip
    with pytest.raises(WriterError, match="tracker refused the event"):
        train_module.train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints" / "latest.json").exists()  # logged before the checkpoint
    assert RunDirectory(tmp_path / "run").read_metrics()["epoch"].max() == 1  # round 0's rows, written first
