"""What a ``policy.kind`` brings besides its policy: one registered object per kind.

:data:`popgrpo.registry.POLICIES` maps each ``policy.kind`` to a :class:`PolicyKind`. It builds
the policy (called like the plain factory a plugin may register instead) and answers every
question whose answer depends on what the policy is, so no code outside the registry asks for
a kind by name:

=====================  =========================================  ====================================
                       :class:`PolicyKind` (``gaussian``, and     :class:`CausalLMKind` (``causal_lm``)
                       any plugin factory)
=====================  =========================================  ====================================
rollouts               :class:`~.rollouts.IdeaRollouts`           :class:`~.rollouts.TextRollouts`
initial weights        the policy's, at the environment's         the initial adapters
                       ``idea_dim``
shared per actor       nothing                                    the base model, with
                                                                  ``policy.causal_lm.share_base``
members train          packed (``population.vectorize``) or one   in one mixed-adapter batch with a
together               after another                              shared base, else one after another
rollout worker         never                                      ``policy.causal_lm.rollout``
=====================  =========================================  ====================================

What a kind samples (``ideas``: vector or text) is a trait of its registry entry
(:func:`popgrpo.registry.ideas_of`), which the config reads without importing this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from popgrpo.algorithms.rollouts import IdeaRollouts, Rollouts, TextRollouts, init_generator
from popgrpo.config import Config, PolicyConfig
from popgrpo.envs import Environment, TextEnvironment, make_env
from popgrpo.registry import GROUP_TRAINERS, POLICIES, TEXT_IDEAS, VECTOR_IDEAS

if TYPE_CHECKING:
    from popgrpo.algorithms.engine_rollouts import RolloutService

__all__ = [
    "CAUSAL_LM",
    "GAUSSIAN",
    "CausalLMKind",
    "GroupTrainer",
    "PolicyKind",
    "group_trainer",
    "make_rollouts",
    "policy_kind",
]


class GroupTrainer(Protocol):
    """Members of one actor trained together: one metrics row per epoch per member, in member order."""

    def train_epochs(self, n_epochs: int) -> list[list[dict[str, Any]]]: ...


class PolicyKind:
    """A policy of vector ideas over an :class:`~popgrpo.envs.Environment`, built by ``build``.

    ``build(policy_config, idea_dim, generator)`` is the factory :func:`popgrpo.policies.make_policy`
    calls (the kind is callable as that factory). Subclasses change what differs.
    """

    ideas = VECTOR_IDEAS

    def __init__(self, build: Callable[..., Any]) -> None:
        self.build = build

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self.build, '__qualname__', self.build)})"

    def __call__(self, cfg: PolicyConfig, idea_dim: int, generator: torch.Generator | None = None) -> Any:
        return self.build(cfg, idea_dim, generator)

    def environment(self, config: Config, device: str | torch.device = "cpu") -> Environment | TextEnvironment:
        """The environment this kind's members train in (``env.kind``'s, on ``device``)."""
        return make_env(config.env, device)

    def shared(self, config: Config, member_ids: Sequence[int], device: torch.device) -> object | None:
        """What the members ``member_ids`` of one actor (or process) hold once between them; None: nothing."""
        del config, member_ids, device
        return None

    def rollouts(
        self,
        config: Config,
        member_id: int,
        env: Environment | TextEnvironment,
        device: torch.device,
        rollout_service: RolloutService | None = None,
        shared: object | None = None,
    ) -> Rollouts[Any]:
        """Member ``member_id``'s policy, reference and environment (:class:`~.rollouts.Rollouts`)."""
        del rollout_service, shared
        if not isinstance(env, Environment):
            raise TypeError(
                f"policy.kind={config.policy.kind} needs an Environment of vector ideas, got {type(env).__name__}"
            )
        return IdeaRollouts(config, member_id, env, device)

    def initial_weights(self, config: Config, member_id: int) -> dict[str, torch.Tensor]:
        """The weights member ``member_id`` starts from (detached copies), built in this process."""
        env = self.environment(config)
        if not isinstance(env, Environment):
            raise TypeError(f"policy.kind={config.policy.kind} needs an Environment of vector ideas")
        policy = self(config.policy, env.idea_dim, init_generator(config, member_id))
        return {k: v.detach().clone() for k, v in policy.state_dict().items()}

    def trainer(self, config: Config) -> str | None:
        """How the members of one actor train together: a :data:`~popgrpo.registry.GROUP_TRAINERS`
        name, or None for one after another. With ``population.vectorize``: ``packed``, one
        vectorised pass per step (:class:`~.packed.PackedMembers`)."""
        return "packed" if config.population.vectorize else None

    def uses_rollout_worker(self, config: Config) -> bool:
        """True when the run's members generate on a shared rollout worker."""
        del config
        return False


