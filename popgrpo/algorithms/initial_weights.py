"""Where every member starts: its initial weights, and θ_0, the round-0 weights of the run.

A member's policy is built from the stream :func:`init_generator` gives it: one stream shared
by all members (``population.shared_init``, the default: every member starts from the same
weights) or one per member. θ_0, the round-0 weights, is what later rounds measure change
against: WiSE-FT's early checkpoint and the base of task vectors
(:mod:`popgrpo.algorithms.merges`), and the svd mutation's base
(:meth:`popgrpo.algorithms.rollouts.Rollouts.round0`, a member's own initial weights).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from popgrpo.config import Config
from popgrpo.core.merge import soup
from popgrpo.core.seeding import STREAM_INIT, torch_generator
from popgrpo.envs import Environment, make_env
from popgrpo.policies import make_policy

__all__ = ["init_generator", "initial_weights", "round0_weights"]


def init_generator(config: Config, member_id: int) -> torch.Generator:
    """The stream a member's initial weights are drawn from: shared unless ``shared_init`` is off."""
    key = (STREAM_INIT,) if config.population.shared_init else (STREAM_INIT, member_id)
    return torch_generator(config.run.seed, *key)


def initial_weights(config: Config, member_id: int = 0) -> dict[str, torch.Tensor]:
    """The weights a member starts from (a language model's: its initial adapters), detached copies.

    For ``policy.kind=causal_lm`` this loads the model in this process.
    """
    env = make_env(config.env) if config.policy.kind == "gaussian" else None
    idea_dim = env.idea_dim if isinstance(env, Environment) else 0
    policy = make_policy(config.policy, idea_dim, init_generator(config, member_id))
    state: Mapping[str, torch.Tensor] = policy.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}


def round0_weights(config: Config, member_ids: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """θ_0, the early checkpoint of WiSE-FT and the base of task vectors: the round-0 weights.

    With ``population.shared_init`` (the default) every member starts there. Otherwise it is
    the uniform soup of the given members' own initial weights (all members when None).
    """
    if config.population.shared_init:
        return initial_weights(config, 0)
    ids = range(config.population.size) if member_ids is None else member_ids
    return soup([initial_weights(config, k) for k in ids])
