"""Asynchronous rounds on a real Ray, with seeded stragglers: determinism, resume and chaos.

With ``scheduler.order=logical`` the reports are taken in the order the seeded delays give,
whatever Ray's timing, so every run below must equal the in-process run bit for bit: two Ray
runs, a run whose driver died mid-run and was resumed, and a run whose member actors were
SIGKILLed at random moments (a rebuilt member's timing differs; its report is waited for). A
SIGKILLed archive actor is restarted and the run finishes as in sync mode.
"""

from __future__ import annotations

import pytest

from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.train import resume, train
from tests.configs import SEEDED, pop_grpo
from tests.runtime.test_async_determinism import _assert_same_run, _Crash, _crash_in_adopt, _lines

pytestmark = [pytest.mark.ray, pytest.mark.heavy]

SETS = [
    *SEEDED,
    "population.size=4",
    "population.resources.num_cpus=0.5",  # the test Ray has 2 CPUs
    "run.epochs=8",
    "scheduler.interval_epochs=2",
    "grpo.steps_per_epoch=6",
    "scheduler.mode=async",
    "scheduler.buffer=2",
    "scheduler.max_staleness=1",
    "scheduler.order=logical",
    # Median 0.2 s a round, a few several times that: Ray's arrival order would follow them.
    "population.straggler.scale_s=0.2",
    "population.straggler.sigma=1.0",
]


def on_ray(cfg, run_dir):
    return RayExecutor(cfg, run_dir=run_dir)


@pytest.mark.timeout(600)
def test_on_ray_a_run_with_stragglers_is_the_in_process_run(ray_local, tmp_path):
    cfg = pop_grpo(*SETS)
    train(cfg, tmp_path / "reference", progress=False)
    train(cfg, tmp_path / "ray", executor_factory=on_ray, progress=False)
    _assert_same_run(tmp_path / "reference", tmp_path / "ray")
    assert len(_lines(tmp_path / "ray" / "merges.jsonl")) > 3  # more merges than the sync run's 3


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_on_ray_two_runs_and_a_resumed_one_are_the_in_process_run(ray_local, tmp_path):
    """Two Ray runs with the same delays, the second one's driver dying mid-merge and resumed."""
    cfg = pop_grpo(*SETS)
    train(cfg, tmp_path / "reference", progress=False)
    train(cfg, tmp_path / "ray", executor_factory=on_ray, progress=False)
    _assert_same_run(tmp_path / "reference", tmp_path / "ray")

    def crashing(c, run_dir):  # the driver dies carrying out merge 2, after it was logged
        return _crash_in_adopt(2, base=lambda c2: on_ray(c2, run_dir))(c, run_dir)

    with pytest.raises(_Crash):
        train(cfg, tmp_path / "resumed", executor_factory=crashing, progress=False)
    resume(tmp_path / "resumed", executor_factory=on_ray, progress=False)
    _assert_same_run(tmp_path / "reference", tmp_path / "resumed")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_on_ray_member_kills_at_random_moments_leave_an_async_run_unchanged(ray_local, tmp_path):
    from tests.runtime.test_chaos import ChaosMonkey

    cfg = pop_grpo(*SETS, "population.max_restarts=10", "population.members_per_actor=2")
    train(cfg, tmp_path / "reference", progress=False)
    monkey = ChaosMonkey(seed=28, kills=3, gap_s=(0.5, 2.0))
    monkey.start()
    try:
        train(cfg, tmp_path / "chaos", executor_factory=on_ray, progress=False)
    finally:
        monkey.stop()
    kills = "; ".join(f"{t}s {title}" for t, _, title in monkey.killed)
    assert monkey.killed, "the run ended before any kill landed"
    events = _lines(tmp_path / "chaos" / "events.jsonl")
    assert 1 <= [e["event"] for e in events].count("member_actor_restarted") <= len(monkey.killed), kills
    _assert_same_run(tmp_path / "reference", tmp_path / "chaos")


@pytest.mark.timeout(600)
def test_on_ray_the_archive_actor_killed_mid_async_run_is_restored(ray_local, tmp_path, monkeypatch):
    """A shared archive lives in the archive actor: SIGKILLed mid-run (after a merge's
    checkpoint), Ray restarts it from the newest merge's snapshot and the run finishes; no
    elite of that snapshot is lost. Elites accepted after it are, without Redis, as in sync mode."""
    from tests.runtime.test_faults import SHAPE, _covers, _elite_map, _train_and_kill_archive

    cfg = pop_grpo(
        *SHAPE, "run.epochs=8", "grpo.steps_per_epoch=16", "archive.shared=true", *SETS[7:], "run.loggers=[]"
    )
    summary, captured, final_maps, events = _train_and_kill_archive(tmp_path, cfg, monkeypatch)
    assert summary["epochs"] == 8
    assert "snapshot" in events[0]["reason"]
    for final, snap in zip(final_maps, captured["snapshot"], strict=True):
        assert _covers(final, _elite_map(snap))
    lineage = _lines(tmp_path / "run" / "lineage.jsonl")
    assert [r["async"]["merge"] for r in lineage] == list(range(len(lineage))) and len(lineage) > 3
