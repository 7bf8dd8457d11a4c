"""Scaling by config: a population of 64 packed into two actors runs to completion here."""

import pandas as pd
import pytest

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.train import train

pytestmark = pytest.mark.ray


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
