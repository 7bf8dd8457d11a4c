"""The scheduler simulator against what its model says, case by case (no Ray, seconds)."""

from __future__ import annotations

import pytest

from popgrpo.research.sim.costs import CostModel, Linear
from popgrpo.research.sim.model import ClusterShape, Scheduling, Workload, _Sim, simulate  # pyright: ignore[reportPrivateUsage]

COSTS = CostModel(
    epoch_s=0.1,
    weight_bytes=1_000_000,
    call_s=0.002,
    fetch_s=Linear(0.001, 2e-9),
    adopt_s=Linear(0.003, 1e-9),
    merge_s=Linear(0.0005, 0.004),
    driver_s=Linear(0.05, 0.001),
    start_s=1.5,
)


def test_sync_without_stragglers_is_the_sum_of_its_parts():
    """K actors, each with its own core and a core to spare for the driver's background writes:
    round 0 is call + T epochs and the merge; each later round the adopt, call + T epochs (queued
    behind the adopt) and the merge; the writes of a round run beside the next one, the last
    round's end the run."""
    work = Workload(members=4, epochs=30, interval=10, top_m=2)
    result = simulate(COSTS, work, ClusterShape(nodes=2, cores_per_node=3))
    c = COSTS
    train = c.call_s + 10 * c.epoch_s
    merge = c.call_s + 2 * c.fetch_s(c.weight_bytes) + c.merge_s(2)
    adopt = c.call_s + c.adopt_s(c.weight_bytes)
    writes = c.driver_s(4)
    expected = 3 * train + 2 * (merge + adopt) + writes
    assert result.wall_s == pytest.approx(expected, rel=1e-9)
    assert result.merges == 2 and result.useful_epochs == 4 * 30 and result.wasted_epochs == 0
    assert result.round_s == pytest.approx([train + merge, adopt + train + merge, adopt + train + writes])
    assert result.report_s == pytest.approx([merge + adopt + train] * 2)


def test_sync_writes_that_outlast_a_round_do_not_hold_the_members():
    """The driver's writes take 5 s a round, rounds 1 s: on a spare core they never hold the next
    round; the one writer writes the rounds in order, and the run ends when the last is written."""
    costs = CostModel(epoch_s=0.1, weight_bytes=0, driver_s=Linear(5.0, 0.0))
    work = Workload(members=2, epochs=30, interval=10)
    result = simulate(costs, work, ClusterShape(1, 3))
    assert result.report_s == pytest.approx([1.0, 1.0])
    assert result.wall_s == pytest.approx(1.0 + 3 * 5.0)


def test_the_writers_work_counts_each_members_own_logger_series_up_to_the_cap():
    """``driver_cost(K)``: the driver line for every member plus ``logged_member_s`` for each of
    the first ``logged_members``; a run whose writer sets the pace ends that much sooner with
    the cap, and older cost files (without the two fields) keep their whole line."""
    capped = CostModel(
        epoch_s=0.1, weight_bytes=0, driver_s=Linear(0.01, 0.001), logged_member_s=0.004, logged_members=32
    )
    assert capped.driver_cost(8) == pytest.approx(0.01 + 0.008 + 8 * 0.004)
    assert capped.driver_cost(1000) == pytest.approx(0.01 + 1.0 + 32 * 0.004)
    every = CostModel.from_json({**capped.to_json(), "logged_members": None})
    assert every.driver_cost(1000) == pytest.approx(0.01 + 1.0 + 1000 * 0.004)
    assert CostModel.from_json(capped.to_json()) == capped
    old = {k: v for k, v in capped.to_json().items() if k not in ("logged_member_s", "logged_members")}
    assert CostModel.from_json(old).driver_cost(1000) == pytest.approx(capped.driver_s(1000))
    work = Workload(members=1000, epochs=30, interval=10)
    shape = ClusterShape(nodes=1000, cores_per_node=2)
    fast, slow = simulate(capped, work, shape), simulate(every, work, shape)
    # The three rounds' writes, one after another, are the run's last part in both.
    assert slow.wall_s - fast.wall_s == pytest.approx(3 * (1000 - 32) * 0.004, rel=1e-6)


