"""Entropy control by the covariance of log-probability and advantage: Clip-Cov and KL-Cov.

Cui et al. 2025 ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617, §4) show that a policy's entropy falls in proportion to the
covariance between an action's log-probability and its advantage, and that a small share of
tokens with the largest covariance drives the collapse. Their two remedies act on those
tokens only. With ``N`` valid tokens (ideas, for a vector policy) the centred cross-product of
token ``i`` is::

    Cov_i = (log π(y_i) − mean_j log π(y_j)) · (A_i − mean_j A_j)

* **Clip-Cov**: among the tokens with ``ω_low <= Cov_i <= ω_high``, ``max(1, ⌊r·N⌋)`` drawn at
  random have their policy-gradient term removed (no gradient flows through them).
* **KL-Cov**: the ``max(1, ⌊k·N⌋)`` tokens of largest ``Cov_i`` get the penalty
  ``β·|log π(y_i) − log π_old(y_i)|`` added to their (unclipped) policy-gradient term.

Everything here works on tensors of any shape with a 0/1 mask of the same shape (``[N, T]``
tokens of completions, or ``[P, G]`` ideas with an all-ones mask): what a "token" is is the
caller's. The functions return per-token loss terms; the caller reduces them (its mean, or a
masked token aggregate).
"""

from __future__ import annotations

import torch

__all__ = ["clip_cov_terms", "kl_cov_terms", "token_covariance"]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Cov_i`` of the module docstring for every valid token (``mask`` 1), ``−inf`` elsewhere; no gradient.

    ``advantages`` broadcasts against ``logp`` (``[N, 1]`` for tokens sharing their completion's).
    Means are over the valid tokens of the whole batch.
    """
    logp = logp.detach().to(torch.float64)
    adv = advantages.detach().to(torch.float64).expand_as(logp)
    valid = mask.to(torch.float64)
    cov = (logp - _masked_mean(logp, valid)) * (adv - _masked_mean(adv, valid))
    return torch.where(mask > 0, cov, -torch.inf)


def _count(share: float, n_valid: int) -> int:
    return max(1, int(share * n_valid)) if n_valid else 0


def clip_cov_terms(
    terms: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float,
    low: float,
    high: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip-Cov: ``terms`` (per-token losses) with ``max(1, ⌊ratio·N⌋)`` tokens of covariance in
    ``[low, high]``, drawn with ``generator``, set to 0 (their gradient removed); returns the
    terms and the ``[same shape]`` bool mask of the removed tokens. Fewer tokens in the window
    than the count: all of them are removed."""
    cov = token_covariance(logp, advantages, mask).cpu()  # the selection is drawn on the CPU, where generator lives
    window = torch.nonzero(((cov >= low) & (cov <= high)).reshape(-1)).reshape(-1)
    n = min(_count(ratio, int((mask > 0).sum())), len(window))
    removed = torch.zeros(cov.numel(), dtype=torch.bool)
    if n:
        chosen = window[torch.randperm(len(window), generator=generator)[:n]]
        removed[chosen] = True
    removed = removed.reshape(cov.shape).to(terms.device)
    return torch.where(removed, torch.zeros_like(terms), terms), removed


def kl_cov_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float,
    coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL-Cov: the per-token losses ``−ρ·A`` (``ρ = exp(logp − old_logp)``, no clipping), plus
    ``coef·|logp − old_logp|`` on the ``max(1, ⌊ratio·N⌋)`` tokens of largest covariance; returns
    the terms and the bool mask of the penalised tokens. Ties at the cut are taken by position."""
    cov = token_covariance(logp, advantages, mask).cpu()
    n = _count(ratio, int((mask > 0).sum()))
    chosen = torch.zeros(cov.numel(), dtype=torch.bool)
    if n:
        flat = cov.reshape(-1)
        order = torch.argsort(flat, descending=True, stable=True)[:n]
        chosen[order] = True
    chosen = chosen.reshape(cov.shape).to(logp.device)
    delta = logp - old_logp
    terms = -torch.exp(delta) * advantages
    penalty = coef * delta.abs()
    return torch.where(chosen, terms + penalty, terms), chosen
