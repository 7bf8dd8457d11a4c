"""Scaling by config: a population of 64 packed into two actors runs to completion here."""

import pandas as pd
import pytest

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.train import train

pytestmark = [pytest.mark.ray, pytest.mark.heavy]


def test_population_of_64_packed_runs_to_completion(ray_local, tmp_path):
    cfg = load_config(
        preset_path("pop_grpo"),
        [
            "population.size=64",
            "population.members_per_actor=32",
            "scheduler.top_m=8",
            "run.epochs=4",
            "scheduler.interval_epochs=2",
            "grpo.steps_per_epoch=1",
        ],
    )
    summary = train(cfg, tmp_path / "run", executor_factory=lambda c, d: RayExecutor(c, run_dir=d), progress=False)
    metrics = pd.read_parquet(tmp_path / "run" / "metrics.parquet")
    assert len(metrics) == 64 * 4 and metrics["member"].nunique() == 64
    assert summary["members"] == 64
    lineage = (tmp_path / "run" / "lineage.jsonl").read_text().splitlines()
    assert len(lineage) == 1 and '"selected": [' in lineage[0]
    assert len(list((tmp_path / "run" / "checkpoints" / "round_0001").glob("member_*.pt"))) == 64


def test_sharing_calibration_trains_the_configs_members_per_actor(ray_local):
    """The simulator's sharing terms are measured with the run's own packing: 2 actors of 3
    members each train 2 epochs; every member's epoch is counted, so an epoch's CPU time in the
    actors is about one epoch's CPU time alone (not three of them, not a third)."""
    import time

    from popgrpo.research.sim.measure import _sharing
    from popgrpo.runtime.executor import LocalExecutor

    cfg = load_config(
        preset_path("pop_grpo"), ["population.members_per_actor=3", "scheduler.interval_epochs=2", "run.loggers=[]"]
    )
    m = _sharing(cfg, 2, None, rounds=1)
    assert (m.actors, m.calls, m.epochs) == (2, 2, 2 * 3 * 2)
    alone = LocalExecutor(load_config(preset_path("pop_grpo"), ["population.size=1", "scheduler.top_m=1"]))
    alone.train(1)  # warm-up
    start = time.process_time()
    alone.train(6)
    epoch_alone = (time.process_time() - start) / 6
    assert 0.5 < m.contention(epoch_alone) < 1.8
    assert m.call_cpu_s() >= 0 and m.actor_cpu_s >= m.epoch_cpu_s * 0.9