def test_actors_beyond_the_cores_queue_for_them():
    """Four actors on two cores train a round in twice the time of two actors."""
    costs = CostModel(epoch_s=0.1, weight_bytes=0)
    two = simulate(costs, Workload(members=2, epochs=10, interval=10), ClusterShape(1, 2))
    four = simulate(costs, Workload(members=4, epochs=10, interval=10), ClusterShape(1, 2))
    assert two.wall_s == pytest.approx(1.0)
    assert four.wall_s == pytest.approx(2.0)
    assert four.utilisation == pytest.approx(1.0) and two.utilisation == pytest.approx(1.0)


def test_packed_actor_trains_its_members_one_after_another():
    costs = CostModel(epoch_s=0.1, weight_bytes=0)
    packed = simulate(costs, Workload(members=4, epochs=10, interval=10, members_per_actor=4), ClusterShape(1, 4))
    assert packed.wall_s == pytest.approx(4.0)  # one actor, one core, 4 members × 10 epochs
    assert packed.useful_epochs == 40


def test_async_with_buffer_k_and_no_staleness_keeps_the_sync_schedule():
    """B = K, S = 0: the same merges, nothing dropped, the same wall time (the driver's writes
    run in the background in both)."""
    work = Workload(members=8, epochs=40, interval=10)
    cluster = ClusterShape(2, 5)  # a spare core on the driver's node for its background writes
    sync = simulate(COSTS, work, cluster, Scheduling("sync"))
    asyn = simulate(COSTS, work, cluster, Scheduling("async", buffer=None, max_staleness=0))
    assert asyn.merges == sync.merges == 3
    assert asyn.wasted_epochs == 0 and asyn.held_s == 0 and asyn.max_staleness_seen == 0
    assert asyn.wall_s == pytest.approx(sync.wall_s, rel=1e-9)


def test_stragglers_hold_the_sync_barrier_and_not_async():
    work = Workload(members=32, epochs=40, interval=5, straggler_sigma=1.0)
    cluster = ClusterShape(4, 8)
    sync = simulate(COSTS, work, cluster, Scheduling("sync"), seed=3)
    asyn = simulate(COSTS, work, cluster, Scheduling("async", buffer=8, max_staleness=4), seed=3)
    assert asyn.wall_s < 0.75 * sync.wall_s
    assert asyn.utilisation > sync.utilisation
    calm = Workload(members=32, epochs=40, interval=5)
    assert simulate(COSTS, calm, cluster, Scheduling("sync")).wall_s == pytest.approx(
        simulate(COSTS, calm, cluster, Scheduling("async", buffer=8, max_staleness=4)).wall_s, rel=0.05
    )


@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_no_epoch_trains_from_a_base_older_than_the_bound(staleness):
    work = Workload(members=16, epochs=40, interval=5, straggler_sigma=1.0)
    result = simulate(COSTS, work, ClusterShape(2, 8), Scheduling("async", buffer=4, max_staleness=staleness), seed=1)
    assert result.max_staleness_seen <= staleness
    assert result.finished and result.useful_epochs >= 16 * 40 and result.wasted_epochs == 0
    if staleness < 3:
        assert result.held_s > 0  # some merge had to wait for a slow actor
    loose = simulate(COSTS, work, ClusterShape(2, 8), Scheduling("async", buffer=4, max_staleness=50), seed=1)
    assert loose.max_staleness_seen > staleness  # the bound is what held it


