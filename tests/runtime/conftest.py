import shutil
import tempfile

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="package")
def ray_local():
    """A real single-node Ray, loopback only, own temp dir; shut down by its own handle."""
    temp_dir = tempfile.mkdtemp(prefix="pgray-", dir="/tmp")  # short: Ray's socket paths are length-limited
    from popgrpo.runtime.ray_executor import start_local_ray

    ctx = start_local_ray(num_cpus=2, temp_dir=temp_dir, log_to_driver=False)
    assert ctx.address_info["gcs_address"].startswith("127.0.0.1:")
    yield ctx
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
