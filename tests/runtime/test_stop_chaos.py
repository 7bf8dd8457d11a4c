"""Chaos for stopped processes: SIGSTOP, beside the SIGKILL chaos of test_chaos.py.

A stopped process does not die: Ray never reports it lost, ``ray.kill`` never reaches it and
it keeps its CPUs. Each test stops member actor processes (or the archive actor's) at points of
their life — being constructed, training, adopting, in the checkpoint's ``snapshot``, being
rebuilt after an earlier stop — and the run must finish: each stopped actor is taken as hung,
its process SIGKILLed (:mod:`popgrpo.runtime.reaper`) and it is rebuilt from its restore
point. Sync rounds, and async rounds with ``scheduler.order=logical``, are deterministic, so
their numbers must equal the undisturbed in-process run's. Short deadlines keep each stop's
cost to seconds (``population.hang_deadline_min_s=2``).

The frozen node (every process of one worker node of a ``ray.cluster_utils.Cluster`` stopped)
is in tests/cluster/test_node_loss.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.runtime.reaper import locate
from popgrpo.telemetry.checkpoint import Checkpointer
from popgrpo.train import train
from tests.driving import kill_when_busy, member_group_processes

pytestmark = [pytest.mark.ray, pytest.mark.heavy]

SHAPE = (
    "run.seed=42",
    "run.loggers=[]",
    "population.size=4",
    "population.members_per_actor=2",
    "population.resources.num_cpus=0.5",  # the test Ray has 2 CPUs
    "run.epochs=8",
    "scheduler.interval_epochs=2",
    "grpo.steps_per_epoch=8",
    # Short deadlines, so that a stop costs seconds; many restarts, so that a false positive on
    # a loaded machine (a healthy call taken as hung: one more rebuild, same numbers) is no failure.
    "population.hang_deadline_factor=8",
    "population.hang_deadline_min_s=2",
    "population.max_restarts=10",
)
ASYNC = (
    "scheduler.mode=async",
    "scheduler.buffer=2",
    "scheduler.max_staleness=1",
    "scheduler.order=logical",
    "population.straggler.scale_s=0.05",
    "population.straggler.sigma=1.0",
)


def pop_grpo(*overrides: str):
    return load_config(preset_path("pop_grpo"), list(overrides))


class Stops:
    """SIGSTOPs processes and remembers them; :meth:`cleanup` SIGKILLs whatever of them is left
    (only processes this test stopped, all of them descendants of its own Ray)."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int]] = []  # (moment, pid)
        self.lock = threading.Lock()

    def stop(self, moment: str, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        with self.lock:
            self.done.append((moment, pid))

    def moments(self) -> list[str]:
        return [moment for moment, _ in self.done]

    def cleanup(self) -> None:
        for _, pid in self.done:
            if pid <= 0:  # never a process group, nor every process
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def pid_of(actor, timeout: float = 120.0) -> int:
    """``actor``'s process id from Ray's actor table, as soon as Ray has given it one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = locate(actor)[0]
        if pid is not None:
            return pid
        time.sleep(0.01)
    raise TimeoutError("the actor got no process")


class StoppingExecutor(RayExecutor):
    """A :class:`RayExecutor` that SIGSTOPs an actor's process at the moments of ``plan``
    (moment → which occurrence): ``train`` (mid-call: once a probe finds it busy), ``adopt``
    and ``snapshot`` (right before the call is sent: the call lands on a stopped process),
    ``rebuild`` (a replacement, as soon as Ray has given it a process: inside its
    construction or the replay into it)."""

    def __init__(self, cfg, stops: Stops, plan: dict[str, int], run_dir=None) -> None:
        self.stops, self.plan, self.seen = stops, plan, Counter()
        self.probes: list[threading.Event] = []
        super().__init__(cfg, run_dir=run_dir)

    def _due(self, moment: str) -> bool:
        if moment not in self.plan:
            return False
        self.seen[moment] += 1
        return self.seen[moment] == self.plan[moment]

    def _stop_when_busy(self, g: int) -> None:
        actor = self._actors[g]
        pid = pid_of(actor)
        self.probes.append(kill_when_busy(actor, lambda: self.stops.stop("train", pid)))

    def _call(self, method, args_for, groups=None, replayable=False, after_sent=None):
        if method in ("adopt", "snapshot") and self._due(method):
            g = next(iter(range(len(self._actors)) if groups is None else groups))
            self.stops.stop(method, pid_of(self._actors[g]))
        if method == "train" and self.config.scheduler.mode == "sync" and self._due("train"):
            self._stop_when_busy(0)
        return super()._call(method, args_for, groups, replayable, after_sent)

    def submit_train(self, g, n_epochs):
        handle = super().submit_train(g, n_epochs)
        if self.config.scheduler.mode == "async" and self._due("train"):
            self._stop_when_busy(g)
        return handle

    def close(self) -> None:
        """First, what the dashboard's actor list shows: each member actor name's states."""
        import ray
        from ray.util.state import list_actors

        self.listed: dict[str, list[str]] = {}
        address = ray.get_runtime_context().gcs_address  # this cluster's, whatever else runs on the machine
        for a in list_actors(
            address=address, filters=[("ray_namespace", "=", self.namespace)], limit=1000, detail=True
        ):
            self.listed.setdefault(a.name, []).append(a.state)
        super().close()

    def _new_group(self, group, build=0):
        actor = super()._new_group(group, build)
        if build > 0 and self._due("rebuild"):
            threading.Thread(target=lambda: self.stops.stop("rebuild", pid_of(actor)), daemon=True).start()
        return actor


def stop_in_constructor(stops: Stops, timeout: float = 300.0) -> threading.Thread:
    """SIGSTOP the first member actor process seen inside ``MemberGroup.__init__``."""

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid, title in member_group_processes().items():
                if title.startswith("ray::MemberGroup.__init__"):
                    stops.stop("constructing", pid)
                    return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns=["seconds"], errors="ignore")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_same_run(a: Path, b: Path) -> None:
    """Metrics, lineage, merges (async) and every member's final weights, bit for bit."""
    pd.testing.assert_frame_equal(_metrics(a), _metrics(b))
    assert _lines(a / "lineage.jsonl") == _lines(b / "lineage.jsonl")
    assert _lines(a / "merges.jsonl") == _lines(b / "merges.jsonl")
    wa, wb = (Checkpointer(d) for d in (a, b))
    la, lb = wa.latest(), wb.latest()
    assert la is not None and lb is not None
    for sa, sb in zip(wa.load(la)[0], wb.load(lb)[0], strict=True):
        assert all(torch.equal(sa["policy"][n], sb["policy"][n]) for n in sa["policy"])


def _run_with_stops(tmp_path: Path, cfg, plan: dict[str, int], in_constructor: bool = False):
    """The in-process reference and a Ray run of ``cfg`` whose processes are stopped at ``plan``;
    returns (the Ray run's directory, its summary, the stops made, its hung-restart events)."""
    train(cfg, tmp_path / "reference", progress=False)
    stops = Stops()
    executors: list[StoppingExecutor] = []

    def factory(c, run_dir):
        executors.append(StoppingExecutor(c, stops, plan, run_dir=run_dir))
        return executors[0]

    start = time.monotonic()
    try:
        if in_constructor:
            stop_in_constructor(stops)
        summary = train(cfg, tmp_path / "stopped", executor_factory=factory, progress=False)
    finally:
        stops.cleanup()
    seconds = time.monotonic() - start
    events = _events(tmp_path / "stopped")
    hung = [e for e in events if e.get("cause") == "hung"]
    print(f"stops {stops.done}; {seconds:.0f} s; " + " | ".join(e["reason"] for e in hung))  # pytest -s
    # The dashboard's actor list: a replaced actor's name shows the old actor dead, the new alive.
    listed = executors[0].listed
    for e in hung:
        name = next(n for n in listed if n.endswith(f"/members-{e['members'][0]}-{e['members'][-1]}"))
        assert "ALIVE" in listed[name] and listed[name].count("DEAD") >= 1, listed
    return tmp_path / "stopped", summary, stops, hung


@pytest.mark.timeout(900)
def test_members_stopped_training_adopting_and_in_the_checkpoint_leave_a_sync_run_unchanged(ray_local, tmp_path):
    cfg = pop_grpo(*SHAPE)
    run_dir, summary, stops, hung = _run_with_stops(tmp_path, cfg, {"train": 2, "adopt": 3, "snapshot": 1})
    assert sorted(stops.moments()) == ["adopt", "snapshot", "train"]
    assert len(hung) >= 3 and summary["restarts_hung"] >= 3 and summary["restarts"] >= summary["restarts_hung"]
    assert all("replaced in" in e["reason"] and "SIGKILL" in e["reason"] for e in hung)
    _assert_same_run(tmp_path / "reference", run_dir)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_members_stopped_at_every_point_leave_an_async_logical_run_unchanged(ray_local, tmp_path):
    cfg = pop_grpo(*SHAPE, *ASYNC)
    plan = {"train": 3, "adopt": 2, "snapshot": 1, "rebuild": 1}
    run_dir, summary, stops, hung = _run_with_stops(tmp_path, cfg, plan)
    assert sorted(stops.moments()) == sorted(plan)
    assert len(hung) >= 3 and summary["restarts_hung"] >= 3  # the rebuild's stop is retried within its rebuild
    _assert_same_run(tmp_path / "reference", run_dir)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_members_stopped_constructing_and_being_rebuilt_leave_the_run_unchanged(ray_local, tmp_path, mode):
    cfg = pop_grpo(*SHAPE, *(ASYNC if mode == "async" else ()))
    run_dir, _, stops, hung = _run_with_stops(tmp_path, cfg, {"rebuild": 1}, in_constructor=True)
    assert sorted(stops.moments()) == ["constructing", "rebuild"]
    assert hung and any("placement" in e["reason"] for e in hung)
    assert any(e["tries"] >= 2 for e in hung)  # the replacement stopped too: ended and built again
    _assert_same_run(tmp_path / "reference", run_dir)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stopped_archive_actor_is_restarted_and_the_run_finishes(ray_local, tmp_path, mode):
    """A shared archive lives in the archive actor, which every member calls at each step: one
    stopped stalls them all. It is taken as hung, SIGKILLed and restarted by Ray (from the last
    checkpoint's snapshot, as after a crash); the members go on, their calls timed from the restart."""
    cfg = pop_grpo(*SHAPE, "archive.shared=true", *(ASYNC if mode == "async" else ()))
    stops = Stops()
    holder: dict = {}

    def factory(c, run_dir):
        holder["executor"] = RayExecutor(c, run_dir=run_dir)
        return holder["executor"]

    def stopper():
        latest = tmp_path / "run" / "checkpoints" / "latest.json"
        while not latest.exists():
            time.sleep(0.005)
        ex = holder["executor"]
        member = ex._actors[0]
        kill_when_busy(member, lambda: stops.stop("archive", pid_of(ex.archive_actor))).wait(timeout=120)

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    try:
        summary = train(cfg, tmp_path / "run", executor_factory=factory, progress=False)
    finally:
        thread.join(timeout=5)
        stops.cleanup()
    assert stops.moments() == ["archive"]
    assert summary["epochs"] == 8
    events = _events(tmp_path / "run")
    restarted = [e for e in events if e["event"] == "archive_actor_restarted"]
    assert restarted and restarted[0]["cause"] == "hung" and "SIGKILL" in restarted[0]["reason"], events
    print(restarted[0]["reason"])


@pytest.mark.slow
@pytest.mark.solo  # exactly one replacement: another test's load could make a second
@pytest.mark.timeout(1200)
def test_a_stopped_rollout_worker_is_replaced_and_the_run_is_unchanged(ray_local, tiny_lm):
    """Every language-model member generates on the rollout worker: stopped, it stalls them
    all. It is found stopped, ended, started anew, and every member actor is rebuilt from its
    restore point (pushing its adapter to the new worker): the in-process run's numbers."""
    from popgrpo.runtime.executor import LocalExecutor
    from tests.driving import drive
    from tests.lm import lm_config
    from tests.services import require_module

    require_module("peft")
    cfg = lm_config(
        tiny_lm,
        run={"epochs": 4, "seed": 1},
        grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03},
        scheduler={"interval_epochs": 2},
        population={"size": 2, "members_per_actor": 1, "resources": {"num_cpus": 0.5},
                    "hang_deadline_factor": 8, "hang_deadline_min_s": 2, "max_restarts": 5},
        policy={"kind": "causal_lm", "causal_lm": {"model": str(tiny_lm), "max_new_tokens": 8,
                "prompts_per_step": 2, "lora": {"r": 4}, "rollout": {"worker": True}}},
    )  # fmt: skip
    reference, _ = drive(cfg, LocalExecutor(cfg))
    stops, probes = Stops(), []
    executor = RayExecutor(cfg)

    def stop_worker_in_round_1(ex):  # round 1 has a measured round 0 to set its deadline
        worker_pid = pid_of(ex.rollout_worker)
        probes.append(kill_when_busy(ex._actors[0], lambda: stops.stop("rollout worker", worker_pid)))

    try:
        rows, _ = drive(cfg, executor, stop_worker_in_round_1)
    finally:
        executor.close()
        stops.cleanup()
    assert stops.moments() == ["rollout worker"]
    replaced = [e for e in executor.events if e["event"] == "rollout_worker_restarted"]
    assert len(replaced) == 1 and replaced[0]["cause"] == "hung", executor.events
    print(replaced[0]["reason"])
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(reference), check_exact=True)


