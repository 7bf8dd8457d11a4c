"""Environments: what an idea is worth, where it sits in behaviour space, how complex it is.

Bring your own by implementing :class:`Environment` (ideas are vectors, for policies such as
the Gaussian one) or :class:`TextEnvironment` (ideas are completions of a language-model
member); a member needs nothing else (:mod:`popgrpo.algorithms.rollouts` says which is used).

``IdeaGymEnv`` and ``register_gym_env`` (:mod:`popgrpo.envs.gym`, the Gymnasium adapter for
RLlib and other Gymnasium learners) are importable from here too, but loaded on first use:
popgrpo itself never needs Gymnasium, so importing this package must not import it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from popgrpo.registry import ENVIRONMENTS

if TYPE_CHECKING:  # annotations only: importing this package (and popgrpo.envs.kinds) loads no torch
    import torch

    from popgrpo.config import EnvConfig
    from popgrpo.envs.text import TextScores

__all__ = ["Environment", "Landscape", "TextEnvironment", "code_env", "idea_env", "make_env", "text_env"]


@runtime_checkable
class Environment(Protocol):
    """What a GRPO member asks of an environment. All methods are batched over dim 0.

    An environment that knows its reward's noise-free expectation may also offer
    ``execute(ideas, generator) -> (rewards [N], expectations [N], success [N] bool)`` (as
    :class:`IdeaEnv` does); members then call it instead of :meth:`reward` and log the mean
    expectation as ``control_expected_reward`` and the share of successes as ``success``; with ``expected_reward(ideas) -> [N]`` as well, that column
    covers every idea even when only some are executed (``reward.proxy.control_fraction``).
    """

    idea_dim: int
    behaviour_dim: int

    def reward(self, ideas: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``[N, d]`` ideas → ``[N]`` (possibly stochastic) execution rewards."""
        ...

    def behaviour(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N, behaviour_dim]`` descriptors in [0, 1]."""
        ...

    def complexity(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` complexity (the thinking-length proxy)."""
        ...


@runtime_checkable
class Landscape(Protocol):
    """An :class:`Environment` whose reward comes from peaks it can name (:class:`IdeaEnv`).

    Members of such an environment record the discovery metrics
    (:mod:`popgrpo.core.discovery`): which peaks their ideas reached, and the best noise-free
    quality. ``peak_quality`` is ``[n_peaks]``, each peak's height (its maximum quality).
    """

    peak_quality: torch.Tensor

    def quality(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` noise-free quality ``Q(x)``."""
        ...

    def peak(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` int64: the peak each idea belongs to (whose bump gives its ``Q``)."""
        ...


@runtime_checkable
class TextEnvironment(Protocol):
    """What a language-model member asks of its environment (:class:`popgrpo.envs.text.TextEnv`)."""

    prompts: list[str]
    behaviour_dim: int

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> tuple[torch.Tensor, Counter[str]]:
        """``N`` (prompt, completion) pairs → ``[N]`` rewards and reason counts ``"fn:reason" → n``."""
        ...

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> TextScores:
        """:meth:`reward`, plus each completion's execution success (``[N]`` bool, or None when no
        reward callable gives reasons): what a member's step logs of the ``N`` completions."""
        ...

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """``N`` texts → ``[N, E]`` unit embeddings: what the archive stores, novelty and diversity compare."""
        ...

    def behaviour(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[N, E]`` → ``[N, behaviour_dim]`` descriptors in [0, 1]."""
        ...


def make_env(cfg: EnvConfig, device: str | torch.device = "cpu"):
    """Build the environment ``cfg.kind`` names (an :class:`popgrpo.config.EnvConfig`).

    The name is looked up in :data:`popgrpo.registry.ENVIRONMENTS` (an :class:`~popgrpo.envs.kinds.EnvKind`
    or a plugin's factory): ``idea`` (:func:`idea_env`), ``text`` (:func:`text_env`), ``code``
    (:func:`code_env`) or a plugin's; ``device`` is where an embedding model runs.
    """
    return ENVIRONMENTS.get(cfg.kind)(cfg, device)


def idea_env(cfg: EnvConfig, device: str | torch.device = "cpu") -> Environment:
    """``env.kind=idea``: the paper's simulated idea environment (:class:`popgrpo.envs.idea.IdeaEnv`)."""
    from popgrpo.envs.idea import IdeaEnv

    del device  # the landscape is a few CPU tensors
    return IdeaEnv(cfg)


def text_env(cfg: EnvConfig, device: str | torch.device = "cpu") -> TextEnvironment:
    """``env.kind=text``: prompts, reward callables, embedding behaviours (:class:`popgrpo.envs.text.TextEnv`)."""
    from popgrpo.envs.text import TextEnv

    return TextEnv(cfg.text, device)


def code_env(cfg: EnvConfig, device: str | torch.device = "cpu") -> TextEnvironment:
    """``env.kind=code``: problems with their own tests as the reward (:class:`popgrpo.envs.code.CodeEnv`)."""
    from popgrpo.envs.code import CodeEnv

    return CodeEnv(cfg, device)


_LAZY = {"IdeaGymEnv": "popgrpo.envs.gym", "register_gym_env": "popgrpo.envs.gym"}


def __getattr__(name: str):
    """Load the Gymnasium adapter only when one of its names is asked for (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
