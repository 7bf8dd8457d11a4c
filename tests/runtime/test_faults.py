"""Fault tolerance on a real Ray: members killed mid-round, nodes lost, archive actor killed."""

import json
import os
import re
import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest
import ray
import torch

from popgrpo.runtime.cluster import SetupError
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.telemetry.checkpoint import Checkpointer
from popgrpo.train import train
from tests.configs import RAY_POPULATION, pop_grpo
from tests.driving import drive, kill_during_construction, kill_when_busy, same_rows, sigkill
from tests.services import RedisServer

pytestmark = [pytest.mark.ray, pytest.mark.heavy]

SHAPE = (*RAY_POPULATION, "run.epochs=6", "grpo.steps_per_epoch=8")


def _sigkill_member_actor_mid_round(cfg):
    """Run ``cfg`` on Ray, SIGKILL member actor 0 in the middle of round 1; rows, lineage, archives, restarts."""
    executor = RayExecutor(cfg)
    killed = []

    def during_round(ex):  # round 1 starts right after this returns
        pid = ray.get(ex._actors[0].pid.remote())
        killed.append(kill_when_busy(ex._actors[0], lambda: os.kill(pid, signal.SIGKILL)))

    try:
        rows, lineage = drive(cfg, executor, during_round)
        archives = executor.archives()
    finally:
        executor.close()
    assert killed and killed[0].wait(timeout=5)
    return rows, lineage, archives, executor.restarts


def _assert_same_archives(remote, local):
    assert len(remote) == len(local)
    for a, b in zip(remote, local, strict=True):
        ea, eb = a.grid.elites(), b.grid.elites()
        for key in ea:
            np.testing.assert_array_equal(ea[key], eb[key])
        np.testing.assert_array_equal(a.memory.state_dict()["ideas"], b.memory.state_dict()["ideas"])


@pytest.mark.parametrize("vectorize", [False, True])
def test_member_process_sigkilled_mid_round_replays_to_the_same_numbers(ray_local, vectorize):
    """Private archives live in the member actors: the rebuilt actor gets its members' archives
    back from the round snapshot with their states, and the replay gives the same numbers."""
    cfg = pop_grpo(*SHAPE, f"population.vectorize={str(vectorize).lower()}")
    local = LocalExecutor(cfg)
    reference = drive(cfg, local)
    rows, lineage, archives, restarts = _sigkill_member_actor_mid_round(cfg)
    assert restarts == 1
    assert same_rows(rows, reference[0])  # archive_new/_improved/_coverage/_qd_score included
    assert lineage == reference[1]
    _assert_same_archives(archives, local.archives())


def _kill_before_first(executor, method: str, actor: int, call: int = 1) -> list[int]:
    """SIGKILL member actor ``actor``'s process right before the executor's ``call``-th ``method``
    call, so that call finds it lost. Returns the list the killed pid is appended to."""
    original, calls, killed = getattr(executor, method), [0], []

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            pid = ray.get(executor._actors[actor].pid.remote())
            assert sigkill(pid)
            killed.append(pid)
        return original(*args, **kwargs)

    setattr(executor, method, wrapped)
    return killed


