import json
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from popgrpo.config import EnvConfig, load_config
from popgrpo.core.seeding import torch_generator
from popgrpo.envs.gym import DEFAULT_ACTION_BOUND, ENV_ID, STREAM_REWARD, IdeaGymEnv, register_gym_env
from popgrpo.envs.idea import IdeaEnv


def _episodes(env: IdeaGymEnv, actions: np.ndarray, seed: int) -> tuple[list[int], list[float], list[dict]]:
    """Run one episode per action, seeding only the first reset (the streams then continue)."""
    prompts, rewards, infos = [], [], []
    for i, action in enumerate(actions):
        _, reset_info = env.reset(seed=seed if i == 0 else None)
        _, reward, terminated, truncated, info = env.step(action)
        assert terminated and not truncated
        prompts.append(reset_info["prompt"])
        rewards.append(reward)
        infos.append(info)
    return prompts, rewards, infos


def test_passes_gymnasium_env_checker():
    with warnings.catch_warnings():
        # Gymnasium recommends a [-1, 1] action box; ours is in idea units on purpose (module docstring).
        warnings.filterwarnings("ignore", message=".*symmetric and normalized space.*")
        check_env(IdeaGymEnv(n_prompts=8), skip_render_check=True)
        register_gym_env()
        check_env(gymnasium.make(ENV_ID, config=EnvConfig(), n_prompts=4).unwrapped, skip_render_check=True)


def test_rewards_equal_idea_env_reward_on_the_same_seed_stream():
    env = IdeaGymEnv(EnvConfig(noise_std=0.3), n_prompts=8)
    actions = np.random.default_rng(0).normal(0.0, 2.0, (64, 16)).astype(np.float32)
    _, rewards, infos = _episodes(env, actions, seed=7)

    reference = IdeaEnv()
    generator = torch_generator(7, STREAM_REWARD)
    ideas = torch.from_numpy(actions)
    # One idea per episode: the adapter draws each idea's Bernoulli and noise in turn.
    expected = [float(reference.reward(ideas[i : i + 1], generator)[0]) for i in range(len(actions))]
    assert rewards == expected
    assert any(r != 0.0 for r in rewards) and any(r == 0.0 for r in rewards)  # both outcomes of B occur
    assert np.allclose([i["complexity"] for i in infos], reference.complexity(ideas).numpy())
    assert np.allclose(np.stack([i["behaviour"] for i in infos]), reference.behaviour(ideas).numpy())


def test_reset_seed_reproduces_prompts_and_rewards():
    env = IdeaGymEnv(n_prompts=8)
    actions = np.random.default_rng(1).normal(0.0, 1.0, (32, 16)).astype(np.float32)
    first = _episodes(env, actions, seed=3)
    again = _episodes(env, actions, seed=3)
    other = _episodes(env, actions, seed=4)
    assert first[:2] == again[:2]
    assert first[:2] != other[:2]
    assert set(first[0]) == set(range(8))  # 32 draws reach every prompt
    obs, info = env.reset(seed=3)
    assert obs.dtype == np.float32 and obs.sum() == 1.0 and obs[info["prompt"]] == 1.0
    # The constructor's seed stands in for the first reset's; an explicit seed still wins.
    assert _episodes(IdeaGymEnv(seed=3), actions, seed=None)[:2] == first[:2]


def test_action_box_is_the_documented_bound_and_outside_actions_are_clipped():
    env = IdeaGymEnv(n_prompts=8)
    assert env.action_space.shape == (16,)
    assert np.all(env.action_space.low == -DEFAULT_ACTION_BOUND)
    assert np.all(env.action_space.high == DEFAULT_ACTION_BOUND)
    assert env.observation_space.shape == (8,)
    assert IdeaGymEnv(action_bound=5.0).action_space.high.max() == 5.0

    far = np.full(16, 1000.0, dtype=np.float32)
    _, _, infos = _episodes(env, np.stack([far, np.zeros(16, np.float32)]), seed=0)
    assert infos[0]["clipped"] and not infos[1]["clipped"]
    assert infos[0]["complexity"] == pytest.approx(DEFAULT_ACTION_BOUND * 4.0)  # ‖(32, …, 32)‖ in R^16


def test_wrong_action_shape_non_finite_action_and_step_before_reset_raise():
    env = IdeaGymEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(16, np.float32))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(15, np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((2, 16), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full(16, np.nan, np.float32))
    env.step(np.zeros(16, np.float32))
    with pytest.raises(RuntimeError, match="reset"):  # one idea per episode
        env.step(np.zeros(16, np.float32))


def test_built_from_popgrpo_config_or_rllib_style_dict():
    cfg = load_config(overrides=["env.dim=8", "policy.n_prompts=3", "run.seed=5"])
    env = IdeaGymEnv.from_config(cfg)
    assert env.action_space.shape == (8,) and env.observation_space.shape == (3,)
    assert env.initial_seed == 5
    # RLlib passes its env_config dict: adapter keys plus EnvConfig fields.
    env = IdeaGymEnv({"n_prompts": 2, "action_bound": 10.0, "dim": 4, "noise_std": 0.0})
    assert env.env_config.noise_std == 0.0 and env.action_space.shape == (4,) and env.action_bound == 10.0
    with pytest.raises(ValueError, match="no_such_field"):
        IdeaGymEnv({"no_such_field": 1})


def test_importing_popgrpo_envs_does_not_import_gymnasium():
    code = (
        "import json, sys, popgrpo.envs as e; before = 'gymnasium' in sys.modules; "
        "e.IdeaGymEnv; after = 'gymnasium' in sys.modules; "
        "import gymnasium; print(json.dumps([before, after, 'popgrpo/Idea-v0' in gymnasium.registry]))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    imported_with_envs, imported_on_first_use, registered = json.loads(res.stdout)
    assert not imported_with_envs and imported_on_first_use
    assert not registered  # reaching the adapter does not register the environment id
