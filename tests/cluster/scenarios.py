"""Drivers of the tests that kill Ray's GCS or a node, run as a subprocess of the test.

``python tests/cluster/scenarios.py SCENARIO RESULT.json`` starts its own loopback cluster,
runs a short Pop-GRPO run on it through :class:`RayExecutor`, injects the fault, and writes
the run's metrics rows, lineage and what it observed to ``RESULT.json``. The test runs it with
:func:`tests.services.run_isolated`: a driver whose Ray gives up (a core worker that loses the
GCS for too long ends its process) can end only this subprocess, never pytest; a hard timeout
and a watchdog stop everything it started.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# What each scenario trains: the test computes its undisturbed reference from the same overrides.
CONFIGS = {
    "gcs_outage": [
        "population.size=4",
        "population.members_per_actor=2",
        "population.resources.num_cpus=1",
        "run.epochs=12",  # 6 rounds: 1-4 with the GCS down, 5 after it is back
        "scheduler.interval_epochs=2",
        "grpo.steps_per_epoch=10",
    ],
    "node_loss": [
        "population.size=4",
        "population.members_per_actor=2",
        "population.resources.num_cpus=1",
        "run.epochs=6",
        "scheduler.interval_epochs=2",
        "grpo.steps_per_epoch=8",
    ],
}
# frozen_node: deadlines short enough for a test (a frozen node's actors are found by them).
FROZEN_DEADLINES = [
    "population.hang_deadline_factor=8",
    "population.hang_deadline_min_s=3",
    "population.max_restarts=5",
]
GCS_OUTAGE_S = 15.0  # at least as long as a restarted head pod takes to come back


def _config(scenario: str):
    from popgrpo.config import load_config, preset_path

    return load_config(preset_path("pop_grpo"), CONFIGS[scenario])


def gcs_outage() -> dict:
    """The GCS keeps its tables in Redis; it is killed after round 0 and restarted ≥ 15 s later.

    Rounds 1 to 4 run with the GCS down; if they take less than the outage, the driver waits
    after round 4 until it has lasted GCS_OUTAGE_S, then restarts the GCS, and round 5 runs
    with it back: whatever the machine's speed, the outage lies inside the run.
    """
    import ray
    import redis

    from benchmarks.common import loopback_ray_cluster
    from popgrpo.runtime.ray_executor import RayExecutor
    from tests.driving import drive
    from tests.services import free_port

    port, password = int(os.environ["POPGRPO_TEST_REDIS_PORT"]), os.environ["POPGRPO_TEST_REDIS_PASSWORD"]
    os.environ["RAY_REDIS_ADDRESS"] = f"127.0.0.1:{port}"
    head_args = {
        "num_cpus": 2,
        "redis_password": password,
        "gcs_server_port": free_port(),  # a restarted GCS must come back where the raylet looks
        "include_dashboard": False,
        "_system_config": {"gcs_rpc_server_reconnect_timeout_s": 120},
    }
    cfg = _config("gcs_outage")
    n_rounds = cfg.run.epochs // cfg.scheduler.interval_epochs
    facts: dict = {}
    with loopback_ray_cluster(head_args, prefix="pggcs-") as (cluster, _, _):
        facts["redis_keys"] = redis.Redis(port=port, password=password).dbsize()
        head = cluster.head_node

        def outage(i, _executor):
            if i == 0:
                facts["old_pid"] = head.all_processes["gcs_server"][0].process.pid
                head.kill_gcs_server()
                facts["down"] = time.time()
            elif i == n_rounds - 2:
                facts["rounds_run_while_down"] = i
                time.sleep(max(0.0, facts["down"] + GCS_OUTAGE_S - time.time()))
                head.start_gcs_server()
                facts["up"] = time.time()

        executor = RayExecutor(cfg)
        try:
            rows, lineage = drive(cfg, executor, after_round=outage)
            facts["finished"] = time.time()
            facts["alive"] = bool(ray.get(executor._actors[0].node_id.remote(), timeout=60))
            facts["restarts"] = executor.restarts
        finally:
            executor.close()
        facts["new_pid"] = head.all_processes["gcs_server"][0].process.pid
    return {"rows": rows, "lineage": lineage, **facts}


def node_loss() -> dict:
    """Head (no CPUs: driver only) + two 2-CPU workers; one worker is removed mid-round 1."""
    import ray

    from benchmarks.common import loopback_ray_cluster
    from popgrpo.runtime.ray_executor import RayExecutor
    from tests.driving import drive, kill_when_busy

    cfg = _config("node_loss")
    facts: dict = {}
    with loopback_ray_cluster({"num_cpus": 0}, worker_cpus=(2, 2), prefix="pgnode-") as (cluster, workers, _):
        victim = workers[0]
        removed = []

        def remove_worker_during_round_1(ex):
            # The node goes while an actor on it is in its round-1 train call, however short a round.
            on_victim = next(a for a in ex._actors if ray.get(a.node_id.remote()) == victim.node_id)
            removed.append(kill_when_busy(on_victim, lambda: cluster.remove_node(victim, allow_graceful=False)))

        executor = RayExecutor(cfg)
        try:
            rows, lineage = drive(cfg, executor, remove_worker_during_round_1)
            placements = set(ray.get([a.node_id.remote() for a in executor._actors]))
        finally:
            executor.close()
        facts["removed"] = bool(removed and removed[0].wait(timeout=5))
        facts["restarts"] = executor.restarts
        facts["restart_events"] = [e["event"] for e in executor.events].count("member_actor_restarted")
        facts["victim_still_used"] = victim.node_id in placements
    return {"rows": rows, "lineage": lineage, **facts}


def answer_lost() -> dict:
    """As :func:`node_loss`, but the node goes between an actor's answer and the driver's fetch.

    From round 1 on, the first answer the executor fetches that is stored only on the victim
    node (one too large to travel inline, such as the states ``adopt`` sends back) has its node
    removed just before the fetch: the actor has answered, its answer is lost with the node.
    The executor's ``ray.wait`` is made not to copy a ready answer to the driver's node, so the
    answer is still only on the victim when it is fetched: the moment that a loaded machine
    produced by chance once (an ``ObjectReconstructionFailedError`` out of ``adopt``).
    """
    import ray

    from benchmarks.common import loopback_ray_cluster
    from popgrpo.runtime import ray_executor
    from popgrpo.runtime.ray_executor import RayExecutor
    from tests.driving import drive

    cfg = _config("node_loss")
    facts: dict = {"removed": False}
    with loopback_ray_cluster({"num_cpus": 0}, worker_cpus=(2, 2), prefix="pgansw-") as (cluster, workers, _):
        victim = workers[0]
        armed = []

        class RemoveBeforeFetch:
            """``ray`` as the executor sees it, but ``get`` first removes the victim node when
            armed and the answer asked for lies only there."""

            def __getattr__(self, name):
                return getattr(ray, name)

            def wait(self, refs, *args, **kwargs):
                # Ready without copying it here: the answer still lies only where it was made.
                return ray.wait(refs, *args, **{**kwargs, "fetch_local": False})

            def get(self, refs, *args, **kwargs):
                if armed and not facts["removed"] and isinstance(refs, ray.ObjectRef):
                    where = ray.experimental.get_object_locations([refs]).get(refs, {})
                    if where.get("node_ids") == [victim.node_id]:
                        facts["removed"] = True
                        facts["object_size"] = where.get("object_size")
                        cluster.remove_node(victim, allow_graceful=False)
                return ray.get(refs, *args, **kwargs)

        ray_executor.ray = RemoveBeforeFetch()
        executor = RayExecutor(cfg)
        try:
            rows, lineage = drive(cfg, executor, lambda ex: armed.append(True))
            placements = set(ray.get([a.node_id.remote() for a in executor._actors]))
        finally:
            executor.close()
            ray_executor.ray = ray
        facts["restarts"] = executor.restarts
        facts["restart_reasons"] = [e["reason"] for e in executor.events if e["event"] == "member_actor_restarted"]
        facts["victim_still_used"] = victim.node_id in placements
    return {"rows": rows, "lineage": lineage, **facts}


def node_loss_async() -> dict:
    """As :func:`node_loss`, in asynchronous rounds (S = 0: deterministic), through ``train``:
    a worker is removed while an actor on it is training; the run completes on the other."""
    import tempfile

    import pandas as pd
    import ray

    from benchmarks.common import loopback_ray_cluster
    from popgrpo.config import load_config, preset_path
    from popgrpo.runtime.ray_executor import RayExecutor
    from popgrpo.train import train
    from tests.driving import kill_when_busy

    cfg = load_config(preset_path("pop_grpo"), [*CONFIGS["node_loss"], "scheduler.mode=async", "run.loggers=[]"])
    facts: dict = {}
    with loopback_ray_cluster({"num_cpus": 0}, worker_cpus=(2, 2), prefix="pgnodea-") as (cluster, workers, _):
        victim = workers[0]
        removed = []
        holder = {}

        def on_ray(c, run_dir):
            ex = RayExecutor(c, run_dir=run_dir)
            holder["executor"] = ex
            on_victim = next(a for a in ex._actors if ray.get(a.node_id.remote()) == victim.node_id)
            removed.append(kill_when_busy(on_victim, lambda: cluster.remove_node(victim, allow_graceful=False)))
            return ex

        with tempfile.TemporaryDirectory(prefix="pgnodea-run-") as tmp:
            train(cfg, Path(tmp) / "run", executor_factory=on_ray, progress=False)
            metrics = pd.read_parquet(Path(tmp) / "run" / "metrics.parquet")
        facts["removed"] = bool(removed and removed[0].wait(timeout=5))
        facts["restarts"] = holder["executor"].restarts
    rows = metrics.drop(columns=["seconds"], errors="ignore").to_dict("records")
    return {"rows": rows, **facts}


def frozen_node() -> dict:
    """As :func:`node_loss`, but the worker node freezes instead of going: every process of it
    (raylet, agents, workers) is SIGSTOPped while an actor on it is in its round-1 train call.

    Ray does not notice a frozen node for a long while, and ``ray.kill`` reaches nothing there:
    the driver must take the actor as hung (its deadline), find that its node does not run the
    kill task, take the node as lost and build the replacement on the other node. Short
    deadlines (the floor 3 s) keep the test short; the node's 30 s to answer the kill task are
    what they are in a run.
    """
    import contextlib
    import signal

    import ray

    from benchmarks.common import _children, loopback_ray_cluster
    from popgrpo.config import load_config, preset_path
    from popgrpo.runtime.ray_executor import RayExecutor
    from tests.driving import drive, kill_when_busy

    cfg = load_config(preset_path("pop_grpo"), [*CONFIGS["node_loss"], *FROZEN_DEADLINES])
    facts: dict = {}
    frozen: list[int] = []
    with loopback_ray_cluster({"num_cpus": 0}, worker_cpus=(2, 2), prefix="pgfrz-") as (_cluster, workers, _):
        victim = workers[0]
        stopped = []

        def node_processes() -> list[int]:
            """The victim node's processes: those Ray started for it, and their descendants."""
            children = _children()
            todo = [info.process.pid for infos in victim.all_processes.values() for info in infos]
            found: list[int] = []
            while todo:
                pid = todo.pop()
                if pid not in found:
                    found.append(pid)
                    todo.extend(children.get(pid, []))
            return found

        def freeze() -> None:
            for pid in node_processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    frozen.append(pid)
            facts["frozen_at"] = time.monotonic()

        def freeze_during_round_1(ex):
            on_victim = next(a for a in ex._actors if ray.get(a.node_id.remote(), timeout=60) == victim.node_id)
            stopped.append(kill_when_busy(on_victim, freeze))

        executor = RayExecutor(cfg)
        try:
            rows, lineage = drive(cfg, executor, freeze_during_round_1)
            facts["finished_after_s"] = time.monotonic() - facts["frozen_at"]
            placements = set(ray.get([a.node_id.remote() for a in executor._actors], timeout=60))
        finally:
            executor.close()
            for pid in frozen:  # ours: a frozen node's processes never outlive the test
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        facts["frozen"] = bool(stopped and stopped[0].wait(timeout=5)) and len(frozen)
        facts["restarts"] = executor.restarts
        facts["restart_reasons"] = [e["reason"] for e in executor.events if e["event"] == "member_actor_restarted"]
        facts["victim_still_used"] = victim.node_id in placements
        facts["lost_nodes"] = sorted(executor._lost_nodes)
        facts["victim"] = victim.node_id
    return {"rows": rows, "lineage": lineage, **facts}


