"""Metrics the paper reports (§5): pairwise diversity, complexity; pass@k (WiSE-FT §3.1)."""

from __future__ import annotations

import math

import torch

__all__ = ["complexity", "pairwise_diversity", "pass_at_k"]


def pairwise_diversity(ideas: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean cosine distance ``1 − cos(x_i, x_j)`` over distinct pairs ``i < j``.

    ``ideas`` is ``[N, d]``; fewer than two ideas give 0. The range is [0, 2]: 0 for ideas
    pointing one way, about 1 for random directions in high dimension.
    """
    n = ideas.shape[0]
    if n < 2:
        return 0.0
    unit = ideas / ideas.norm(dim=1, keepdim=True).clamp_min(eps)
    # Sum of cosines over all ordered pairs = ‖Σ u_i‖² − Σ‖u_i‖²; no N×N matrix needed.
    total = unit.sum(dim=0)
    self_sim = (unit * unit).sum()
    mean_cos = (total.dot(total) - self_sim) / (n * (n - 1))
    return float(1.0 - mean_cos)


def complexity(ideas: torch.Tensor) -> float:
    """Mean L2 norm of ``[N, d]`` ideas: the paper's proxy for thinking-trace length."""
    if ideas.shape[0] == 0:
        return 0.0
    return float(ideas.norm(dim=1).mean())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: ``1 − C(n − c, k) / C(n, k)`` for ``c`` successes out of ``n`` samples.

    Chen et al. 2021 (Codex), also the WiSE-FT-for-reasoning paper §3.1. Exact integer
    binomials, so no overflow or cancellation for large ``n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
