"""A Gymnasium view of the idea environment, so RLlib (or any Gymnasium learner) can train on it.

One episode is one idea for one prompt, which is what a GRPO sample is:

* **observation**: the prompt id, one-hot, ``Box(0, 1, (n_prompts,), float32)``. A one-hot
  ``Box`` rather than ``Discrete(n_prompts)`` because RLlib's default (new API stack) PPO
  model builds its MLP encoder from a 1-D ``Box`` only; a ``Discrete`` observation needs an
  extra one-hot connector. The one-hot is what that connector would produce, and it plays
  the part of popgrpo's learnable prompt embedding (the encoder's first layer).
* **action**: the idea, ``Box(-action_bound, action_bound, (dim,), float32)``. The default
  bound 32 is generous: the farthest peak centre lies at ``radius_max`` = 8 from the origin
  and the widest bump has σ = 5.5, so beyond a coordinate of 32 the quality is below 1e-4 of
  its peak (and p_exec is at its floor); MaxEnt-GRPO's widest ideas (norm ≈ 29) fit too.
  Actions outside the box are clipped to it (``info["clipped"]``), so a learner that does
  not clip still gets a defined reward; actions of the wrong shape or with NaN/inf raise.
* **reward**: :meth:`IdeaEnv.reward` of that one idea, drawn from a torch generator seeded
  from ``reset(seed=...)`` through :func:`popgrpo.core.seeding.derive_seed`; then the episode
  ends (``terminated=True``). ``info`` carries the idea's ``behaviour`` and ``complexity``.

Seeding follows Gymnasium: ``reset(seed=s)`` restarts both streams (the prompt draw and the
reward noise), ``reset()`` continues them, so a seed fixes the whole sequence of episodes.
Which prompt an episode gets is drawn uniformly from the prompt stream.

Use it directly (``IdeaGymEnv(EnvConfig(), n_prompts=8)``), through Gymnasium after
:func:`register_gym_env` (``gymnasium.make("popgrpo/Idea-v0", config=EnvConfig())``), or hand
the class to RLlib (``PPOConfig().environment(IdeaGymEnv, env_config={"n_prompts": 8})``):
RLlib calls the class with its ``env_config`` dict, whose adapter keys (``n_prompts``,
``action_bound``, ``seed``) are taken out and whose other keys are :class:`EnvConfig` fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from popgrpo.config import Config, EnvConfig
from popgrpo.core.seeding import derive_seed, torch_generator
from popgrpo.envs import Environment, make_env

__all__ = ["DEFAULT_ACTION_BOUND", "ENV_ID", "STREAM_PROMPTS", "STREAM_REWARD", "IdeaGymEnv", "register_gym_env"]

ENV_ID = "popgrpo/Idea-v0"
DEFAULT_ACTION_BOUND = 32.0
# Seed-stream keys under the reset seed (see popgrpo.core.seeding): one per purpose, so the
# reward noise a seed gives does not depend on how prompts are drawn.
STREAM_PROMPTS = 0
STREAM_REWARD = 1

_ADAPTER_KEYS = ("n_prompts", "action_bound", "seed")


class IdeaGymEnv(gymnasium.Env):
    """One-step episodes: observe a prompt, propose one idea, receive its execution reward.

    Args:
        config: the environment, as an :class:`EnvConfig`, or a mapping (RLlib's
            ``env_config``) of adapter keys (``n_prompts``, ``action_bound``, ``seed``) plus
            :class:`EnvConfig` fields; ``None`` is the paper's environment.
        n_prompts: number of prompts P (``policy.n_prompts`` in a popgrpo run).
        action_bound: A of the action box ``[-A, A]^dim`` (see the module docstring).
        seed: the seed of the first ``reset()`` when that call passes none; a later
            ``reset(seed=...)`` overrides it. ``None`` draws fresh entropy (Gymnasium's default).
            Leave it out of RLlib's ``env_config`` when an env runner holds several copies
            (``num_envs_per_env_runner > 1``): they would all get it and draw the same ideas'
            rewards. Seed RLlib with ``.debugging(seed=...)``, which resets copy i with its
            own seed.
    """

    # gymnasium.make reads metadata from the class, though gymnasium.Env annotates it per instance.
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}  # pyright: ignore[reportIncompatibleVariableOverride]
    render_mode = None

    def __init__(
        self,
        config: EnvConfig | Mapping[str, Any] | None = None,
        *,
        n_prompts: int | None = None,
        action_bound: float | None = None,
        seed: int | None = None,
    ) -> None:
        env_config, options = _split_config(config)
        n_prompts = int(n_prompts if n_prompts is not None else options.get("n_prompts", 8))
        action_bound = float(
            action_bound if action_bound is not None else options.get("action_bound", DEFAULT_ACTION_BOUND)
        )
        seed = seed if seed is not None else options.get("seed")
        if n_prompts < 1:
            raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
        if not action_bound > 0:
            raise ValueError(f"action_bound must be > 0, got {action_bound}")
        self.env_config = env_config
        idea_env = make_env(env_config)
        if not isinstance(idea_env, Environment):
            raise ValueError(f"IdeaGymEnv needs an environment of vector ideas, not env.kind={env_config.kind!r}")
        self.idea_env: Environment = idea_env
        self.n_prompts = n_prompts
        self.action_bound = action_bound
        self.initial_seed = None if seed is None else int(seed)
        dim = self.idea_env.idea_dim
        self.observation_space = spaces.Box(0.0, 1.0, (n_prompts,), np.float32)
        self.action_space = spaces.Box(-action_bound, action_bound, (dim,), np.float32)
        self._reward_generator: torch.Generator | None = None
        self._prompt: int | None = None  # the open episode's prompt; None between episodes

    @classmethod
    def from_config(cls, config: Config, **kwargs: Any) -> IdeaGymEnv:
        """The environment a popgrpo run trains on: its env, its prompts, its root seed."""
        kwargs.setdefault("n_prompts", config.policy.n_prompts)
        kwargs.setdefault("seed", config.run.seed)
        return cls(config.env, **kwargs)

    # ---- Gymnasium API ---------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is None and self._reward_generator is None:
            seed = self.initial_seed if self.initial_seed is not None else _fresh_seed()
        if seed is not None:
            super().reset(seed=seed)  # Gymnasium's bookkeeping (np_random_seed), then our streams
            self._np_random = np.random.default_rng(derive_seed(seed, STREAM_PROMPTS))
            self._reward_generator = torch_generator(seed, STREAM_REWARD)
        self._prompt = int(self.np_random.integers(self.n_prompts))
        return self._observation(), {"prompt": self._prompt}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._prompt is None or self._reward_generator is None:  # reset() sets both
            raise RuntimeError("IdeaGymEnv.step() called without an open episode: call reset() first")
        idea = np.asarray(action, dtype=np.float32)
        if idea.shape != self.action_space.shape:
            raise ValueError(f"action must have shape {self.action_space.shape} (one idea), got {idea.shape}")
        if not np.isfinite(idea).all():
            raise ValueError("action contains NaN or inf")
        clipped = bool((np.abs(idea) > self.action_bound).any())
        idea = np.clip(idea, -self.action_bound, self.action_bound)
        ideas = torch.from_numpy(idea)[None]  # [1, d]
        reward = float(self.idea_env.reward(ideas, self._reward_generator)[0])
        info = {
            "prompt": self._prompt,
            "behaviour": self.idea_env.behaviour(ideas)[0].numpy(),
            "complexity": float(self.idea_env.complexity(ideas)[0]),
            "clipped": clipped,
        }
        observation = self._observation()
        self._prompt = None
        return observation, reward, True, False, info

    def _observation(self) -> np.ndarray:
        one_hot = np.zeros(self.n_prompts, dtype=np.float32)
        one_hot[self._prompt] = 1.0
        return one_hot


def register_gym_env(env_id: str = ENV_ID) -> str:
    """Register :class:`IdeaGymEnv` with Gymnasium under ``env_id`` (idempotent); return the id.

    A function, not an import side effect, so importing popgrpo never touches Gymnasium's
    global registry. Registration is per process: Ray workers that ``gymnasium.make`` the id
    must call it too, which is why RLlib is better given the class itself.
    """
    if env_id not in gymnasium.registry:
        # gymnasium types entry_point as a callable of any **kwargs; it passes only those make() is given.
        gymnasium.register(id=env_id, entry_point=IdeaGymEnv)  # pyright: ignore[reportArgumentType]
    return env_id


def _split_config(config: EnvConfig | Mapping[str, Any] | None) -> tuple[EnvConfig, dict[str, Any]]:
    """``(EnvConfig, adapter options)`` from whatever form the caller (or RLlib) passed."""
    if config is None:
        return EnvConfig(), {}
    if isinstance(config, EnvConfig):
        return config, {}
    if isinstance(config, Mapping):
        fields = {k: v for k, v in config.items() if k not in _ADAPTER_KEYS}
        options = {k: config[k] for k in _ADAPTER_KEYS if k in config}
        return EnvConfig.model_validate(fields), options
    raise TypeError(f"config must be an EnvConfig, a mapping or None, got {type(config).__name__}")


def _fresh_seed() -> int:
    """A seed from OS entropy, for a first ``reset()`` that was given none (Gymnasium's behaviour)."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))