def remote_answer() -> dict:
    """A call whose actor runs on a worker node and answers 32 MB, which stays in that node's
    object store: :func:`~popgrpo.runtime.ray_executor.first_answered`, asked with no time left
    as the driver asks after a rebuild past the call's deadline, reports it answered without
    pulling it to the driver's node; the fetch then pulls it."""
    import numpy as np
    import ray

    from benchmarks.common import loopback_ray_cluster
    from popgrpo.runtime.ray_executor import first_answered

    @ray.remote(num_cpus=1)
    class Answers:
        def big(self) -> np.ndarray:
            return np.ones(4_000_000)

        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    facts: dict = {}
    with loopback_ray_cluster({"num_cpus": 0}, worker_cpus=(1,), prefix="pgans-") as (_cluster, workers, _):
        actor = Answers.remote()
        facts["on_worker"] = ray.get(actor.node.remote(), timeout=120) == workers[0].node_id
        ref = actor.big.remote()
        asked, deadline = 0, time.monotonic() + 120
        while not first_answered([ref], 0.0) and time.monotonic() < deadline:
            asked += 1
            time.sleep(0.05)
        facts["answered"] = bool(first_answered([ref], 0.0))
        facts["asked"] = asked
        head = ray.get_runtime_context().get_node_id()
        locations = ray.experimental.get_object_locations([ref], timeout_ms=30_000)[ref]["node_ids"]
        facts["pulled_by_asking"] = head in locations
        facts["only_on_worker"] = locations == [workers[0].node_id]
        facts["fetched"] = float(ray.get(ref, timeout=120).sum()) == 4_000_000.0
    return facts


