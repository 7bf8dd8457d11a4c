"""The Ray executor on a real local Ray: same numbers as in-process, archive state intact."""

import numpy as np
import pandas as pd
import pytest
import torch

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.ray_executor import RayExecutor
from tests.configs import RAY_PAIRS, RAY_POPULATION, pop_grpo
from tests.driving import drive, same_rows

pytestmark = pytest.mark.ray

SHAPE = (*RAY_POPULATION, "run.epochs=4", "grpo.steps_per_epoch=2")


def _run(executor_cls, cfg):
    executor = executor_cls(cfg)
    try:
        rows, lineage = drive(cfg, executor)
        archives = executor.archives()
        weights = executor.get_weights(range(cfg.population.size))
    finally:
        executor.close()
    return rows, lineage, archives, weights


def test_ray_equals_local_with_private_archives(ray_local):
    cfg = pop_grpo(*SHAPE, "archive.shared=false")
    local = _run(LocalExecutor, cfg)
    remote = _run(RayExecutor, cfg)
    assert same_rows(remote[0], local[0])  # every metrics row, bit for bit
    assert remote[1] == local[1]  # lineage
    assert len(remote[2]) == 4
    for a, b in zip(remote[2], local[2], strict=True):
        ea, eb = a.grid.elites(), b.grid.elites()
        for key in ea:
            np.testing.assert_array_equal(ea[key], eb[key])
    for wa, wb in zip(remote[3], local[3], strict=True):
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_archive_holds_exactly_the_reported_elites(ray_local):
    cfg = load_config(preset_path("qd_grpo"), ["run.epochs=2", "grpo.steps_per_epoch=3"])
    rows, _, archives, _ = _run(RayExecutor, cfg)
    opened = sum(r["archive_new"] for r in rows)
    assert len(archives[0].grid) == opened  # each opened cell holds one elite, nothing else
    assert archives[0].stats()["coverage"] == pytest.approx(rows[-1]["archive_coverage"])


def test_shared_archive_accounts_for_every_member(ray_local):
    # Members on different actors reach a shared archive in timing-dependent order, so a
    # shared-archive run on Ray is not bit-for-bit reproducible; its bookkeeping must be.
    cfg = pop_grpo(*SHAPE, "archive.shared=true")
    rows, lineage, archives, _ = _run(RayExecutor, cfg)
    assert len(archives) == 1
    assert len(rows) == 4 * 4 and {r["member"] for r in rows} == {0, 1, 2, 3}
    assert len(archives[0].grid) == sum(r["archive_new"] for r in rows)
    assert len(archives[0].memory) == min(512, sum(r["ideas"] for r in rows))
    assert [rec["round"] for rec in lineage if rec] == [0]


def test_vectorized_packed_actors_equal_the_in_process_run(ray_local):
    """population.vectorize on Ray: two actors of three members, each stepping its members together,
    give the plain in-process run's numbers."""
    sets = ["population.size=6", "population.members_per_actor=3", "run.epochs=4", "scheduler.interval_epochs=2",
            "grpo.steps_per_epoch=3", "population.resources.num_cpus=0.5"]  # fmt: skip
    plain = load_config(preset_path("pop_grpo"), sets)
    vectorized = load_config(preset_path("pop_grpo"), [*sets, "population.vectorize=true"])
    reference, _ = drive(plain, LocalExecutor(plain))
    executor = RayExecutor(vectorized)
    try:
        rows, _ = drive(vectorized, executor)
    finally:
        executor.close()
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(reference), atol=1e-6)


