"""A worker node lost from a real multi-node Ray cluster: its members move, the run completes."""

import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from popgrpo.config import load_config, preset_path  # noqa: E402
from popgrpo.runtime.executor import LocalExecutor  # noqa: E402
from popgrpo.runtime.ray_executor import RayExecutor  # noqa: E402
from tests.driving import drive, kill_when_busy  # noqa: E402
from tests.services import loopback_cluster  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture
def three_nodes():
    """Head (no CPUs: driver and archive only) + two 2-CPU workers."""
    with loopback_cluster({"num_cpus": 0}, worker_cpus=(2, 2)) as (cluster, workers, _):
        yield cluster, workers


def test_worker_node_removed_mid_round(three_nodes):
    cluster, workers = three_nodes
    cfg = load_config(
        preset_path("pop_grpo"),
        [
            "population.size=4",
            "population.members_per_actor=2",
            "population.resources.num_cpus=1",
            "run.epochs=6",
            "scheduler.interval_epochs=2",
            "grpo.steps_per_epoch=8",
        ],
    )
    reference_rows, _ = drive(cfg, LocalExecutor(cfg))
    executor = RayExecutor(cfg)
    victim = workers[0]

    removed = []

    def remove_worker_during_round_1(ex):
        # The node goes while an actor on it is in its round-1 train call, however short a round.
        on_victim = next(a for a in ex._actors if ray.get(a.node_id.remote()) == victim.node_id)
        removed.append(kill_when_busy(on_victim, lambda: cluster.remove_node(victim, allow_graceful=False)))

    try:
        rows, _ = drive(cfg, executor, remove_worker_during_round_1)
        placements = set(ray.get([a.node_id.remote() for a in executor._actors]))
    finally:
        executor.close()
    assert removed and removed[0].wait(timeout=5)
    assert executor.restarts >= 1
    assert [e["event"] for e in executor.events].count("member_actor_restarted") == executor.restarts
    assert victim.node_id not in placements
    # the lost members replayed their round exactly (frame comparison: NaN equals NaN)
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(reference_rows))
