"""The code environment: a problem's own tests are the reward of a completion, with reasons and columns."""

from __future__ import annotations

import math

import pytest
import torch

from popgrpo.algorithms.code_metrics import epoch_code
from popgrpo.algorithms.step import ArchiveSummary, Scores, StepStats
from popgrpo.config import EnvConfig
from popgrpo.envs import make_env
from popgrpo.envs.builtin_problems import builtin_rows
from popgrpo.envs.code import CodeEnv, check_problems, problem_set
from popgrpo.envs.problems import ProblemSetError

pytestmark = pytest.mark.requires("sandbox")

SIZE = 12


def code_config(**code) -> EnvConfig:
    return EnvConfig.model_validate(
        {
            "kind": "code",
            "code": {"builtin_size": SIZE, "heldout_fraction": 0.25, "timeout_s": 3, "cpu_s": 2, **code},
            "text": {"sandbox_pool_size": 2},
        }
    )


@pytest.fixture(scope="module")
def env() -> CodeEnv:
    built = make_env(code_config())
    assert isinstance(built, CodeEnv)
    return built


def test_the_split_holds_problems_out_of_the_training_prompts(env):
    train, heldout = {p.prompt for p in env.train_problems}, set(env.heldout_prompts)
    assert set(env.prompts) == train and train.isdisjoint(heldout) and len(train) + len(heldout) == SIZE
    assert heldout  # a quarter of 12, by hash: at least one


def test_reference_solutions_score_one_and_wrong_ones_what_their_tests_say(env):
    rows = {r["prompt"]: r for r in builtin_rows(SIZE)}
    prompts = list(rows)
    scores = env.score(prompts, [rows[p]["solution"] for p in prompts])
    assert scores.values.tolist() == [1.0] * SIZE and scores.success is not None and bool(scores.success.all())
    wrong = env.score(prompts, ["    return -12345\nresult = -12345\nprint(result)\n"] * SIZE)
    assert bool((wrong.values < 1).all()) and not bool(wrong.success.any())
    # A function problem's tests above the branch pass without the missing line: partial credit.
    function = [p for p in prompts if rows[p]["kind"] == "function"]
    partial = env.score(function, ["    return -12345\n"] * len(function))
    assert bool((partial.values > 0).all()) and bool((partial.values < 1).all())
    assert partial.reasons["tests:passed"] + partial.reasons["tests:failed"] == 5 * len(function)


def test_reasons_count_each_test_and_a_failed_run(env):
    prompt = env.train_problems[0].prompt
    scores = env.score([prompt, prompt], ["import os\nos._exit(0)\n", "while True:\n    pass\n"])
    assert scores.values.tolist() == [0.0, 0.0]
    n = len(env.train_problems[0].tests)
    assert scores.reasons["tests:error"] == n and scores.reasons["tests:timeout"] == n
    assert scores.reasons["run:crash"] == 1 and scores.reasons["run:timeout"] == 1


def test_all_or_nothing_reward():
    env = make_env(code_config(reward="all"))
    function = next(p for p in env.train_problems if p.tests.mode == "call")
    assert env.score([function.prompt], ["    return -12345\n"]).values.tolist() == [0.0]


def test_prefetched_runs_are_used_once(env):
    prompt = env.train_problems[0].prompt
    env.prefetch(prompt, "x = 1\n")
    assert env._started  # started at once
    env.score([prompt], ["x = 1\n"])
    assert not env._started


def test_dataset_columns_reach_the_reward_callables():
    rows = [
        {"task_id": "a", "prompt": "def f():\n", "test": "assert f() == 1", "level": 1},
        {"task_id": "b", "prompt": "def g():\n", "test": "assert g() == 2", "level": 2},
    ]
    env = make_env(
        EnvConfig.model_validate(
            {
                "kind": "code",
                "code": {"rows": rows, "heldout_fraction": 0.0, "columns": {"extra": ["level"]}},
                "text": {"rewards": [{"fn": "tests.envs.test_code_env:level_reward", "weight": 0.5}]},
            }
        )
    )
    scores = env.score(["def f():\n", "def g():\n"], ["    return 1\n", "    return 0\n"])
    assert scores.values.tolist() == [1.0 + 0.5 * 10, 0.0 + 0.5 * 20]


def level_reward(prompts, completions, level):
    """A reward callable of the test above: TRL's convention, the column as a keyword list."""
    assert len(level) == len(completions)
    return [10.0 * v for v in level]


def test_a_bad_row_stops_before_anything_runs():
    from popgrpo.config import Config

    config = Config.model_validate(
        {
            "env": {"kind": "code", "code": {"rows": [{"prompt": "p", "test": "assert f() =="}]}},
            "policy": {"kind": "causal_lm", "causal_lm": {"model": "/nonexistent"}},
            "population": {"size": 1},
            "scheduler": {"enabled": False},
        }
    )
    with pytest.raises(
        ProblemSetError, match=r"^env\.code\.problems: rows: row 1, column 'test': the test code does not compile"
    ):
        check_problems(config)


def test_the_problem_set_is_loaded_once_per_process():
    cfg = code_config().code
    assert problem_set(cfg) is problem_set(cfg)


def _step(env, prompts, completions, passed) -> StepStats:
    n = len(completions)
    return StepStats(
        scores=Scores(
            features=torch.zeros(n, 1),
            complexity=torch.zeros(len(prompts), n // len(prompts)),
            rewards=torch.zeros(len(prompts), n // len(prompts)),
            finite=torch.ones(len(prompts), n // len(prompts), dtype=torch.bool),
            n_bad=0,
            success=torch.tensor(passed),
        ),
        archive=ArchiveSummary(),
        entropy=torch.tensor(0.0),
        kl=torch.tensor(0.0),
        identities=list(completions),
        groups=list(prompts),
    )


def test_epoch_code_metrics(env):
    import json

    a, b = env.train_problems[0].prompt, env.train_problems[1].prompt
    renamed = ["x = 1\ny = x\n", "a = 1\nb = a\n", "x = 2\n", "z = 3\n"]
    steps = [
        _step(env, [a], renamed, [True, True, True, False]),
        _step(env, [b], ["q = 1\n"] * 4, [False] * 4),
        _step(env, [a], ["w = 9\n"] * 4, [False] * 4),
    ]
    row = epoch_code(steps, env)
    # Problem a: 8 samples, 3 passing; b: 4 samples, none.
    assert row["code_pass_at_1"] == pytest.approx((3 / 8 + 0) / 2)
    assert row["code_pass_at_group"] == pytest.approx((1 - math.comb(5, 4) / math.comb(8, 4) + 0) / 2)
    assert row["code_solved"] == 1 and row["code_distinct_correct"] == 2  # the first two are one solution renamed
    record = json.loads(row["code_problems"])
    assert record["group"] == 4 and record["problems"][env.problem_id(a)][:2] == [8, 3]
    assert epoch_code(steps, object())["code_solved"] != epoch_code(steps, object())["code_solved"]  # NaN elsewhere
