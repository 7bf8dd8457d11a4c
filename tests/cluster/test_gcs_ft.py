"""Head-node fault tolerance: the GCS stores its tables in a real redis-server (password set);
the GCS server is killed mid-run, stays down for 15 s (as long as a restarted head pod takes)
and is restarted, and the run completes unchanged.

This is what KubeRay's ``gcsFaultToleranceOptions`` (deploy/raycluster.yaml) and
``RAY_REDIS_ADDRESS`` + ``--redis-password`` on ``ray start --head`` configure. The driver
runs in a subprocess (tests/cluster/scenarios.py): a driver that loses the GCS can end only
itself, never pytest.
"""

import pandas as pd
import pytest

pytest.importorskip("ray")

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
from tests.cluster import scenarios
from tests.driving import drive
from tests.services import RedisServer

# A cluster whose GCS is down for 15 s, in a subprocess: make test-slow (docs/reference/tests.md).
pytestmark = [pytest.mark.ray, pytest.mark.requires("redis-server"), pytest.mark.slow, pytest.mark.solo]


def test_gcs_killed_for_15_s_mid_run_the_run_completes(tmp_path):
    redis = RedisServer(str(tmp_path))
    try:
        env = {"POPGRPO_TEST_REDIS_PORT": str(redis.port), "POPGRPO_TEST_REDIS_PASSWORD": redis.password}
        result = scenarios.run("gcs_outage", tmp_path, env)
    finally:
        redis.stop()
    cfg = load_config(preset_path("pop_grpo"), scenarios.CONFIGS["gcs_outage"])
    reference_rows, reference_lineage = drive(cfg, LocalExecutor(cfg))
    assert result["redis_keys"] > 0  # the GCS really kept its tables in this Redis
    assert result["up"] - result["down"] >= scenarios.GCS_OUTAGE_S
    assert result["rounds_run_while_down"] == 4 and result["finished"] > result["up"]
    assert result["new_pid"] != result["old_pid"] and result["alive"]  # actor calls work after the outage
    assert result["restarts"] == 0  # nobody was rebuilt: actors lived through the outage
    pd.testing.assert_frame_equal(pd.DataFrame(result["rows"]), pd.DataFrame(reference_rows))
    assert [r and r["selected"] for r in result["lineage"]] == [r and r["selected"] for r in reference_lineage]
