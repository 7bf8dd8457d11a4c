"""Section 3's measurement at rest, on the test Ray (benchmarks/round_overhead.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.heavy


@pytest.mark.ray
def test_round_overhead_at_rest_watches_the_runs_ray_and_actors_without_a_call(ray_local, monkeypatch):
    """``at_rest``: the split of the cores while the run's actors are up and idle; the summary
    table then shows the share outside training less it, run by run."""
    from benchmarks import round_overhead
    from benchmarks.round_overhead import at_rest, markdown, rest_share
    from popgrpo.config import load_config, preset_path
    from popgrpo.telemetry.cpu import CpuSample

    taken: list[tuple[set[int], CpuSample]] = []

    class Recorded(CpuSample):
        @classmethod
        def take(cls, actors: set[int]) -> CpuSample:
            sample = CpuSample.take(actors)
            taken.append((set(actors), sample))
            return sample

    monkeypatch.setattr(round_overhead, "CpuSample", Recorded)
    cfg = load_config(preset_path("pop_grpo"), ["population.size=3", "population.resources.num_cpus=0.4"])
    rest = at_rest(cfg, cores=2, seconds=1.0)
    assert rest["members' epochs"] == 0.0
    assert sum(rest.values()) == pytest.approx(1.0)
    # Both samples saw the three member actors, alive and by their role, and the run's Ray beside
    # them; the actors' share is their CPU between the samples. (Idle actors may use less CPU in a
    # second than psutil's clock tick can show, so that share itself may be 0.)
    [(actors, before), (same, after)] = taken
    assert len(actors) == 3 and same == actors
    for sample in (before, after):
        roles = {pid: role for pid, (_, role) in sample.processes.items()}
        assert {pid for pid, role in roles.items() if role == "member actors"} == actors
        assert {"driver", "raylet", "gcs"} <= set(roles.values())
    actor_cpu = sum(after.processes[pid][0] - before.processes[pid][0] for pid in actors)
    assert actor_cpu >= 0
    assert rest["member actors, outside epochs"] == pytest.approx(actor_cpu / (2 * (after.t - before.t)))
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