def test_private_archives_in_vectorized_packs_equal_the_in_process_run(ray_local):
    """The default private archives live in the member actors (no archive actor, no per-step
    call): two actors of three vectorised members, QD bonuses and novelty on, give the
    in-process vectorised run's rows, lineage, archives, novelty memories and weights bit for bit."""
    sets = ["population.size=6", "population.members_per_actor=3", "population.vectorize=true",
            "population.resources.num_cpus=0.5", "run.epochs=4", "scheduler.interval_epochs=2",
            "grpo.steps_per_epoch=3", "qd.enabled=true", "maxent.novelty.enabled=true"]  # fmt: skip
    cfg = load_config(preset_path("pop_grpo"), sets)
    local = LocalExecutor(cfg)
    reference = drive(cfg, local)
    executor = RayExecutor(cfg)
    try:
        assert executor.archive_actor is None  # nothing to call per step
        rows, lineage = drive(cfg, executor)
        members, archive_states = executor.snapshot()
        archives = executor.archives()
        weights = executor.get_weights(range(cfg.population.size))
    finally:
        executor.close()
    assert same_rows(rows, reference[0])
    assert lineage == reference[1]
    assert sum(r["archive_new"] for r in rows) > 0 and not any(np.isnan(r["novelty"]) for r in rows)
    assert len(archives) == len(archive_states) == 6
    for a, b, state in zip(archives, local.archives(), archive_states, strict=True):
        ea, eb = a.grid.elites(), b.grid.elites()
        for key in ea:
            np.testing.assert_array_equal(ea[key], eb[key])
            np.testing.assert_array_equal(state["archive"][key], eb[key])
        np.testing.assert_array_equal(a.memory.state_dict()["ideas"], b.memory.state_dict()["ideas"])
    for state, b in zip(members, local.member_states(), strict=True):
        assert state["epochs_done"] == b["epochs_done"] and state["alpha"] == b["alpha"]
    for wa, wb in zip(weights, local.get_weights(range(6)), strict=True):
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_epoch_inserts_into_a_shared_archive_actor_lose_and_double_nothing(ray_local):
    """Plain Pop-GRPO members (no QD bonus, no novelty) insert each epoch's ideas into the shared
    archive actor in one call at the epoch's end. Whatever order the actors' calls arrive in,
    every opened cell is reported exactly once: the "new" counts add up to the elites, and the
    shared archive holds only ideas from the members' epochs."""
    sets = ["population.size=4", "population.members_per_actor=2", "population.resources.num_cpus=0.5",
            "run.epochs=4", "scheduler.interval_epochs=2", "grpo.steps_per_epoch=3", "archive.shared=true"]  # fmt: skip
    cfg = load_config(preset_path("pop_grpo"), sets)
    assert not cfg.qd.enabled and not cfg.maxent.novelty.enabled
    executor = RayExecutor(cfg)
    try:
        assert executor.archive_actor is not None  # a shared archive lives in the archive actor
        rows, _ = drive(cfg, executor)
        archives = executor.archives()
    finally:
        executor.close()
    elites = len(archives[0].grid)
    assert all(len(a.grid) == elites for a in archives)  # one archive, seen by every member
    assert elites > 0 and sum(r["archive_new"] for r in rows) == elites
    # The member whose insert came last read the archive's final coverage right after it.
    last = [r["archive_coverage"] for r in rows if r["epoch"] == cfg.run.epochs - 1]
    assert max(last) == pytest.approx(elites / archives[0].grid.n_cells)


def test_outcome_counts_are_pooled_in_the_archive_actor(ray_local):
    # explore.count_bonus with a shared archive: the archive actor counts both members' ideas in
    # one table, the one each member's bonus reads (per-member tables: test_exploration_member.py).
    shape = ("population.size=2", "scheduler.top_m=2", "run.epochs=1", "grpo.steps_per_epoch=2", "eval.merged=false")
    cfg = pop_grpo(*RAY_PAIRS, *shape, "archive.shared=true", "explore.count_bonus=0.3")
    rows, _, archives, _ = _run(RayExecutor, cfg)
    assert {r["member"] for r in rows} == {0, 1}
    assert len(archives) == 1 and archives[0].outcomes.total == sum(r["ideas"] for r in rows) > 0


def test_executors_report_their_worker_processes_and_epoch_cpu(ray_local):
    """The public process accounting the round timers read: each member actor's pid, and per
    actor the CPU seconds its members trained in each train call; none for the in-process executor."""
    import os

    cfg = pop_grpo(*SHAPE)
    local = LocalExecutor(cfg)
    assert local.worker_pids() == [] and local.epoch_cpu_seconds() == []
    executor = RayExecutor(cfg)
    try:
        executor.train(1)
        executor.train(1)
        pids = executor.worker_pids()
        per_actor = executor.epoch_cpu_seconds()
    finally:
        executor.close()
    assert len(pids) == len(executor.groups) == len(per_actor) and len(set(pids)) == len(pids)
    assert os.getpid() not in pids
    assert all(len(calls) == 2 and all(s > 0 for s in calls) for calls in per_actor)
