"""Metrics the paper reports (§5): pairwise diversity, complexity; pass@k and best@k (WiSE-FT §3.1)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

__all__ = [
    "best_at_k",
    "complexity",
    "group_pass_best_at_k",
    "group_pass_best_at_k_batches",
    "linear_quantiles",
    "pairwise_diversity",
    "pairwise_diversity_batches",
    "pass_at_k",
    "pass_at_k_rows",
]


def pairwise_diversity(ideas: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean cosine distance ``1 − cos(x_i, x_j)`` over distinct pairs ``i < j``.

    ``ideas`` is ``[N, d]``; fewer than two ideas give 0. The range is [0, 2]: 0 for ideas
    pointing one way, about 1 for random directions in high dimension.
    """
    return float(pairwise_diversity_batches(ideas[None], eps)[0])


def pairwise_diversity_batches(ideas: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """:func:`pairwise_diversity` of each of ``S`` batches ``[S, N, d]`` at once → ``[S]``.

    A member computes its epoch's per-step diversities in one call (one step = one batch).
    """
    s, n = ideas.shape[:2]
    if n < 2:
        return torch.zeros(s, dtype=ideas.dtype)
    unit = ideas / _norms(ideas, -1, keepdim=True).clamp_min(eps)
    # Sum of cosines over all ordered pairs = ‖Σ u_i‖² − Σ‖u_i‖²; no N×N matrix needed.
    total = unit.sum(dim=1)  # [S, d]
    self_sim = (unit * unit).sum(dim=(1, 2))
    mean_cos = ((total * total).sum(dim=1) - self_sim) / (n * (n - 1))
    return 1.0 - mean_cos


def linear_quantiles(values: np.ndarray, quantiles: Sequence[float] | np.ndarray) -> list[float]:
    """``np.quantile(values, quantiles).tolist()`` (linear interpolation, as ``torch.quantile``), bit for bit, from one sort.

    For each ``q`` the virtual index is ``h = (n − 1)·q``; the result interpolates the sorted
    values ``x[⌊h⌋]`` and ``x[⌊h⌋ + 1]`` by ``γ = h − ⌊h⌋`` as numpy does (from the lower
    value for γ < 0.5, from the upper one otherwise), so the floats are numpy's. numpy's own
    call partitions per quantile and checks its arguments; on an epoch's thousand values,
    once per epoch, this takes half the time. Empty input and NaN/inf go to ``np.quantile``
    itself (which raises IndexError on empty input).
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    q = np.asarray(quantiles, dtype=np.float64)
    n = x.size
    if n == 0 or not np.isfinite(x).all():
        return np.quantile(x, q).tolist()
    x = np.sort(x)
    h = (n - 1) * q
    lower = np.floor(h).astype(np.intp)
    upper = np.minimum(lower + 1, n - 1)
    top = h >= n - 1  # q = 1 (or n = 1): numpy takes the last value, γ measured from index −1
    lower[top] = n - 1
    gamma = h - np.where(top, -1, lower)
    below, above = x[lower], x[upper]
    diff = above - below
    return np.where(gamma >= 0.5, above - diff * (1 - gamma), below + diff * gamma).tolist()


def complexity(ideas: torch.Tensor) -> float:
    """Mean L2 norm of ``[N, d]`` ideas: the paper's proxy for thinking-trace length."""
    if ideas.shape[0] == 0:
        return 0.0
    return float(_norms(ideas, 1).mean())


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
    passed, best = group_pass_best_at_k_batches(rewards[None], threshold, k)
    return float(passed[0]), float(best[0])


def group_pass_best_at_k_batches(rewards: torch.Tensor, threshold: float, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`group_pass_best_at_k` of each of ``S`` batches ``[S, B, n]`` at once → ``([S], [S])`` (float64).

    A batch whose every row has a NaN/inf reward gives NaN for both.
    """
    if rewards.dim() != 3:
        raise ValueError(f"rewards must be [S, B, n], got shape {tuple(rewards.shape)}")
    s, b, n = rewards.shape
    ok = torch.isfinite(rewards).all(dim=2)  # [S, B]: rows that count
    rows = torch.where(ok[..., None], rewards, torch.zeros((), dtype=rewards.dtype)).reshape(s * b, n)
    passed = pass_at_k_rows(rows >= threshold, k).reshape(s, b)
    best = best_at_k(rows, k).reshape(s, b)
    weight = ok.to(torch.float64)
    counts = weight.sum(dim=1)  # 0 → 0/0 = NaN
    return (passed * weight).sum(dim=1) / counts, (best * weight).sum(dim=1) / counts


@functools.lru_cache(maxsize=64)
def _pass_table(n: int, k: int) -> torch.Tensor:
    """``[n + 1]``: pass@k for c = 0..n successes (read-only; cached per (n, k))."""
    return torch.tensor([pass_at_k(n, c, k) for c in range(n + 1)], dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def _best_weights(n: int, k: int) -> torch.Tensor:
    """``[n]``: ``C(i − 1, k − 1) / C(n, k)`` for i = 1..n (read-only; cached per (n, k))."""
    total = math.comb(n, k)
    return torch.tensor([math.comb(i - 1, k - 1) / total for i in range(1, n + 1)], dtype=torch.float64)


def _norms(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """``x.norm(dim=dim, keepdim=keepdim)``: the L2 norms along ``dim``."""
    return cast(torch.Tensor, x.norm(dim=dim, keepdim=keepdim))  # pyright: ignore[reportUnknownMemberType]  # torch: Tensor.norm's p is unannotated
