import os
import shutil
import tempfile
from types import SimpleNamespace

import pytest

from tests.services import HIDER, free_port

ray = pytest.importorskip("ray")


@pytest.fixture(scope="package")
def ray_local():
    """A real single-node Ray with its dashboard and metrics agent: loopback only, own temp
    dir and ports, metrics reported every 0.5 s; shut down by its own handle. It declares one
    logical GPU (there is no hardware behind it) so GPU reservations can be tested."""
    from popgrpo.runtime.cluster import start_local_ray

    temp_dir = tempfile.mkdtemp(prefix="pgray-", dir="/tmp")  # short: Ray's socket paths are length-limited
    metrics_port = free_port()
    # Ray's workers keep the PATH the cluster starts with, and the cluster outlives the test that
    # starts it: they get the machine's own PATH, not the programs that one test declared
    # (tests/services.py ProgramHider hides the others from the test process only).
    hidden_path = os.environ.get("PATH", "")
    if HIDER is not None and HIDER.real_path is not None:
        os.environ["PATH"] = HIDER.real_path
    try:
        ctx = start_local_ray(
            num_cpus=2,
            num_gpus=1,
            temp_dir=temp_dir,
            log_to_driver=False,
            dashboard_port=free_port(),
            _metrics_export_port=metrics_port,
            _system_config={"metrics_report_interval_ms": 500},
        )
    finally:
        os.environ["PATH"] = hidden_path
    assert ctx.address_info["gcs_address"].startswith("127.0.0.1:")
    yield SimpleNamespace(ctx=ctx, metrics_port=metrics_port)
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
