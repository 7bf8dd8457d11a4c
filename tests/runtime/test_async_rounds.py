"""Asynchronous rounds (scheduler.mode: async): the decisions, and whole runs in-process and on Ray.

With max_staleness 0 every merge waits for every member, so the run must be the sync run bit
for bit (metrics) whatever the buffer; with a larger bound, merges take the members that
reported and no member ever trains from a base more than S merges old.
"""

from __future__ import annotations

import json
from unittest import mock

import pandas as pd
import pytest

from popgrpo.algorithms.async_rounds import held_back, merge_due, merge_members
from popgrpo.config import ConfigError, load_config, preset_path
from popgrpo.telemetry.checkpoint import Checkpointer
from popgrpo.train import resume, train
from tests.configs import SEEDED, pop_grpo

# Two GRPO steps an epoch (the default is 8): what these tests compare (sync against async, a
# resumed run against a whole one, the staleness bound) is decided per epoch and round, not per step.
BASE = [*SEEDED, "run.epochs=30", "scheduler.interval_epochs=10", "grpo.steps_per_epoch=2"]


def _metrics(run_dir):
    """The run's metrics without its wall-clock column."""
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns=["seconds"], errors="ignore")


def _lineage(run_dir):
    return [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines()]


def test_held_back_while_a_training_member_would_fall_more_than_s_behind():
    assert held_back(version=3, training_bases=[3, 2], max_staleness=1)  # merge 4 leaves base 2 two behind
    assert not held_back(version=3, training_bases=[3, 3], max_staleness=1)
    assert held_back(version=0, training_bases=[0], max_staleness=0)
    assert not held_back(version=0, training_bases=[], max_staleness=0)  # nobody training


def test_merge_due_waits_for_b_reports_or_for_everyone_left():
    # 2 buffered of B = 3, more may come: wait.
    assert not merge_due(2, 3, may_still_report=2, version=0, training_bases=[0, 0], max_staleness=5)
    assert merge_due(3, 3, may_still_report=2, version=0, training_bases=[0, 0], max_staleness=5)
    # Only 1 more could report and B = 4: 2 + 1 < 4, so wait for it, then merge the 3.
    assert not merge_due(2, 4, may_still_report=1, version=0, training_bases=[0], max_staleness=5)
    assert merge_due(2, 4, may_still_report=0, version=0, training_bases=[0], max_staleness=5)  # a last round
    assert not merge_due(0, 1, may_still_report=3, version=0, training_bases=[0], max_staleness=5)
    # S = 0: never while anyone trains.
    assert not merge_due(4, 2, may_still_report=1, version=2, training_bases=[2], max_staleness=0)


def test_merge_members_are_ordered_by_id_not_by_arrival():
    assert merge_members([[4], [0, 1], [2, 3]]) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("buffer", [None, 2])
def test_no_staleness_is_the_sync_run_bit_for_bit(tmp_path, buffer):
    train(pop_grpo(*BASE), tmp_path / "sync", progress=False)
    extra = ["scheduler.mode=async"] + ([f"scheduler.buffer={buffer}"] if buffer else [])
    train(pop_grpo(*BASE, *extra), tmp_path / "async", progress=False)
    pd.testing.assert_frame_equal(
        _metrics(tmp_path / "sync"),
        _metrics(tmp_path / "async"),
    )
    sync, asyn = _lineage(tmp_path / "sync"), _lineage(tmp_path / "async")
    assert [{k: v for k, v in r.items() if k != "async"} for r in asyn] == sync
    assert [r["async"]["members"] for r in asyn] == [[0, 1, 2, 3, 4]] * 2


def test_bounded_staleness_merges_the_reporters_and_keeps_the_bound(tmp_path):
    cfg = pop_grpo(*BASE, "scheduler.mode=async", "scheduler.buffer=2", "scheduler.max_staleness=1", "run.epochs=40")
    train(cfg, tmp_path / "run", progress=False)
    records = _lineage(tmp_path / "run")
    assert len(records) > 3  # more merges than the sync run's 3
    for record in records:
        part = record["async"]
        merge = part["merge"]
        assert merge == records.index(record)
        assert set(part["members"]).isdisjoint(int(k) for k in part["still_training"])
        assert all(merge + 1 - base <= 1 for base in part["still_training"].values())
        assert sorted(record["selected"]) == sorted(set(record["selected"]) & set(part["members"]))
    metrics = pd.read_parquet(tmp_path / "run" / "metrics.parquet")
    assert metrics.groupby("member")["epoch"].agg(["count", "max"]).eq([40, 39]).all().all()