class CausalLMKind(PolicyKind):
    """``policy.kind=causal_lm``: a Hugging Face causal LM whose LoRA adapters are trained, over text."""

    ideas = TEXT_IDEAS

    def shared(self, config: Config, member_ids: Sequence[int], device: torch.device) -> object | None:
        """With ``policy.causal_lm.share_base``: one frozen base model with an adapter per member."""
        if not config.policy.causal_lm.share_base:
            return None
        from popgrpo.policies.shared_base import SharedBase

        return SharedBase(config.policy.causal_lm, list(member_ids), device, group_size=config.grpo.group_size)

    def rollouts(
        self,
        config: Config,
        member_id: int,
        env: Environment | TextEnvironment,
        device: torch.device,
        rollout_service: RolloutService | None = None,
        shared: object | None = None,
    ) -> Rollouts[Any]:
        if not isinstance(env, TextEnvironment):
            raise TypeError(f"policy.kind={config.policy.kind} needs a TextEnvironment, got {type(env).__name__}")
        return TextRollouts(config, member_id, env, device, rollout_service, shared=shared)

    def initial_weights(self, config: Config, member_id: int) -> dict[str, torch.Tensor]:
        """The initial adapters (the model is loaded in this process; the environment is not built)."""
        policy = self(config.policy, 0, init_generator(config, member_id))
        return {k: v.detach().clone() for k, v in policy.state_dict().items()}

    def trainer(self, config: Config) -> str | None:
        """Members on a shared base: ``shared_base``, one mixed-adapter batch (:class:`~.shared_members.SharedBaseMembers`)."""
        return "shared_base" if config.policy.causal_lm.share_base else None

    def uses_rollout_worker(self, config: Config) -> bool:
        return config.policy.causal_lm.rollout.on_worker()


def _gaussian(cfg: PolicyConfig, idea_dim: int, generator: torch.Generator | None = None) -> Any:
    from popgrpo.policies import gaussian_policy

    return gaussian_policy(cfg, idea_dim, generator)


def _causal_lm(cfg: PolicyConfig, idea_dim: int, generator: torch.Generator | None = None) -> Any:
    from popgrpo.policies import causal_lm_policy

    return causal_lm_policy(cfg, idea_dim, generator)


GAUSSIAN = PolicyKind(_gaussian)
CAUSAL_LM = CausalLMKind(_causal_lm)


def policy_kind(name: str) -> PolicyKind:
    """The :class:`PolicyKind` registered as ``name``; a plugin's plain factory is a vector kind."""
    entry = POLICIES.get(name)
    return entry if isinstance(entry, PolicyKind) else PolicyKind(entry)


def make_rollouts(
    config: Config,
    member_id: int,
    env: Environment | TextEnvironment | None = None,
    device: str | torch.device = "cpu",
    rollout_service: RolloutService | None = None,
    shared: object | None = None,
) -> Rollouts[Any]:
    """The rollouts ``policy.kind``'s :class:`PolicyKind` gives member ``member_id``, over ``env``
    (built from ``config.env`` when None); ``rollout_service``: the shared rollout worker text
    members generate on (None: their own model); ``shared``: what the members of this actor hold
    once between them (:meth:`PolicyKind.shared`)."""
    device = torch.device(device)
    kind = policy_kind(config.policy.kind)
    if env is None:
        env = kind.environment(config, device)
    return kind.rollouts(config, member_id, env, device, rollout_service, shared)


def group_trainer(config: Config, members: Sequence[Any]) -> GroupTrainer | None:
    """What trains ``members`` (one actor's :class:`~popgrpo.algorithms.member.Member` objects)
    together, as their kind names it (:meth:`PolicyKind.trainer`); None: one after another."""
    name = policy_kind(config.policy.kind).trainer(config)
    return None if name is None else GROUP_TRAINERS.get(name)(members)