def test_no_staleness_is_the_sync_schedule_whatever_the_buffer():
    """S = 0: every merge waits for every actor, so B < K merges as often as sync."""
    work = Workload(members=8, epochs=40, interval=10, straggler_sigma=0.5)
    cluster = ClusterShape(2, 5)
    sync = simulate(COSTS, work, cluster, Scheduling("sync"), seed=4)
    for buffer in (1, 4, 8):
        asyn = simulate(COSTS, work, cluster, Scheduling("async", buffer=buffer, max_staleness=0), seed=4)
        assert asyn.merges == sync.merges and asyn.max_staleness_seen == 0


def test_a_hung_member_is_replaced_after_the_deadline_and_the_run_ends():
    work = Workload(members=8, epochs=20, interval=5, hang_probability=0.1, deadline_factor=3.0)
    for mode in ("sync", "async"):
        result = simulate(COSTS, work, ClusterShape(2, 4), Scheduling(mode, buffer=4, max_staleness=2), seed=2)
        assert result.finished and result.restarts > 0
        # Each replacement costs at most the deadline plus a restart; nothing waits forever.
        calm = simulate(COSTS, Workload(members=8, epochs=20, interval=5), ClusterShape(2, 4), Scheduling(mode))
        assert result.wall_s <= calm.wall_s + result.restarts * (3.0 * 5 * 0.1 * 2 + COSTS.start_s + 1.0)


def test_lost_nodes_cost_work_and_restarts_and_the_run_still_ends_deterministically():
    work = Workload(members=64, epochs=20, interval=5, node_mtbf_s=2.0, node_return_s=5.0)
    cluster = ClusterShape(8, 8)
    for sched in (Scheduling("sync"), Scheduling("async", buffer=16, max_staleness=2)):
        first = simulate(COSTS, work, cluster, sched, seed=5)
        again = simulate(COSTS, work, cluster, sched, seed=5)
        assert first == again
        assert first.finished and first.restarts > 0 and first.wasted_epochs > 0
        assert first.useful_epochs >= 64 * 20


def test_a_time_limit_stops_a_run_that_cannot_finish():
    result = simulate(COSTS, Workload(members=4, epochs=1000, interval=10), ClusterShape(1, 1), limit_s=5.0)
    assert not result.finished and result.wall_s == pytest.approx(5.0)


def test_costs_round_trip_through_json(tmp_path):
    path = tmp_path / "costs.json"
    COSTS.save(path)
    assert CostModel.load(path) == COSTS
    with pytest.raises(ValueError, match="unknown cost fields: bogus"):
        CostModel.from_json({**COSTS.to_json(), "bogus": 1})
    assert Linear.through(1, 2.0, 3, 1.0) == Linear(a=2.0, b=0.0)  # a falling fit is flat
    assert Linear.through(0, 1.0, 2, 5.0) == Linear(a=1.0, b=2.0)


def test_contention_grows_each_epochs_cost_with_the_actors_per_core():
    """Four actors on two cores (x = 2) with contention 1 + 0.25·x: each epoch costs 1.5 × epoch_s."""
    costs = CostModel(epoch_s=0.1, weight_bytes=0, contention=Linear(1.0, 0.25))
    four = simulate(costs, Workload(members=4, epochs=10, interval=10), ClusterShape(1, 2))
    assert four.wall_s == pytest.approx(2 * 10 * 0.1 * 1.5)  # two actors per core, 10 epochs each
    one = simulate(costs, Workload(members=1, epochs=10, interval=10), ClusterShape(1, 2))
    assert one.wall_s == pytest.approx(10 * 0.1 * 1.125)  # x = 0.5


def test_actor_call_cpu_holds_the_core_after_the_epochs():
    costs = CostModel(epoch_s=0.1, weight_bytes=0, actor_call_cpu_s=0.05)
    four = simulate(costs, Workload(members=4, epochs=20, interval=10), ClusterShape(1, 2))
    # two rounds; each core serves two actors a round: 2 × (10 epochs + one call's CPU)
    assert four.wall_s == pytest.approx(2 * 2 * (10 * 0.1 + 0.05))


