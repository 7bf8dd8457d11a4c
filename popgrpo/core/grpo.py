"""GRPO's math: group-relative advantages, the clipped surrogate and the KL penalty.

Shapes: ``P`` prompts (groups), ``G`` ideas per group. Everything here is pure torch and
differentiable where a loss is returned; nothing holds state.

References: Shao et al. 2024 (DeepSeekMath, GRPO); Schulman et al. 2017 (PPO clipping);
main paper eqs. 3 and 6 for the shaped variants.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "LOSS_NORMALISATIONS",
    "binned_advantages",
    "clipped_surrogate",
    "clipped_terms",
    "group_advantages",
    "kl_penalty",
    "masked_aggregate",
    "token_clipped_surrogate",
]

# How a token-level loss over completions of different lengths becomes one number
# (:func:`masked_aggregate`).
LOSS_NORMALISATIONS = ("token", "sequence", "constant")


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Normalise rewards within each group: ``(r - mean) / (std + eps)``.

    Args:
        rewards: ``[P, G]`` rewards, one row per prompt group.
        eps: added to the standard deviation.

    Returns:
        ``[P, G]`` advantages. ``std`` is Bessel-corrected (torch's default, as in TRL's
        GRPO). A group whose rewards are all equal gets exactly zero advantages, so it
        contributes no gradient. That needs saying outright: in float32 the mean of G equal
        values that are not exactly representable (0.7, say) need not round back to the
        value, and ``(r - mean) / (std + eps)`` with a std of ~1e-8 then turns that rounding
        error into advantages of several hundredths. Every other group's numbers are those
        of the formula, bit for bit.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    advantages = (rewards - mean) / (std + eps)
    low, high = torch.aminmax(rewards, dim=1, keepdim=True)
    return advantages.masked_fill(low == high, 0.0)


def binned_advantages(
    returns: torch.Tensor,
    complexity: torch.Tensor,
    bins: int = 3,
    eps: float = 1e-6,
    within: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Length-conditional normalisation (MaxEnt-GRPO, main paper eq. 6).

    Within each group, ideas are ranked by complexity and split into ``bins`` equal-count
    bins (``torch.tensor_split`` sizes: the first ``G % bins`` bins hold one idea more);
    returns are normalised inside each bin with :func:`group_advantages`. A bin holding a
    single idea gets advantage 0. Ties in complexity are broken by position (stable sort).

    Args:
        returns: ``[P, G]`` shaped returns (reward plus any bonuses).
        complexity: ``[P, G]`` complexity of each idea (e.g. its L2 norm).
        bins: number of complexity bins ``L``; ``bins=1`` is plain :func:`group_advantages`.
        within: the advantages of one bin's ``[P, g]`` returns; None: :func:`group_advantages`
            (another estimator, e.g. pass@k's, is then computed within each bin).

    Returns:
        ``[P, G]`` advantages, in the original idea order.
    """
    if returns.shape != complexity.shape or returns.dim() != 2:
        raise ValueError(
            f"returns and complexity must both be [P, G]; got {tuple(returns.shape)} and {tuple(complexity.shape)}"
        )
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    order = torch.argsort(complexity, dim=1, stable=True)
    sorted_returns = torch.gather(returns, 1, order)

    def estimate(chunk: torch.Tensor) -> torch.Tensor:
        return group_advantages(chunk, eps) if within is None else within(chunk)

    pieces = [estimate(chunk) for chunk in torch.tensor_split(sorted_returns, bins, dim=1)]
    sorted_adv = torch.cat(pieces, dim=1)
    advantages = torch.empty_like(returns)
    advantages.scatter_(1, order, sorted_adv)
    return advantages


