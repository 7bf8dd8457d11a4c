"""Dataset columns reach the rewards: SandboxReward scores each TRL row against its own tests, and
env.text.columns pass a prompts file's columns to reward callables as keyword lists."""

from __future__ import annotations

import json
import pickle

import pytest

from popgrpo.config import TextEnvConfig
from popgrpo.envs.rewards import SandboxReward
from popgrpo.envs.text import TextEnv

pytestmark = pytest.mark.requires("sandbox")


@pytest.fixture(scope="module")
def reward():
    return SandboxReward(timeout_s=3, cpu_s=2, memory_mb=256, site_packages=False, pool_size=2)


def test_each_row_is_scored_against_its_own_tests(reward):
    # MBPP-style rows: the same completion is right for one row's tests and wrong for the other's.
    completion = "```python\ndef f(x):\n    return x + 1\n```"
    scores = reward(
        prompts=["add one", "add two"],
        completions=[completion, completion],
        test_list=[["assert f(1) == 2", "assert f(2) == 3"], ["assert f(1) == 3", "assert f(0) == 1"]],
        completion_ids=[[1], [2]],
    )
    assert scores == [1.0, 0.5]
    assert reward.last_reasons == ["passed", "failed"]


def test_humaneval_style_rows_continue_the_prompt(reward):
    prompt = "def add(a, b):\n    '''Add.'''\n"
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    scores = reward(
        prompts=[prompt, prompt],
        completions=["    return a + b\n", "    return a - b\n"],
        test=[test, test],
        entry_point=["add", "add"],
    )
    assert scores == [1.0, 0.0]


def test_apps_style_stdio_and_call_rows_in_chat_form(reward):
    stdio = json.dumps({"inputs": ["2 3\n", "5 5\n"], "outputs": ["5\n", "10\n"]})
    call = json.dumps({"inputs": [[2, 3], [5, 5]], "outputs": [5, 11], "fn_name": "add"})
    chat = [
        {
            "role": "assistant",
            "content": "```python\nimport sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n```",
        }
    ]
    fn = [{"role": "assistant", "content": "```python\ndef add(a, b):\n    return a + b\n```"}]
    assert reward(completions=[chat, fn], input_output=[stdio, call]) == [1.0, 0.5]


def test_all_or_nothing_and_a_bad_row_named():
    strict = SandboxReward(timeout_s=3, site_packages=False, pool_size=0, tests_reward="all")
    assert strict(
        completions=["```python\ndef f(x):\n    return x\n```"], test_list=[["assert f(1) == 1", "assert f(2) == 3"]]
    ) == [0.0]
    with pytest.raises(ValueError, match="row 0, column 'test_list': test 0 does not compile"):
        strict(completions=["x"], test_list=[["assert ("]])
    assert pickle.loads(pickle.dumps(strict)).tests_reward == "all"


def test_rows_without_tests_keep_the_template_score(reward):
    assert reward(completions=["```python\nscore = 0.25\n```"], prompts=["p"], answer=["a"]) == [0.25]


def test_text_env_columns_reach_reward_callables(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p, "answer": a}) for p, a in [("2+2", "4"), ("3+3", "6")]) + "\n")
    env = TextEnv(
        TextEnvConfig(
            prompts_path=str(path),
            columns=["answer"],
            rewards=[{"fn": "tests.envs.test_tests_reward:exact_answer"}],
        )
    )
    values, _ = env.reward(["2+2", "3+3", "2+2"], ["4", "5", "4"])
    assert values.tolist() == [1.0, 0.0, 1.0]


def exact_answer(prompts, completions, answer):
    """A reward callable as TRL writes them: the dataset's column as a keyword list."""
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def test_templates_may_name_columns(tmp_path):
    # The template reads the row's expected answer as a literal; the code cannot change it.
    template = "{code}\nscore = float(result == {answer})\n"
    reward = SandboxReward(template=template, timeout_s=3, site_packages=False, pool_size=0)
    completions = ["```python\nresult = 4\n```", "```python\nresult = 4\n```"]
    assert reward(completions=completions, prompts=["2+2", "3+3"], answer=[4, 6]) == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"the template names \['answer'\]"):
        reward(completions=completions, prompts=["2+2", "3+3"])
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p, "answer": a}) for p, a in [("2+2", 4), ("3+3", 6)]) + "\n")
    env = TextEnv(
        TextEnvConfig(
            prompts_path=str(path),
            columns=["answer"],
            rewards=[
                {
                    "fn": "popgrpo.envs.rewards:execution_score",
                    "kwargs": {"template": template, "pool_size": 0, "site_packages": False},
                },
                {"fn": "popgrpo.envs.rewards:target_fraction", "weight": 0.0},  # takes no columns: gets none
            ],
        )
    )
    values, reasons = env.reward(["2+2", "3+3"], completions)
    assert values.tolist() == [1.0, 0.0] and reasons["execution_score:ok"] == 2
