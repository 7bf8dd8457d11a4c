"""An autoscaling cluster grows while the run waits for it (population.resources.wait_for_cluster_s)."""

import threading
import time

import pytest

ray = pytest.importorskip("ray")

from popgrpo.config import load_config, preset_path  # noqa: E402
from popgrpo.runtime.cluster import ClusterTooSmallError  # noqa: E402
from popgrpo.runtime.ray_executor import RayExecutor  # noqa: E402
from tests.services import loopback_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.heavy]

NEEDS_3_CPUS = ["population.size=3", "population.resources.num_cpus=1", "run.epochs=2", "grpo.steps_per_epoch=2"]


@pytest.fixture(scope="module")
def one_cpu_cluster():
    """One cluster for both tests, in file order: the first finds it at 1 CPU and gives up; the
    second waits while a node joins it (a cluster start is a quarter of the two tests' time)."""
    with loopback_cluster({"num_cpus": 1}, prefix="pgwait-") as (cluster, _, temp_dir):
        yield cluster, temp_dir


def test_gives_up_after_the_wait_with_a_message_naming_the_field(one_cpu_cluster):
    assert ray.cluster_resources()["CPU"] == 1  # no node has joined yet
    cfg = load_config(preset_path("grpo"), [*NEEDS_3_CPUS, "population.resources.wait_for_cluster_s=1.5"])
    started = time.monotonic()
    with pytest.raises(ClusterTooSmallError, match=r"needs 3 CPUs .* has 1 after waiting 1.5s.*wait_for_cluster_s"):
        RayExecutor(cfg)
    assert time.monotonic() - started >= 1.5


def test_waits_for_a_node_that_joins_then_runs(one_cpu_cluster):
    cluster, temp_dir = one_cpu_cluster
    cfg = load_config(preset_path("grpo"), [*NEEDS_3_CPUS, "population.resources.wait_for_cluster_s=60"])
    made: dict = {}
    # The executor waits in a thread; the node joins from this one (Cluster.add_node installs signal handlers).
    waiter = threading.Thread(target=lambda: made.update(executor=RayExecutor(cfg), at=time.monotonic()))
    waiter.start()
    time.sleep(2.0)
    assert waiter.is_alive() and "executor" not in made  # still waiting: the cluster has 1 CPU
    joined = time.monotonic()
    cluster.add_node(num_cpus=2, temp_dir=temp_dir)
    waiter.join(timeout=300)  # the new node's actors start slowly on a busy machine
    assert not waiter.is_alive(), "the executor was not ready 300 s after the node joined"
    executor = made["executor"]
    try:
        assert made["at"] >= joined
        assert ray.cluster_resources()["CPU"] == 3
        rows = executor.train(2)
        assert [len(per_member) for per_member in rows] == [2, 2, 2]
    finally:
        executor.close()
