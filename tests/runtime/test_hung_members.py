"""A member actor that stops answering without dying (SIGSTOP) does not hold the population.

Ray never reports a stopped process lost, so the executor takes a call that is past its
deadline (population.hang_deadline_factor × the measured time per epoch, at least
population.hang_deadline_min_s) as hung and replaces the actor from its restore point, as it
does a killed one. Sync rounds and asynchronous rounds with S = 0 are deterministic, so the
run must give the uninterrupted numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pandas as pd
import pytest
import ray

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.deadlines import CallDeadlines
from popgrpo.train import train


def test_deadline_from_the_measured_time_per_epoch():
    deadlines = CallDeadlines(factor=4.0, min_s=1.0, first_call_s=50.0, round_epochs=10)
    # Nothing measured: every kind waits the first-call allowance (model loading, compilation).
    assert deadlines.limit("train", 10) == deadlines.limit("adopt") == deadlines.limit("placement") == 50.0
    for seconds in (2.0, 3.0, 100.0):  # 0.2, 0.3 and 10 s per epoch over 10 epochs
        deadlines.answered("train", seconds, 10)
    assert deadlines.limit("train", 10) == pytest.approx(4.0 * 0.3 * 10)  # the median, not the mean
    assert deadlines.limit("train", 1) == pytest.approx(1.2)
    # A short call of a kind not answered yet (a rebuild's load_states): a round's training time.
    assert deadlines.limit("load_states") == pytest.approx(4.0 * 0.3 * 10)
    assert deadlines.limit("placement") == 50.0  # a construction is not a round: still unmeasured
    deadlines.answered("adopt", 0.5)
    deadlines.answered("placement", 2.0)
    assert deadlines.limit("adopt") == pytest.approx(2.0)  # its own measure from now on
    assert deadlines.limit("placement") == pytest.approx(6.0)  # constructions: 3 × their median by default
    floor = CallDeadlines(factor=4.0, min_s=2.0, first_call_s=1.0)
    assert floor.limit("train", 10) == 2.0  # nothing is sooner than the floor, not even the allowance
    floor.answered("train", 3.0, 10)
    floor.answered("snapshot", 0.01)
    assert floor.limit("train", 1) == floor.limit("snapshot") == 2.0  # 4 × 0.3 s, 4 × 0.01 s: below min_s
    assert "train" in deadlines.describe() and "unmeasured" in floor.describe()


SETS = [
    "population.size=4", "population.members_per_actor=2", "population.resources.num_cpus=0.5",
    "run.epochs=6", "scheduler.interval_epochs=2", "grpo.steps_per_epoch=8", "run.seed=42", "run.loggers=[]",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.solo
@pytest.mark.ray
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stopped_member_actor_is_replaced_after_the_deadline(ray_local, tmp_path, mode):
    from popgrpo.runtime.ray_executor import RayExecutor
    from tests.driving import kill_when_busy

    train(load_config(preset_path("pop_grpo"), SETS), tmp_path / "reference", progress=False)
    stopped: list[int] = []
    probes = []

    def stopping(cfg, run_dir):
        executor = RayExecutor(cfg, run_dir=run_dir)
        executor._deadlines.answered("train", 0.5, 2)  # as if a round had been measured: 0.25 s per epoch
        actor = executor._actors[0]
        pid = ray.get(actor.pid.remote())

        def stop():
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

        probes.append(kill_when_busy(actor, stop))
        return executor

    cfg = load_config(
        preset_path("pop_grpo"),
        [*SETS, f"scheduler.mode={mode}", "population.hang_deadline_factor=8", "population.hang_deadline_min_s=3"],
    )
    try:
        train(cfg, tmp_path / "stopped", executor_factory=stopping, progress=False)
    finally:
        for pid in stopped:  # ours: never leave a stopped process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert probes and probes[0].wait(timeout=5) and stopped
    events = [json.loads(line) for line in (tmp_path / "stopped" / "events.jsonl").read_text().splitlines()]
    hung = [e for e in events if e["event"] == "member_actor_restarted" and "(hung)" in e["reason"]]
    assert any(e["members"] == [0, 1] for e in hung)
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "reference" / "metrics.parquet").drop(columns=["seconds"], errors="ignore"),
        pd.read_parquet(tmp_path / "stopped" / "metrics.parquet").drop(columns=["seconds"], errors="ignore"),
    )