def test_ray_and_background_shares_slow_every_core_of_the_node():
    """Shares of 0.1 + 0.02·x and 0.2 at x = 2 actors per core leave 0.66 of the cores to the run."""
    costs = CostModel(
        epoch_s=0.1,
        weight_bytes=0,
        driver_s=Linear(0.3, 0.0),
        ray_share=Linear(0.1, 0.02),
        background_share=Linear(0.2),
    )
    assert costs.core_speed(2.0) == pytest.approx(0.66)
    result = simulate(costs, Workload(members=4, epochs=10, interval=10), ClusterShape(1, 2))
    assert result.wall_s == pytest.approx((2 * 10 * 0.1 + 0.3) / 0.66)  # the driver's writes too
    # Negative shares (a falling line extrapolated) take nothing; the cores never stop.
    assert CostModel(epoch_s=1, weight_bytes=0, background_share=Linear(-0.5)).core_speed(1.0) == 1.0
    assert CostModel(epoch_s=1, weight_bytes=0, background_share=Linear(2.0)).core_speed(1.0) == 0.05


def test_the_sharing_terms_follow_actors_moved_off_a_lost_node():
    """Two nodes of one core; once a node is lost its actor moves, so the survivor holds x = 2."""
    costs = CostModel(epoch_s=0.1, weight_bytes=0, contention=Linear(1.0, 1.0))
    work = Workload(members=2, epochs=10, interval=10, node_mtbf_s=0.2, node_return_s=1e9)
    sim = _Sim(costs, work, ClusterShape(2, 1), Scheduling(), seed=0, limit_s=1e9)
    assert sim.load == [1, 1] and sim.epoch_cost(sim.actors[0]) == pytest.approx(0.2)
    result = sim.run()
    assert result.restarts >= 1 and sorted(sim.load) == [0, 2]
    assert sim.epoch_cost(sim.actors[0]) == pytest.approx(0.3)
    # slower than without the loss: each actor's 10 epochs at x = 1 (0.2 s each)
    assert result.wall_s > 10 * 0.2


def test_sharing_costs_default_to_nothing_and_round_trip_through_json(tmp_path):
    plain = CostModel(epoch_s=0.1, weight_bytes=0)
    assert plain.contention(7.0) == 1.0 and plain.core_speed(7.0) == 1.0 and plain.actor_call_cpu_s == 0.0
    shared = CostModel(
        epoch_s=0.1, weight_bytes=0, contention=Linear(1.1, 0.02), actor_call_cpu_s=0.01,
        ray_share=Linear(0.03, 0.001), background_share=Linear(0.4, -0.02),
    )  # fmt: skip
    path = tmp_path / "c.json"
    shared.save(path)
    assert CostModel.load(path) == shared
    assert CostModel.from_json({"epoch_s": 0.1, "weight_bytes": 0}) == plain  # costs saved before these terms
    line = Linear.through(1.5, 0.4, 6.0, 0.31, rising=False)  # a share may fall with x
    assert (line.a, line.b) == pytest.approx((0.43, -0.02))


