"""Head-node fault tolerance: the GCS stores its tables in a real redis-server (password set);
the GCS server is killed mid-run and restarted, and the run completes unchanged.

This is what KubeRay's ``gcsFaultToleranceOptions`` (deploy/raycluster.yaml) and
``RAY_REDIS_ADDRESS`` + ``--redis-password`` on ``ray start --head`` configure.
"""

import threading
import time

import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from popgrpo.config import load_config, preset_path  # noqa: E402
from popgrpo.runtime.executor import LocalExecutor  # noqa: E402
from popgrpo.runtime.ray_executor import RayExecutor  # noqa: E402
from tests.driving import drive  # noqa: E402
from tests.services import RedisServer, free_port, loopback_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.service]


@pytest.fixture
def cluster_on_redis(tmp_path, monkeypatch):
    redis = RedisServer(str(tmp_path))
    monkeypatch.setenv("RAY_REDIS_ADDRESS", f"127.0.0.1:{redis.port}")
    head = {
        "num_cpus": 2,
        "redis_password": redis.password,
        "gcs_server_port": free_port(),  # a restarted GCS must come back where the raylet looks
        "include_dashboard": False,
        "_system_config": {"gcs_rpc_server_reconnect_timeout_s": 60},
    }
    try:
        with loopback_cluster(head, prefix="pggcs-") as (cluster, _, _):
            yield cluster, redis
    finally:
        redis.stop()


def test_gcs_killed_and_restarted_mid_run_the_run_completes(cluster_on_redis):
    cluster, redis = cluster_on_redis
    import redis as redis_client

    # The GCS really keeps its tables in this Redis (not in its own memory).
    assert redis_client.Redis(port=redis.port, password=redis.password).dbsize() > 0
    cfg = load_config(
        preset_path("pop_grpo"),
        [
            "population.size=4",
            "population.members_per_actor=2",
            "population.resources.num_cpus=1",
            "run.epochs=40",  # 20 rounds: the GCS is down for some and back for the rest
            "scheduler.interval_epochs=2",
            "grpo.steps_per_epoch=10",
        ],
    )
    reference_rows, reference_lineage = drive(cfg, LocalExecutor(cfg))
    executor = RayExecutor(cfg)
    head = cluster.head_node
    outage = {}

    def restart_gcs_later():
        time.sleep(2)
        head.start_gcs_server()
        outage["up"] = time.time()

    def kill_before_round_1(_executor):
        # Round 1 starts with the GCS down; it comes back 2 s later, rounds later.
        outage["old_pid"] = head.all_processes["gcs_server"][0].process.pid
        head.kill_gcs_server()
        outage["thread"] = threading.Thread(target=restart_gcs_later)
        outage["thread"].start()

    try:
        rows, lineage = drive(cfg, executor, kill_before_round_1)
        finished = time.time()
        outage["thread"].join(timeout=60)
        alive = ray.get(executor._actors[0].node_id.remote(), timeout=60)  # actor calls work after the outage
    finally:
        executor.close()
    assert finished > outage["up"], "the run ended before the GCS came back: the outage did not overlap it"
    assert head.all_processes["gcs_server"][0].process.pid != outage["old_pid"] and alive
    assert executor.restarts == 0  # nobody was rebuilt: actors lived through the outage
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(reference_rows))
    assert [r and r["selected"] for r in lineage] == [r and r["selected"] for r in reference_lineage]
