"""Where every member starts: its initial weights, and θ_0, the round-0 weights of the run.

A member's policy is built from the stream :func:`~popgrpo.algorithms.rollouts.init_generator` gives it: one stream shared
by all members (``population.shared_init``, the default: every member starts from the same
weights) or one per member. θ_0, the round-0 weights, is what later rounds measure change
against: WiSE-FT's early checkpoint and the base of task vectors
(:mod:`popgrpo.algorithms.merges`), and the svd mutation's base
(:meth:`popgrpo.algorithms.rollouts.Rollouts.round0`, a member's own initial weights).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from popgrpo.algorithms.policy_kinds import policy_kind
from popgrpo.config import Config
from popgrpo.core.merge import soup

__all__ = ["initial_weights", "round0_weights"]


def initial_weights(config: Config, member_id: int = 0) -> dict[str, torch.Tensor]:
    """The weights a member starts from (a language model's: its initial adapters), detached copies,
    as ``policy.kind``'s :class:`~popgrpo.algorithms.policy_kinds.PolicyKind` builds them in this
    process (a language model is loaded here)."""
    return policy_kind(config.policy.kind).initial_weights(config, member_id)


def round0_weights(config: Config, member_ids: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """θ_0, the early checkpoint of WiSE-FT and the base of task vectors: the round-0 weights.

    With ``population.shared_init`` (the default) every member starts there. Otherwise it is
    the uniform soup of the given members' own initial weights (all members when None).
    """
    if config.population.shared_init:
        return initial_weights(config, 0)
    ids = range(config.population.size) if member_ids is None else member_ids
    return soup([initial_weights(config, k) for k in ids])