def run(scenario: str, workdir: Path, extra_env: dict[str, str] | None = None, timeout: float = 600.0) -> dict:
    """Run ``scenario`` in an isolated subprocess (the test side); its result, or an AssertionError
    carrying the tail of its output."""
    from tests.services import run_isolated

    result_path = workdir / f"{scenario}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_REDIS_ADDRESS")}
    env |= {"PYTHONPATH": str(ROOT)} | (extra_env or {})
    done = run_isolated([sys.executable, __file__, scenario, str(result_path)], timeout, env=env, cwd=str(ROOT))
    (workdir / f"{scenario}.log").write_text(done.stdout)
    out = done.stdout if len(done.stdout) <= 8000 else f"{done.stdout[:3000]}\n[…]\n{done.stdout[-5000:]}"
    assert done.returncode == 0 and result_path.is_file(), f"{scenario} driver exited {done.returncode}:\n{out}"
    return json.loads(result_path.read_text())


if __name__ == "__main__":
    scenario, result_path = sys.argv[1], sys.argv[2]
    result = {
        "gcs_outage": gcs_outage,
        "node_loss": node_loss,
        "answer_lost": answer_lost,
        "node_loss_async": node_loss_async,
        "frozen_node": frozen_node,
        "remote_answer": remote_answer,
    }[scenario]()
    Path(result_path).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: Ray's native threads can crash in it (tests/conftest.py)
