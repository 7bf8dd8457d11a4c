"""Exploration shapers of 2025 for group-relative RL: pass@k / max@k advantages, W-REINFORCE,
the unlikeliness reward and outcome-count bonuses.

Shapes: ``P`` groups (prompts) of ``G`` ideas, ``[P, G]`` tensors. Pure torch/numpy, no state
except :class:`OutcomeCounts` (a table of counts).

* :func:`passk_advantages`: the closed-form pass@k advantage of Chen et al. 2025 ("Pass@k
  Training for Adaptively Balancing Exploration and Exploitation", arXiv 2508.10751, §3.3):
  with ``c`` of ``n`` ideas correct, the group's pass@k ``R̄ = 1 − C(n−c, k)/C(n, k)``, its
  standard deviation ``σ = sqrt(R̄(1 − R̄))``, a correct idea's advantage ``(1 − R̄)/σ`` and an
  incorrect one's ``(1 − R̄ − C(n−c−1, k−1)/C(n−1, k−1))/σ``.
* :func:`maxk_advantages`: max@k for continuous rewards by PKPO's subset construction (Walder
  & Karkhanis 2025, arXiv 2505.15201): the unbiased gradient weight of idea ``i`` averages, over
  the k-subsets ``I`` that hold it, ``max_I g``; the baseline ``max_{I∖i} g`` (the subset
  without ``i``) does not depend on ``x_i``, so it keeps the estimator unbiased. In closed form,
  with the group sorted ascending and ``i`` at position ``p`` (0-based),
  ``A_i = Σ_{q<p} C(q, k−2)·(g_p − g_q) / C(n−1, k−1)`` (the weight scaled by ``n/k``).
* :func:`reinforce_advantages` and :func:`weight_positive`: W-REINFORCE (Zhu et al. 2025, "The
  Surprising Effectiveness of Negative Reinforcement in LLM Reasoning", arXiv 2506.01347):
  rewards ±1 with no baseline, and the positive samples' term weighted by λ (0.1 in the paper).
* :func:`unlikeliness_rewards`: the unlikeliness reward (He, Fried, Welleck 2025, "Rewarding
  the Unlikely", arXiv 2506.02355): within a group, ideas ranked by their likelihood under the
  sampling policy (rank 0 the least likely), and a positive reward scaled by
  ``1 − β·rank/G``, so the likeliest correct ideas lose the most.
* :func:`count_bonus` and :class:`OutcomeCounts`: outcome-based exploration (Song, Kempe,
  Munos 2025, arXiv 2509.06941, "historical exploration"): a UCB-style bonus
  ``c·min(1, 1/sqrt(N(o)))`` for an idea whose outcome ``o`` (here: its archive cell) has been
  seen ``N(o)`` times, this batch included.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "OutcomeCounts",
    "count_bonus",
    "maxk_advantages",
    "passk_advantages",
    "reinforce_advantages",
    "unlikeliness_rewards",
    "weight_positive",
]


def _check_groups(returns: torch.Tensor) -> None:
    if returns.dim() != 2:
        raise ValueError(f"returns must be [P, G], got shape {tuple(returns.shape)}")


@functools.lru_cache(maxsize=64)
def _passk_table(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n + 1]`` each, for c = 0..n correct: the group's pass@k ``R̄`` and the incorrect ideas'
    term ``C(n−c−1, k−1)/C(n−1, k−1)`` (exact integer binomials, divided once)."""
    mean = [1.0 - math.comb(n - c, k) / math.comb(n, k) for c in range(n + 1)]
    term = [math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1) if c < n else 0.0 for c in range(n + 1)]
    return torch.tensor(mean, dtype=torch.float64), torch.tensor(term, dtype=torch.float64)


def passk_advantages(returns: torch.Tensor, threshold: float, k: int, eps: float = 1e-6) -> torch.Tensor:
    """Chen et al. 2025's analytic pass@k advantage of ``returns [P, G]`` (module docstring).

    An idea is correct when its return is ``>= threshold``. ``k`` is capped at ``G``. A group
    whose pass@k is 0 or 1 (σ = 0: none correct, or every k-subset holds one) gets zero
    advantages, as GRPO's all-equal groups do. ``k = 1`` is GRPO's normalisation of binary
    rewards with the population standard deviation.
    """
    _check_groups(returns)
    n = returns.shape[1]
    if n < 2:
        return torch.zeros_like(returns)
    k = min(k, n)
    mean_table, term_table = _passk_table(n, k)
    correct = returns >= threshold
    c = correct.sum(dim=1)  # [P]
    mean, term = mean_table[c][:, None], term_table[c][:, None]
    sigma = torch.sqrt(mean * (1.0 - mean))
    positive = (1.0 - mean) / (sigma + eps)
    negative = (1.0 - mean - term) / (sigma + eps)
    advantages = torch.where(correct, positive, negative)
    return advantages.masked_fill(sigma == 0, 0.0).to(returns.dtype)


@functools.lru_cache(maxsize=64)
def _maxk_weights(n: int, k: int) -> torch.Tensor:
    """``[n, n]``: ``W[p, q] = C(q, k−2) / C(n−1, k−1)`` for q < p, else 0 (sorted positions)."""
    scale = math.comb(n - 1, k - 1)
    w = torch.zeros(n, n, dtype=torch.float64)
    for p in range(n):
        for q in range(p):
            w[p, q] = math.comb(q, k - 2) / scale if k >= 2 else 0.0
    return w


