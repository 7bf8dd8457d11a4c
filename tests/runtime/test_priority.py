"""The suite's Ray workers run at the suite's own priority (tests/conftest.py), not Ray's nice 15."""

import os

import pytest

pytestmark = pytest.mark.ray


def test_ray_workers_run_at_the_suites_niceness(ray_local):
    ray = pytest.importorskip("ray")

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote(), timeout=120) == os.nice(0)
