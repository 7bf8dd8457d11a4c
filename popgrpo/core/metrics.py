"""Metrics the paper reports (§5): pairwise diversity, complexity; pass@k and best@k (WiSE-FT §3.1)."""

from __future__ import annotations

import functools
import math

import torch

__all__ = ["best_at_k", "complexity", "group_pass_best_at_k", "pairwise_diversity", "pass_at_k", "pass_at_k_rows"]


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


def pass_at_k_rows(successes: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`pass_at_k` for every row of a ``[B, n]`` boolean tensor → ``[B]`` (float64).

    Row ``b`` has ``c_b`` successes among ``n`` samples; its value is
    ``1 − C(n − c_b, k) / C(n, k)``, looked up in an exact table over ``c = 0..n``.
    """
    if successes.dim() != 2:
        raise ValueError(f"successes must be [B, n], got shape {tuple(successes.shape)}")
    return _pass_table(successes.shape[1], k)[successes.sum(dim=1).long()]


def best_at_k(values: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased best@k of every row of ``[B, n]`` scores → ``[B]`` (float64).

    The expected maximum of ``k`` samples drawn without replacement from the row's ``n``:
    with the row sorted ascending, ``v_(1) ≤ … ≤ v_(n)``,
    ``best@k = Σ_i C(i − 1, k − 1) / C(n, k) · v_(i)``. This is WiSE-FT §3.1's Best@K with
    a perfect outcome verifier (the score itself picks the best of the ``k``); ``k = 1`` is
    the mean, ``k = n`` the maximum.
    """
    if values.dim() != 2:
        raise ValueError(f"values must be [B, n], got shape {tuple(values.shape)}")
    n = values.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    ordered, _ = values.to(torch.float64).sort(dim=1)
    return ordered @ _best_weights(n, k)


def group_pass_best_at_k(rewards: torch.Tensor, threshold: float, k: int) -> tuple[float, float]:
    """Mean pass@k and best@k over the groups (rows) of ``[B, n]`` rewards.

    An idea succeeds when its reward is ``>= threshold``. Each row is one prompt's ``n``
    samples, the WiSE-FT paper's "problem": its pass@k and best@k are estimated from the
    row alone (:func:`pass_at_k_rows`, :func:`best_at_k`), then averaged over rows. Rows
    with a NaN/inf reward are left out; with none left, both are NaN.
    """
    ok = torch.isfinite(rewards).all(dim=1)
    if not bool(ok.any()):
        return math.nan, math.nan
    good = rewards[ok]
    passed = pass_at_k_rows(good >= threshold, k)
    return float(passed.mean()), float(best_at_k(good, k).mean())


@functools.lru_cache(maxsize=64)
def _pass_table(n: int, k: int) -> torch.Tensor:
    """``[n + 1]``: pass@k for c = 0..n successes (read-only; cached per (n, k))."""
    return torch.tensor([pass_at_k(n, c, k) for c in range(n + 1)], dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def _best_weights(n: int, k: int) -> torch.Tensor:
    """``[n]``: ``C(i − 1, k − 1) / C(n, k)`` for i = 1..n (read-only; cached per (n, k))."""
    total = math.comb(n, k)
    return torch.tensor([math.comb(i - 1, k - 1) / total for i in range(1, n + 1)], dtype=torch.float64)
