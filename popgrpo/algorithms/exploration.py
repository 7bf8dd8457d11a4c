"""The ``explore`` section's choices: advantage estimators and policy losses, as registered functions.

``explore.advantage`` names an entry of :data:`~popgrpo.registry.ADVANTAGES`, a function
``(returns [P, g], config) → advantages [P, g]`` of one group (or one complexity bin of a group,
``maxent.complexity_bins``) of shaped returns; ``explore.policy_loss`` names an entry of
:data:`~popgrpo.registry.POLICY_LOSSES`, a function ``(logp, old_logp, advantages, mask, config,
generator) → per-token loss terms`` that the member reduces as it reduces the clipped
surrogate (its mean for vector ideas, the masked token aggregate for text). ``advantages``
broadcasts against ``logp``; ``mask`` is 1 on the tokens (ideas) that count.

The math is in :mod:`popgrpo.core.exploration`, :mod:`popgrpo.core.covariance` and
:mod:`popgrpo.core.grpo`; docs/MECHANISMS.md says what each does and when to use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from popgrpo.core.covariance import clip_cov_terms, kl_cov_terms
from popgrpo.core.exploration import maxk_advantages, passk_advantages, reinforce_advantages
from popgrpo.core.grpo import clipped_terms, group_advantages

if TYPE_CHECKING:
    from popgrpo.config import Config

__all__ = [
    "clip_cov_loss",
    "clip_loss",
    "group_advantage",
    "kl_cov_loss",
    "maxk_advantage",
    "passk_advantage",
    "reinforce_advantage",
]


# ---- advantage estimators (explore.advantage) ------------------------------------------------
def group_advantage(returns: torch.Tensor, config: Config) -> torch.Tensor:
    """GRPO's ``(r − mean)/(std + ε)`` (the default)."""
    return group_advantages(returns, config.grpo.adv_eps)


def passk_advantage(returns: torch.Tensor, config: Config) -> torch.Tensor:
    """Chen et al. 2025's closed-form pass@k advantage, correct = return ``>= eval.success_threshold``, k = ``explore.k``."""
    return passk_advantages(returns, config.eval.success_threshold, config.explore.k, config.grpo.adv_eps)


def maxk_advantage(returns: torch.Tensor, config: Config) -> torch.Tensor:
    """PKPO's max@k advantage of continuous returns with the leave-one-out subset baseline, k = ``explore.k``."""
    return maxk_advantages(returns, config.explore.k)


def reinforce_advantage(returns: torch.Tensor, config: Config) -> torch.Tensor:
    """W-REINFORCE's ±1 (correct = return ``>= eval.success_threshold``); ``explore.positive_weight`` is its λ."""
    return reinforce_advantages(returns, config.eval.success_threshold)


# ---- policy losses (explore.policy_loss) -----------------------------------------------------
def clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: Config,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """PPO's clipped surrogate with ``[1 − grpo.clip, 1 + explore.clip_high]`` (clip-higher; the default: symmetric)."""
    del mask, generator
    return clipped_terms(logp, old_logp, advantages, config.grpo.clip, config.explore.clip_high)


def clip_cov_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: Config,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Clip-Cov on top of :func:`clip_loss`: a random ``explore.cov_ratio`` share of the tokens whose
    covariance lies in ``[explore.clip_cov_low, explore.clip_cov_high]`` loses its gradient."""
    explore = config.explore
    terms = clip_loss(logp, old_logp, advantages, mask, config, generator)
    kept, _ = clip_cov_terms(
        terms,
        logp,
        advantages,
        mask,
        ratio=explore.cov_ratio,
        low=explore.clip_cov_low,
        high=explore.clip_cov_high,
        generator=generator,
    )
    return kept


def kl_cov_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: Config,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """KL-Cov: the unclipped surrogate, plus ``explore.kl_cov_coef·|logp − old_logp|`` on the
    ``explore.cov_ratio`` share of tokens of largest covariance."""
    del generator
    terms, _ = kl_cov_terms(
        logp, old_logp, advantages, mask, ratio=config.explore.cov_ratio, coef=config.explore.kl_cov_coef
    )
    return terms