def maxk_advantages(returns: torch.Tensor, k: int) -> torch.Tensor:
    """PKPO's max@k advantage of continuous ``returns [P, G]`` with the leave-one-out subset baseline.

    ``A_i = (1 / C(n−1, k−1)) Σ_{|I|=k, I∋i} (max_I g − max_{I∖i} g)``, computed in closed form
    from the sorted group (module docstring); every term is ``>= 0``: an idea earns what it adds
    to the best of the subsets it is in, and the group's lowest idea earns nothing. ``k`` is
    capped at ``G``; at ``k = 1`` the empty subset's max is taken as 0, so ``A_i = g_i``
    (REINFORCE without a baseline). Ties are broken by position; the values do not depend on
    how (tied ideas add the same).
    """
    _check_groups(returns)
    n = returns.shape[1]
    k = min(k, n)
    values = returns.to(torch.float64)
    order = torch.argsort(values, dim=1, stable=True)
    ordered = torch.gather(values, 1, order)  # [P, n] ascending
    below = torch.tensor([math.comb(p, k - 1) / math.comb(n - 1, k - 1) for p in range(n)], dtype=torch.float64)
    sorted_adv = below * ordered - ordered @ _maxk_weights(n, k).T
    advantages = torch.empty_like(values)
    advantages.scatter_(1, order, sorted_adv)
    return advantages.to(returns.dtype)


def reinforce_advantages(returns: torch.Tensor, threshold: float) -> torch.Tensor:
    """W-REINFORCE's rewards as advantages: ``+1`` for a correct idea (return ``>= threshold``), ``−1`` otherwise."""
    _check_groups(returns)
    return torch.where(returns >= threshold, 1.0, -1.0).to(returns.dtype)


def weight_positive(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """Positive advantages times ``weight`` (W-REINFORCE's λ on positive-sample reinforcement); others kept."""
    if weight == 1.0:
        return advantages
    return torch.where(advantages > 0, weight * advantages, advantages)


def unlikeliness_rewards(rewards: torch.Tensor, logp: torch.Tensor, beta: float) -> torch.Tensor:
    """The unlikeliness reward: ``r_i·(1 − β·rank_i/G)`` for ``r_i > 0``, other rewards kept.

    ``rank_i`` is idea ``i``'s rank by ``logp`` (its log-likelihood under the sampling policy;
    for text, the mean over its tokens) within its group, 0 for the least likely (ties by
    position), as in the authors' release. With binary rewards only correct ideas change;
    the likeliest correct one keeps ``1 − β(G−1)/G`` of its reward.
    """
    _check_groups(rewards)
    if logp.shape != rewards.shape:
        raise ValueError(f"logp must be [P, G] like rewards, got {tuple(logp.shape)} and {tuple(rewards.shape)}")
    g = rewards.shape[1]
    rank = torch.argsort(torch.argsort(logp.to(torch.float64), dim=1, stable=True), dim=1).to(rewards.dtype)
    scaled = rewards * (1.0 - beta * rank / g)
    return torch.where(rewards > 0, scaled, rewards)


def count_bonus(counts: ArrayLike, coef: float) -> NDArray[np.float64]:
    """``coef·min(1, 1/sqrt(N))`` for each count ``N`` (an outcome never counted, ``N = 0``, gets ``coef``)."""
    n = np.asarray(counts, dtype=np.float64)
    return coef * np.minimum(1.0, 1.0 / np.sqrt(np.maximum(n, 1.0)))


class OutcomeCounts:
    """How often each of ``n_outcomes`` outcomes has been seen (a table of int64 counts).

    :meth:`add` counts a batch and answers, for each of its items, its outcome's count with
    the whole batch included: a batch's ideas in one outcome all see the same count.
    """

    def __init__(self, n_outcomes: int) -> None:
        if n_outcomes < 1:
            raise ValueError(f"n_outcomes must be >= 1, got {n_outcomes}")
        self.counts: NDArray[np.int64] = np.zeros(int(n_outcomes), dtype=np.int64)

    def add(self, outcomes: ArrayLike) -> NDArray[np.int64]:
        """Count ``outcomes`` (``[N]`` indices in ``[0, n_outcomes)``); return ``[N]`` counts after."""
        index: NDArray[np.int64] = np.ravel(np.asarray(outcomes, dtype=np.int64))
        if index.size and (index.min() < 0 or index.max() >= len(self.counts)):
            raise ValueError(f"outcomes must lie in [0, {len(self.counts)}), got {index.min()}..{index.max()}")
        self.counts += np.bincount(index, minlength=len(self.counts))
        return np.array(self.counts[index], dtype=np.int64)

    @property
    def total(self) -> int:
        """Items counted so far."""
        return int(self.counts.sum())

    def state_dict(self) -> NDArray[np.int64]:
        return np.array(self.counts, dtype=np.int64)

    def load_state_dict(self, counts: ArrayLike) -> None:
        values: NDArray[np.int64] = np.ravel(np.asarray(counts, dtype=np.int64))
        if values.shape != self.counts.shape or (values < 0).any():
            raise ValueError(f"counts must be {len(self.counts)} non-negative integers, got shape {values.shape}")
        self.counts = np.array(values, dtype=np.int64)