def test_async_config_errors():
    with pytest.raises(ConfigError, match=r"scheduler\.mode=async needs scheduler\.enabled=true"):
        load_config(preset_path("grpo"), ["scheduler.mode=async"])
    with pytest.raises(ConfigError, match=r"scheduler.buffer \(6\) must be <= population.size \(5\)"):
        pop_grpo(*BASE, "scheduler.mode=async", "scheduler.buffer=6")


@pytest.mark.heavy
@pytest.mark.ray
def test_on_ray_no_staleness_is_sync_and_packed_actors_report_together(ray_local, tmp_path):
    from popgrpo.runtime.ray_executor import RayExecutor

    def on_ray(cfg, run_dir):
        return RayExecutor(cfg, run_dir=run_dir)

    cpus = "population.resources.num_cpus=0.4"  # the test Ray has 2 CPUs
    train(pop_grpo(*BASE, cpus), tmp_path / "sync", executor_factory=on_ray, progress=False)
    train(pop_grpo(*BASE, cpus, "scheduler.mode=async"), tmp_path / "async", executor_factory=on_ray, progress=False)
    pd.testing.assert_frame_equal(
        _metrics(tmp_path / "sync"),
        _metrics(tmp_path / "async"),
    )
    packed = pop_grpo(*BASE, cpus, "scheduler.mode=async", "scheduler.buffer=2", "scheduler.max_staleness=1",
                     "population.members_per_actor=2")  # fmt: skip
    reuse = Checkpointer._reuse
    linked: list[str] = []

    def spy(source, target):  # a restore point not renewed since the last checkpoint is linked
        linked.append(target.name)
        return reuse(source, target)

    with mock.patch.object(Checkpointer, "_reuse", staticmethod(spy)):
        train(packed, tmp_path / "packed", executor_factory=on_ray, progress=False)
    assert linked and set(linked) <= {f"member_{k:04d}.pt" for k in range(5)}
    groups = [[0, 1], [2, 3], [4]]
    for record in _lineage(tmp_path / "packed"):
        members = set(record["async"]["members"])
        assert all(set(g) <= members or members.isdisjoint(g) for g in groups)  # an actor reports whole
    assert pd.read_parquet(tmp_path / "packed" / "metrics.parquet").groupby("member").size().eq(30).all()


