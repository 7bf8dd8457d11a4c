"""The execution reward through the warm pool: for TRL-style trainers and for the text environment."""

import pickle

import pytest

from popgrpo.config import TextEnvConfig
from popgrpo.envs.rewards import SandboxReward, execution_score
from popgrpo.envs.text import TextEnv

pytestmark = pytest.mark.requires("sandbox")

COMPLETIONS = [
    "Here:\n```python\nscore = 0.5\n```",
    "```python\nraise ValueError('no')\n```",
    "no code at all",
    "```python\nimport os\nos.fork()\nscore = 1.0\n```",
    "```python\nscore = float(len(PROMPT)) / 10\n```",
]
PROMPTS = ["p1", "p2", "p3", "p4", "longprompt"]
TEMPLATE = "PROMPT = {prompt}\n{code}"


@pytest.fixture(scope="module")
def reward():
    return SandboxReward(template=TEMPLATE, timeout_s=2, memory_mb=256, site_packages=False, pool_size=2)


def test_called_as_trl_calls_it(reward):
    # GRPOTrainer._calculate_rewards: prompts, completions, completion_ids and the dataset's
    # columns as keywords, plus the trainer's state and logging hooks.
    rewards = reward(
        prompts=PROMPTS,
        completions=COMPLETIONS,
        completion_ids=[[1, 2]] * 5,
        answer=["a"] * 5,
        trainer_state=None,
        log_extra=lambda *a: None,
        log_metric=lambda *a: None,
    )
    assert rewards == [0.5, 0.0, 0.0, 0.0, 1.0]
    assert reward.last_reasons == ["ok", "crash", "no_code", "forbidden", "ok"]
    assert all(type(r) is float for r in rewards)


def test_conversational_completions_score_their_last_message(reward):
    chats = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    assert reward(completions=chats, prompts=prompts) == reward(completions=COMPLETIONS, prompts=PROMPTS)


def test_the_pool_gives_what_the_one_shot_path_gives(reward):
    one_shot = execution_score(
        PROMPTS, COMPLETIONS, template=TEMPLATE, timeout_s=2, memory_mb=256, site_packages=False, pool_size=0
    )
    pooled = execution_score(
        PROMPTS, COMPLETIONS, template=TEMPLATE, timeout_s=2, memory_mb=256, site_packages=False, pool_size=2
    )
    assert pooled == one_shot
    assert reward(COMPLETIONS, PROMPTS) == one_shot[0]
    cold = SandboxReward(template=TEMPLATE, timeout_s=2, memory_mb=256, site_packages=False, pool_size=0)
    assert cold(COMPLETIONS, PROMPTS) == one_shot[0]


def test_submit_scores_one_completion_as_soon_as_it_exists(reward):
    future = reward.submit(COMPLETIONS[0], PROMPTS[0])
    assert future.result(timeout=30).score == 0.5


def test_it_pickles_with_its_settings_only(reward):
    copy = pickle.loads(pickle.dumps(reward))
    assert copy.limits == reward.limits and copy.__name__ == "sandbox_execution"
    assert copy(COMPLETIONS[:1], PROMPTS[:1]) == [0.5]


def test_the_text_env_passes_its_pool_size_to_rewards_that_take_one():
    exec_fn, frac_fn = "popgrpo.envs.rewards:execution_score", "popgrpo.envs.rewards:target_fraction"

    def kwargs(**cfg):
        env = TextEnv(TextEnvConfig(prompts=["p"], rewards=[{"fn": exec_fn}, {"fn": frac_fn}], **cfg))
        return [r[3] for r in env.rewards]

    assert kwargs() == [{"pool_size": None}, {}]  # the config's default: a pool of the default size
    assert kwargs(sandbox_pool_size=0) == [{"pool_size": 0}, {}]
    env = TextEnv(
        TextEnvConfig(prompts=["p"], sandbox_pool_size=3, rewards=[{"fn": exec_fn, "kwargs": {"pool_size": 1}}])
    )
    assert env.rewards[0][3] == {"pool_size": 1}  # the reward's own kwargs win


@pytest.mark.slow
def test_trl_takes_it_as_a_synchronous_reward_function(reward):
    from trl.trainer.utils import get_callable_name, is_async_callable  # slow to import

    assert get_callable_name(reward) == "sandbox_execution"
    assert not is_async_callable(reward)
