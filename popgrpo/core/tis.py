"""Truncated importance sampling (TIS): training on completions another engine sampled.

When a rollout engine (vLLM) samples the completions, the log-probabilities it reports differ
from the trainer's for the same weights and tokens (other kernels, another precision, batch
shapes). The trainer computes its own log-probs, ``logp_train_old``, and the policy-gradient
term of each token is weighted by

    w = min(exp(logp_train_old − logp_rollout), C)

the importance ratio of the trainer's sampling policy over the engine's, truncated at ``C``
so that a token the engine found far less likely than the trainer does not blow up the
update (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training"). The weight carries no gradient. The KL and entropy terms are not weighted.

Pure torch; nothing holds state.
"""

from __future__ import annotations

import torch

__all__ = ["tis_weights"]


def tis_weights(train_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token TIS weights ``min(exp(train_logp − rollout_logp), cap)``, detached.

    Args:
        train_logp: ``[N, T]`` log-probs of the sampled tokens under the trainer's policy at
            sampling time (``logp_train_old``).
        rollout_logp: ``[N, T]`` the rollout engine's log-probs of the same tokens.
        cap: the truncation ``C`` (at least 1: equal log-probs give weight exactly 1).

    Raises:
        ValueError: the shapes differ, or ``cap`` is below 1.
    """
    if train_logp.shape != rollout_logp.shape:
        raise ValueError(
            f"train_logp and rollout_logp must have one shape; got {tuple(train_logp.shape)} "
            f"and {tuple(rollout_logp.shape)}"
        )
    if not cap >= 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap}")
    ratio = torch.exp(train_logp.detach() - rollout_logp.detach().to(train_logp.dtype))
    return torch.clamp(ratio, max=cap)