# The killed-actor runs: four members in pairs on Ray, rounds of two 8-step epochs, QD on.
KILLED_SHAPE = ["population.size=4", "population.members_per_actor=2", "population.resources.num_cpus=0.5",
                "run.epochs=6", "scheduler.interval_epochs=2", "grpo.steps_per_epoch=8", "qd.enabled=true"]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted_in_process(tmp_path_factory):
    """The in-process run the killed-actor runs must equal: its metrics."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    train(pop_grpo(*BASE, *KILLED_SHAPE), run_dir, progress=False)
    return _metrics(run_dir)


@pytest.mark.ray
@pytest.mark.parametrize("when", ["training", "waiting"])
def test_a_member_actor_killed_is_rebuilt_and_the_run_is_unchanged(ray_local, tmp_path, when, uninterrupted_in_process):
    """S = 0 makes the run deterministic, so a SIGKILLed actor rebuilt from its members' restore
    points must give the uninterrupted in-process numbers: killed in its round-1 training (it
    restarts from the merge its members adopted), or idle after its round-0 report, waiting for
    the merge (its rebuild must redo the reported round before it adopts)."""
    import os
    import signal

    import ray

    from popgrpo.runtime.ray_executor import RayExecutor
    from tests.driving import kill_when_busy

    killed = []

    def sigkill(executor):
        return lambda: os.kill(ray.get(executor._actors[0].pid.remote()), signal.SIGKILL)

    def killing(cfg, run_dir):
        executor = RayExecutor(cfg, run_dir=run_dir)
        adopt, wait = executor.adopt, executor.wait_train

        def adopt_then_arm(*args, **kwargs):  # the actor's next call is its round-1 train
            infos = adopt(*args, **kwargs)
            if when == "training" and not killed:
                killed.append(kill_when_busy(executor._actors[0], sigkill(executor)))
            return infos

        def wait_then_kill(handles):
            handle, rows = wait(handles)
            if when == "waiting" and not killed and handle[0] == 0:
                sigkill(executor)()
                killed.append(None)
            return handle, rows

        executor.adopt, executor.wait_train = adopt_then_arm, wait_then_kill
        return executor

    train(
        pop_grpo(*BASE, *KILLED_SHAPE, "scheduler.mode=async"),
        tmp_path / "killed",
        executor_factory=killing,
        progress=False,
    )
    assert killed and (killed[0] is None or killed[0].wait(timeout=5))
    events = [json.loads(line) for line in (tmp_path / "killed" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("member_actor_restarted") == 1
    pd.testing.assert_frame_equal(uninterrupted_in_process, _metrics(tmp_path / "killed"))


class _Crash(RuntimeError):
    pass


def test_resume_after_a_crash_mid_run_gives_the_uninterrupted_run(tmp_path):
    """In-process, reports come in submission order, which the checkpoint keeps: a run that
    dies between two merges and is resumed merges as the uninterrupted one did."""
    from popgrpo.runtime.executor import LocalExecutor

    cfg = pop_grpo(*BASE, "scheduler.mode=async", "scheduler.buffer=2", "scheduler.max_staleness=1", "run.epochs=40")
    train(cfg, tmp_path / "whole", progress=False)

    def crashing(c, _run_dir):
        executor = LocalExecutor(c)
        calls = {"n": 0}
        wait = executor.wait_train

        def wait_then_crash(handles):
            calls["n"] += 1
            if calls["n"] == 9:  # after a few merges, mid-round for some members
                raise _Crash("driver lost")
            return wait(handles)

        executor.wait_train = wait_then_crash  # type: ignore[method-assign]
        return executor

    with pytest.raises(_Crash):
        train(cfg, tmp_path / "resumed", executor_factory=crashing, progress=False)
    assert (tmp_path / "resumed" / "checkpoints" / "latest.json").is_file()
    resume(tmp_path / "resumed", progress=False)
    pd.testing.assert_frame_equal(
        _metrics(tmp_path / "whole"),
        _metrics(tmp_path / "resumed"),
    )
    assert _lineage(tmp_path / "whole") == _lineage(tmp_path / "resumed")
    assert (tmp_path / "resumed" / "archive.parquet").read_bytes() == (
        tmp_path / "whole" / "archive.parquet"
    ).read_bytes()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_checkpoints_every_third_round_resume_to_the_run_that_checkpoints_every_round(tmp_path, mode):
    """run.checkpoint_every=3: checkpoints after rounds (merges) 2, 5, … and the last only; the
    numbers are those of a run that checkpoints every round, and a run that dies past a
    checkpoint resumes from it, recomputes what came after, and ends the same."""
    from popgrpo.runtime.executor import LocalExecutor
    from popgrpo.telemetry.checkpoint import Checkpointer

    extra = ["run.epochs=80", "scheduler.interval_epochs=5", "grpo.steps_per_epoch=1"]
    if mode == "async":
        extra += ["scheduler.mode=async", "scheduler.buffer=2", "scheduler.max_staleness=1"]
    train(pop_grpo(*BASE, *extra, "run.checkpoint_keep=40"), tmp_path / "every", progress=False)
    cfg = pop_grpo(*BASE, *extra, "run.checkpoint_every=3")
    train(
        pop_grpo(*BASE, *extra, "run.checkpoint_every=3", "run.checkpoint_keep=40"), tmp_path / "third", progress=False
    )
    pd.testing.assert_frame_equal(_metrics(tmp_path / "every"), _metrics(tmp_path / "third"))
    assert _lineage(tmp_path / "every") == _lineage(tmp_path / "third")
    every = sorted(p.name for p in (tmp_path / "every" / "checkpoints").glob("round_*"))
    third = sorted(p.name for p in (tmp_path / "third" / "checkpoints").glob("round_*"))
    last = int(every[-1].removeprefix("round_"))
    assert [int(n.removeprefix("round_")) for n in third] == [*range(2, last, 3), last]

    def crashing(c, _run_dir):  # the driver dies at its 11th train report: past a checkpoint, mid-run
        executor = LocalExecutor(c)
        name = "wait_train" if mode == "async" else "train"
        inner, calls = getattr(executor, name), {"n": 0}

        def crash_at_the_11th(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 11:
                raise _Crash("driver lost")
            return inner(*args, **kwargs)

        setattr(executor, name, crash_at_the_11th)
        return executor

    with pytest.raises(_Crash):
        train(cfg, tmp_path / "resumed", executor_factory=crashing, progress=False)
    info = Checkpointer(tmp_path / "resumed").latest()
    assert info is not None and (info["round"] + 1) % 3 == 0  # a checkpoint of the schedule, rounds behind
    # run.checkpoint_keep counts checkpoints, not rounds: the one before the newest is kept too.
    kept = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").glob("round_*"))
    assert len(kept) == min(2, (info["round"] + 1) // 3) and kept[-1] == f"round_{info['round']:04d}"
    resume(tmp_path / "resumed", progress=False)
    pd.testing.assert_frame_equal(_metrics(tmp_path / "every"), _metrics(tmp_path / "resumed"))
    assert _lineage(tmp_path / "every") == _lineage(tmp_path / "resumed")
    assert (tmp_path / "resumed" / "archive.parquet").read_bytes() == (
        tmp_path / "every" / "archive.parquet"
    ).read_bytes()