def clipped_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip: float = 0.2,
    clip_high: float | None = None,
) -> torch.Tensor:
    """The PPO/GRPO clipped surrogate per idea (or token), as a loss: ``−min(ρ A, clip(ρ, 1 − ε, 1 + ε_high) A)``.

    ``ρ = exp(logp − old_logp)``; ``advantages`` broadcasts against ``logp`` (``[N, 1]`` for
    ``[N, T]`` tokens sharing their completion's advantage). ``clip_high`` is DAPO's decoupled
    upper range ε_high ("clip-higher", Yu et al. 2025, §3.1: a larger ε_high lets unlikely
    tokens with positive advantage grow, which keeps entropy up); None: ε_high = ε. The caller
    reduces the terms: :func:`clipped_surrogate` takes their mean, :func:`token_clipped_surrogate`
    a :func:`masked_aggregate`.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    high = clip if clip_high is None else clip_high
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + high) * advantages
    return -torch.minimum(unclipped, clipped)


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip: float = 0.2
) -> torch.Tensor:
    """PPO/GRPO clipped surrogate, returned as a loss to minimise (mean over ideas).

    ``loss = -mean(min(ρ A, clip(ρ, 1 - clip, 1 + clip) A))`` with ``ρ = exp(logp - old_logp)``.

    Args:
        logp: ``[...]`` log-probabilities under the current policy (carries gradient).
        old_logp: same shape, under the policy that sampled the ideas (no gradient).
        advantages: same shape.
        clip: the clipping range ε.
    """
    return clipped_terms(logp, old_logp, advantages, clip).mean()


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-idea KL estimate to the frozen reference policy, the "k3" estimator.

    ``k3 = exp(ref - logp) - (ref - logp) - 1``, evaluated on ideas sampled from the
    current policy. It is unbiased for KL(π || π_ref), never negative, and is the estimator
    GRPO uses (DeepSeekMath eq. 4; TRL's ``per_token_kl``). The caller multiplies its mean by
    the KL coefficient (0.01 in the main paper, §5).
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def masked_aggregate(values: torch.Tensor, mask: torch.Tensor, normalisation: str = "token") -> torch.Tensor:
    """Reduce per-token ``values [N, T]`` over the tokens where ``mask [N, T]`` is 1 to a scalar.

    * ``token``: ``Σ mask·v / Σ mask``, every token of the batch weighs the same (DAPO, Yu et
      al. 2025; TRL's default ``loss_type="dapo"``). A long completion counts in proportion to
      its length.
    * ``sequence``: ``mean_i (Σ_t mask·v / Σ_t mask)``, each completion weighs the same
      (DeepSeekMath's original GRPO; TRL ``"grpo"``). Its ``1/|o_i|`` makes a token of a short
      completion weigh more: with positive advantages short answers are pushed harder, with
      negative ones long answers are punished less, a length bias (Dr. GRPO, Liu et al. 2025).
    * ``constant``: ``Σ mask·v / (N·T)``, a fixed divisor (Dr. GRPO; TRL ``"dr_grpo"``): no
      length bias, but the scale depends on the generation budget ``T``.

    A completion with no tokens (all-zero mask row) contributes nothing.
    """
    if values.shape != mask.shape or values.dim() != 2:
        raise ValueError(f"values and mask must both be [N, T]; got {tuple(values.shape)} and {tuple(mask.shape)}")
    mask = mask.to(values.dtype)
    if normalisation == "token":
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    if normalisation == "sequence":
        per_sequence = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        return per_sequence.mean()
    if normalisation == "constant":
        return (values * mask).sum() / mask.numel()
    raise ValueError(f"normalisation must be one of {LOSS_NORMALISATIONS}, got {normalisation!r}")


def token_clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    normalisation: str = "token",
) -> torch.Tensor:
    """GRPO's clipped surrogate on tokens (DeepSeekMath eq. 3), a loss to minimise.

    Every token ``t`` of completion ``i`` has its own ratio ``ρ_it = exp(logp − old_logp)`` and
    shares its completion's advantage ``A_i``; the per-token terms
    ``−min(ρ A, clip(ρ, 1 ± ε) A)`` are reduced by :func:`masked_aggregate`.

    Args:
        logp: ``[N, T]`` token log-probabilities now.
        old_logp: ``[N, T]`` token log-probabilities at sampling time.
        advantages: ``[N]`` one per completion.
        mask: ``[N, T]`` 1 on completion tokens, 0 on padding.
    """
    return masked_aggregate(clipped_terms(logp, old_logp, advantages[:, None], clip), mask, normalisation)