def test_rounds_without_a_checkpoint_spare_the_writer_its_part_and_async_checkpoints_every_member():
    """``driver_s`` is measured with a checkpoint every round; ``checkpoint_s + checkpoint_member_s·K``
    is its part that a round without one (``run.checkpoint_every``) does not spend, and an async
    merge's checkpoint holds every member's state, not only the reporters': those renewed since
    the last checkpoint serialised, the others linked (``checkpoint_link_s``)."""
    costs = CostModel(
        epoch_s=0.1, weight_bytes=0, driver_s=Linear(1.0, 0.01), checkpoint_s=0.5, checkpoint_member_s=0.004
    )
    assert costs.driver_cost(100) == pytest.approx(2.0)
    assert costs.driver_cost(100, checkpoint=False) == pytest.approx(2.0 - 0.5 - 0.4)
    assert costs.driver_cost(25, checkpointed=100) == pytest.approx(1.25 + 0.004 * 75)
    linking = CostModel(**{**costs.__dict__, "checkpoint_link_s": 0.001})
    assert linking.driver_cost(25, checkpointed=25, linked=75) == pytest.approx(1.25 + 0.001 * 75)
    assert linking.driver_cost(25, checkpoint=False, checkpointed=25, linked=75) == pytest.approx(1.25 - 0.6)
    old = {k: v for k, v in costs.to_json().items() if k not in ("checkpoint_s", "checkpoint_member_s")}
    assert CostModel.from_json(old).driver_cost(25, checkpoint=False, checkpointed=100) == pytest.approx(1.25)
    work = Workload(members=1000, epochs=100, interval=10, checkpoint_every=4)
    assert [r for r in range(10) if work.checkpoint_due(r, last=r == 9)] == [3, 7, 9]
    shape = ClusterShape(nodes=1000, cores_per_node=2)
    heavy = CostModel(epoch_s=0.1, weight_bytes=0, driver_s=Linear(0.0, 0.01), checkpoint_member_s=0.009)
    every = simulate(heavy, Workload(members=1000, epochs=100, interval=10), shape)
    fourth = simulate(heavy, work, shape)
    # Sync, the writer sets the pace (10 s a round against 1 s of training): 10 rounds' writes in a
    # row, 7 of them without the checkpoint's 9 s.
    assert every.wall_s - fourth.wall_s == pytest.approx(7 * 9.0, rel=1e-6)
    asyn = Scheduling("async", buffer=250, max_staleness=4)
    writes_all = simulate(heavy, Workload(members=1000, epochs=100, interval=10), shape, asyn)
    writes_fewer = simulate(heavy, Workload(members=1000, epochs=100, interval=10, checkpoint_every=4), shape, asyn)
    assert writes_fewer.wall_s < writes_all.wall_s
    assert writes_all.merges == writes_fewer.merges  # the writer is off the members' path: the same merges


def test_async_checkpoints_serialise_only_the_restore_points_renewed_since_the_last_one():
    """The writer sets the pace here (9 ms a serialised member, 1,000 members, stragglers, a merge
    per 250 reports): linking the members that did not report makes each async merge's checkpoint
    cheap, and the run shorter; sync rounds renew every member, so the link's cost does not touch them."""
    shape = ClusterShape(nodes=1000, cores_per_node=2)
    work = Workload(members=1000, epochs=100, interval=10, straggler_sigma=1.0)
    asyn = Scheduling("async", buffer=250, max_staleness=4)
    base = {"epoch_s": 0.1, "weight_bytes": 0, "driver_s": Linear(0.0, 0.01), "checkpoint_member_s": 0.009}
    as_writes = CostModel(**base, checkpoint_link_s=0.009)  # a link as dear as a new file: every member written
    links = CostModel(**base, checkpoint_link_s=0.0)
    assert simulate(links, work, shape, asyn).wall_s < 0.75 * simulate(as_writes, work, shape, asyn).wall_s
    assert simulate(links, work, shape).wall_s == pytest.approx(simulate(as_writes, work, shape).wall_s)


def test_workload_of_a_config_is_its_population_rounds_and_checkpoints():
    from popgrpo.config import load_config, preset_path

    cfg = load_config(preset_path("pop_grpo"), ["population.members_per_actor=5", "run.checkpoint_every=3"])
    work = Workload.of(cfg, straggler_sigma=0.5)
    assert (work.members, work.epochs, work.interval, work.top_m) == (5, cfg.run.epochs, 10, cfg.scheduler.top_m)
    assert work.members_per_actor == 5 and work.checkpoint_every == 3 and work.straggler_sigma == 0.5
    off = Workload.of(load_config(preset_path("grpo")))  # no scheduler: the whole run is one round
    assert off.interval == off.epochs
