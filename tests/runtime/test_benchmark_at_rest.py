"""Section 3's measurement at rest, on the test Ray (benchmarks/round_overhead.py)."""

from __future__ import annotations

import pytest


@pytest.mark.ray
def test_round_overhead_at_rest_watches_the_runs_ray_and_actors_without_a_call(ray_local):
    """``at_rest``: the split of the cores while the run's actors are up and idle; the summary
    table then shows the share outside training less it, run by run."""
    from benchmarks.round_overhead import at_rest, markdown, rest_share
    from popgrpo.config import load_config, preset_path

    cfg = load_config(preset_path("pop_grpo"), ["population.size=3", "population.resources.num_cpus=0.4"])
    rest = at_rest(cfg, cores=2, seconds=1.0)
    assert rest["members' epochs"] == 0.0
    assert sum(rest.values()) == pytest.approx(1.0)
    assert rest["member actors, outside epochs"] > 0  # three actors were seen, and their threads ran
    share = rest_share({"at_rest": rest})
    assert share is not None and 0 < share < 1
    run = {"window": 2.0, "members": 1.5, "merges": 2, "outside_share": 0.25, "busy": 0.1, "writer_wall": 0.1,
           "writer_cpu": 0.05, "logging": 0.02, "cpu_split": None,
           "parts": dict.fromkeys(("get_weights", "adopt", "states", "handover", "driver"), 0.01)}  # fmt: skip
    r = {"arms": {"sync": [run]}, "shares": {"sync": 0.25}, "at_rest": rest, "k": 3, "actors": 3, "per_actor": 1,
         "interval": 2, "epochs": 4, "steps": 2, "cores": 2, "repeats": 1, "loads": [1.0], "started": "t",
         "ended": "u", "niceness": "0"}  # fmt: skip
    text = markdown(r)
    assert "of it beyond the run's Ray and actors at rest" in text
    assert f"| {0.25 - share:.1%} |" in text
    assert rest_share({"arms": {}}) is None and "beyond" not in markdown({**r, "at_rest": None})