@pytest.mark.timeout(1200)  # four actor rebuilds: 631 s with two CPU hogs beside it on 2 cores
def test_member_lost_at_every_point_of_its_life_gives_the_same_numbers(ray_local):
    """One run, four losses: an actor SIGKILLed while it is being constructed, then lost at the
    round-0 top-M fetch (get_weights), at round 1's adopt, and at the last round's snapshot
    (earlier snapshots come with adopt's answer). Each is rebuilt and the run's numbers are
    those of an undisturbed run. Mid-round losses: the test above."""
    cfg = pop_grpo(*SHAPE)
    local = LocalExecutor(cfg)
    reference = drive(cfg, local)
    watcher, killed_in_init = kill_during_construction(count=1)
    executor = RayExecutor(cfg)  # answers its first call (placement) only once the lost actor is rebuilt
    watcher.join(timeout=1)
    lost = [
        _kill_before_first(executor, "get_weights", actor=0),
        _kill_before_first(executor, "adopt", actor=1, call=2),
        _kill_before_first(executor, "snapshot", actor=0, call=3),
    ]
    try:
        rows, lineage = drive(cfg, executor)
        archives = executor.archives()
    finally:
        executor.close()
    assert len(killed_in_init) == 1 and all(len(k) == 1 for k in lost)
    events = [e for e in executor.events if e["event"] == "member_actor_restarted"]
    assert executor.restarts == len(events) == 4
    assert same_rows(rows, reference[0])
    assert lineage == reference[1]
    _assert_same_archives(archives, local.archives())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_actor_whose_init_raises_is_reported_not_rebuilt(ray_local):
    """A lost process is rebuilt; an ``__init__`` that raises (here: policy.device=cuda without
    CUDA) is a bug or bad input, and rebuilding would only raise it again. The start that fails
    leaves no actor of the run behind."""
    from ray.util.state import list_actors

    def alive() -> set[str]:
        address = ray.get_runtime_context().gcs_address  # this cluster's, not a parallel worker's
        found = list_actors(address=address, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
        return {a.actor_id for a in found}

    # With a shared archive: the archive actor is up before the member actors' constructors raise
    # (the evaluator actor is started only once they are placed).
    cfg = pop_grpo(*SHAPE, "policy.device=cuda", "population.resources.num_gpus=0.5", "archive.shared=true")
    before = alive()
    with pytest.raises(ray.exceptions.RayActorError, match=r"policy\.device=cuda") as err:
        RayExecutor(cfg)
    assert err.value.actor_init_failed
    # The failed start ended every actor it had started.
    deadline = time.monotonic() + 60
    while alive() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive() - before


# ---- the archive actor ---------------------------------------------------------------------


def _elite_map(state):
    elites = state["archive"]
    return dict(zip(np.asarray(elites["cell"]).tolist(), np.asarray(elites["reward"]).tolist(), strict=True))


def _covers(final: dict, before: dict) -> bool:
    """Every cell elite ``before`` had is still there, with a reward at least as high."""
    return all(cell in final and final[cell] >= reward for cell, reward in before.items())


def _train_and_kill_archive(tmp_path, cfg, monkeypatch):
    """Train through the real driver; SIGKILL the archive actor in the middle of round 1."""
    captured = {}

    def factory(config, run_dir):
        captured["executor"] = RayExecutor(config, run_dir=run_dir)
        return captured["executor"]

    def killer():
        latest = tmp_path / "run" / "checkpoints" / "latest.json"
        while not (latest.exists() and json.loads(latest.read_text())["round"] >= 0):
            time.sleep(0.005)
        # The background writer puts a round's checkpoint down while the next round trains, and
        # a short round can end meanwhile: which snapshot is the last one at the kill is read
        # then, not assumed.
        ex = captured["executor"]
        captured["before_kill"] = ray.get(ex.archive_actor.state_dicts.remote())
        pid = ray.get(ex.archive_actor.pid.remote())
        info = json.loads(latest.read_text())
        captured["snapshot_round"] = info["round"]
        captured["snapshot"] = Checkpointer(tmp_path / "run").load_archives(info)
        os.kill(pid, signal.SIGKILL)
        captured["killed"] = True

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    summary = train(cfg, tmp_path / "run", executor_factory=factory, progress=False)
    thread.join(timeout=5)
    assert captured.get("killed")
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["archive_actor_restarted"]
    final = pd.read_parquet(tmp_path / "run" / "archive.parquet")
    final_maps = [dict(zip(g["cell"].tolist(), g["reward"].tolist(), strict=True)) for _, g in final.groupby("archive")]
    return summary, captured, final_maps, events


def test_archive_actor_killed_without_redis_restores_the_last_snapshot(tmp_path, ray_local, monkeypatch):
    # Without Redis only a shared archive lives in the archive actor; private ones live in the member actors.
    cfg = pop_grpo(*SHAPE, "run.epochs=8", "grpo.steps_per_epoch=16", "archive.shared=true")
    summary, captured, final_maps, events = _train_and_kill_archive(tmp_path, cfg, monkeypatch)
    assert summary["epochs"] == 8
    # restored from the last snapshot at the kill, or one the writer put down after it
    restored = re.search(r"restored from round (\d+) snapshot", events[0]["reason"])
    assert restored and int(restored.group(1)) >= captured["snapshot_round"], events[0]["reason"]
    for final, snap in zip(final_maps, captured["snapshot"], strict=True):
        assert _covers(final, _elite_map(snap))


@pytest.mark.requires("redis-server")
def test_archive_actor_killed_with_redis_loses_no_accepted_elite(tmp_path, ray_local, monkeypatch):
    redis_server = RedisServer(str(tmp_path))
    try:
        monkeypatch.setenv("POPGRPO_REDIS_PASSWORD", redis_server.password)  # the URL carries none
        cfg = pop_grpo(*SHAPE, "run.epochs=8", "grpo.steps_per_epoch=16", f"archive.redis_url={redis_server.url}")
        summary, captured, final_maps, events = _train_and_kill_archive(tmp_path, cfg, monkeypatch)
        assert summary["epochs"] == 8
        assert "Redis elites" in events[0]["reason"] and " 0 Redis" not in events[0]["reason"]
        for final, before in zip(final_maps, captured["before_kill"], strict=True):
            assert _covers(final, _elite_map(before))  # everything accepted up to the kill
        import redis

        client = redis.Redis(host="127.0.0.1", port=redis_server.port, password=redis_server.password)
        keys = sorted(k.decode() for k in client.keys("popgrpo:*"))
        assert len(keys) == 4
        assert sum(client.hlen(k) for k in keys) == sum(len(m) for m in final_maps)
    finally:
        redis_server.stop()


@pytest.mark.requires("redis-server")
def test_bad_redis_password_fails_at_start(tmp_path, ray_local):
    redis_server = RedisServer(str(tmp_path))
    try:
        cfg = pop_grpo(*SHAPE, f"archive.redis_url=redis://:wrongpass42@127.0.0.1:{redis_server.port}/0")
        with pytest.raises(SetupError, match=re.escape("archive.redis_url: cannot use Redis at 127.0.0.1")) as err:
            RayExecutor(cfg)
        assert "wrongpass42" not in str(err.value)
        assert ray.is_initialized()  # the test's own cluster is left alone
    finally:
        redis_server.stop()
