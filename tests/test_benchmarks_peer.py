"""The RLlib peer benchmark runs end to end (tiny budget). Timing ratios are not asserted:
they depend on the machine and its load; the benchmark reports them."""

import math

import pytest

pytest.importorskip("ray.rllib")

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def test_quick_peer_benchmark_measures_both_sides():
    import ray

    from benchmarks.peer_rllib import markdown, run

    was_connected = ray.is_initialized()
    result = run(2048, quick=True)
    assert ray.is_initialized() == was_connected  # it shut down only a Ray it started itself

    assert result["budget"] == 2048 and "popgrpo_ray" not in result
    for side in ("rllib", "popgrpo"):
        numbers = result[side]
        assert numbers["env_steps"] >= 2048
        assert numbers["steps_per_s"] > 0 and numbers["median_batch_steps_per_s"] > 0 and numbers["wall_s"] > 0
        assert math.isfinite(numbers["max_reward"]) and math.isfinite(numbers["best_batch_mean"])
        assert numbers["max_reward"] >= numbers["best_batch_mean"]
    assert result["ratio"] == pytest.approx(result["popgrpo"]["steps_per_s"] / result["rllib"]["steps_per_s"])

    table = markdown(result)
    assert "| RLlib PPO |" in table and "| popgrpo GRPO |" in table
    assert "Target popgrpo ≥ 20× RLlib:" in table