class EvaluatorFaults(RayExecutor):
    """A :class:`RayExecutor` that SIGSTOPs its evaluator actor's process right before the
    ``stop_at``-th evaluation is sent, and SIGKILLs it before the ``kill_at``-th."""

    def __init__(self, cfg, stops: Stops, stop_at: int, kill_at: int, run_dir=None) -> None:
        self.stops, self.stop_at, self.kill_at, self.calls = stops, stop_at, kill_at, 0
        self.killed: list[int] = []
        super().__init__(cfg, run_dir=run_dir)

    def submit_evaluate(self, weights, round_index, purpose):  # every evaluation is sent through it
        self.calls += 1
        if self.calls == self.stop_at:
            self.stops.stop("evaluator stopped", pid_of(self.evaluator_actor))
        if self.calls == self.kill_at:
            pid = pid_of(self.evaluator_actor)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)
        return super().submit_evaluate(weights, round_index, purpose)


@pytest.mark.timeout(900)
def test_a_stopped_or_killed_evaluator_actor_leaves_the_run_unchanged(ray_local, tmp_path):
    """Greedy soup's candidates and the merged model are scored on the evaluator actor. Stopped,
    it is taken as hung; killed, as lost. Either way it is ended for real, a new one is started
    and the call made again, and the run's numbers are the in-process run's."""
    cfg = pop_grpo(*SHAPE, "scheduler.merge=greedy_soup")
    train(cfg, tmp_path / "reference", progress=False)
    stops = Stops()
    executors: list[EvaluatorFaults] = []

    def factory(c, run_dir):
        executors.append(EvaluatorFaults(c, stops, stop_at=2, kill_at=5, run_dir=run_dir))
        return executors[0]

    try:
        train(cfg, tmp_path / "faults", executor_factory=factory, progress=False)
    finally:
        stops.cleanup()
    assert stops.moments() == ["evaluator stopped"]
    assert len(executors[0].killed) == 1 and executors[0].calls > 5
    replaced = [e for e in _events(tmp_path / "faults") if e["event"] == "evaluator_actor_restarted"]
    print(" | ".join(e["reason"] for e in replaced))  # pytest -s
    assert [e["cause"] for e in replaced] == ["hung", "lost"], replaced
    assert all("SIGKILL" in e["reason"] for e in replaced)  # the stopped process is ended for real
    _assert_same_run(tmp_path / "reference", tmp_path / "faults")
