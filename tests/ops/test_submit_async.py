"""`popgrpo submit` of an asynchronous run, with seeded stragglers, against a real Ray head."""

import json

import pandas as pd
import pytest

from popgrpo.config import load_config
from tests.ops.test_submit import SHORT, head, popgrpo  # noqa: F401  (head: the module's Ray head fixture)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ASYNC = [
    *SHORT,
    "population.members_per_actor=1",
    "population.resources.num_cpus=0.5",
    "scheduler.mode=async",
    "scheduler.buffer=2",
    "scheduler.max_staleness=1",
    "scheduler.order=logical",
    "population.straggler.scale_s=0.1",
]


def test_submit_runs_an_async_run_on_the_cluster(head, tmp_path):  # noqa: F811
    run_dir = tmp_path / "job-run"
    sets = [a for s in ASYNC for a in ("--set", s)]
    out = popgrpo(head, "submit", "pop_grpo", "--address", head.address, *sets, "--seed", "3", "--out", str(run_dir))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    submission = next(line.split(": ", 1)[1] for line in out.stdout.splitlines() if line.startswith("submitted: "))
    assert f"job {submission}: SUCCEEDED" in out.stdout
    assert "attaching to the job's Ray cluster" in out.stdout
    config = load_config(run_dir / "config.yaml")
    assert config.scheduler.mode == "async" and config.population.straggler.scale_s == 0.1
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    assert sorted(set(zip(metrics.member, metrics.epoch, strict=True))) == [(m, e) for m in range(3) for e in range(6)]
    merges = [json.loads(line) for line in (run_dir / "merges.jsonl").read_text().splitlines()]
    lineage = [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines()]
    assert [m["members"] for m in merges] == [r["async"]["members"] for r in lineage]
    assert len(merges) > 2  # more than the sync run's 2: B = 2 of 3 members
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 6
