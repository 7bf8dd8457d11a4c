"""A worker node lost from a real multi-node Ray cluster: its members move, the run completes."""

import shutil
import tempfile
import threading

import pandas as pd
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from popgrpo.config import load_config, preset_path  # noqa: E402
from popgrpo.runtime.executor import LocalExecutor  # noqa: E402
from popgrpo.runtime.ray_executor import RayExecutor, force_loopback  # noqa: E402
from popgrpo.runtime.scheduler import run_rounds  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture
def three_nodes():
    """Head (no CPUs: driver and archive only) + two 2-CPU workers, loopback, own temp dir."""
    assert not ray.is_initialized(), "another test left Ray connected"
    force_loopback()
    temp_dir = tempfile.mkdtemp(prefix="pgcl-", dir="/tmp")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": temp_dir})
    workers = [cluster.add_node(num_cpus=2, temp_dir=temp_dir) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
    assert cluster.address.startswith("127.0.0.1:")
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


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
    reference_rows = []
    local = LocalExecutor(cfg)
    run_rounds(
        cfg, local, lambda i, e, rows, rec: (reference_rows.extend(r for p in rows for r in p), local.snapshot())
    )

    executor = RayExecutor(cfg)
    nodes_of = {}
    rows = []

    def on_round(i, epoch_end, member_rows, record):
        rows.extend(r for per in member_rows for r in per)
        executor.snapshot()
        if i == 0:
            # Round 1 starts when this returns; take a worker away in the middle of it.
            victim = workers[0]
            nodes_of["victim"] = victim.node_id
            threading.Timer(0.3, lambda: cluster.remove_node(victim, allow_graceful=False)).start()

    try:
        run_rounds(cfg, executor, on_round)
        placements = set(ray.get([a.node_id.remote() for a in executor._actors]))
    finally:
        executor.close()
    assert executor.restarts >= 1
    assert [e["event"] for e in executor.events].count("member_actor_restarted") == executor.restarts
    assert nodes_of["victim"] not in placements
    # the lost members replayed their round exactly (frame comparison: NaN equals NaN)
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(reference_rows))
