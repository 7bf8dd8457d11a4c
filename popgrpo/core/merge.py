"""Weight-space toolbox: merges (soup, weighted/greedy soup, WiSE-FT, task arithmetic) and mutations.

State dicts are ``{name: tensor}`` mappings with the same keys and shapes. Every function
returns new tensors and never modifies its inputs. Random draws come from an explicit
``torch.Generator``; the functions that apply a formula take the draws as arguments, so each
formula is testable on hand-made tensors.

Merges (what the scheduler does with the top-M members; ``scheduler.merge``):

* :func:`soup` — uniform (or weighted) mean, model soups (Wortsman et al. 2022), the main paper §4.3.
* :func:`weighted_soup` — soup with weights from selection scores (:func:`score_weights`).
* :func:`greedy_soup` — add members in score order while a held-out score improves (model soups).
* :func:`wise_ft` — interpolate with an early checkpoint (WiSE-FT for reasoning, §3.2).
* :func:`task_arithmetic` — CycleQD's crossover of task vectors (CycleQD §3.2).

Mutations (what each member adds when it adopts the merged model; ``scheduler.mutate``):

* :func:`perturb` — Gaussian noise σ_p (the main paper §4.3).
* :func:`svd_mutate` — rescale the singular components of the task vector (CycleQD §3.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch

from popgrpo.core.tensor_lists import float_list

__all__ = [
    "GaussianMutation",
    "Mutation",
    "SvdMutation",
    "crossover_weights",
    "greedy_soup",
    "mutate",
    "perturb",
    "score_weights",
    "soup",
    "svd_mutable",
    "svd_mutate",
    "svd_scales",
    "task_arithmetic",
    "task_vector",
    "weighted_soup",
    "wise_ft",
]

StateDict = Mapping[str, torch.Tensor]


# ---- merges ------------------------------------------------------------------------------
def soup(state_dicts: Sequence[StateDict], weights: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """Weighted mean of state dicts (model soup, Wortsman et al. 2022); uniform by default.

    ``θ = Σ_k w_k θ_k / Σ_k w_k``. Weights must be non-negative with a positive sum.
    The main paper's Pop-GRPO merge (§4.3) is the uniform soup of the top M members.
    """
    if not state_dicts:
        raise ValueError("soup needs at least one state dict")
    if weights is None:
        weights = [1.0] * len(state_dicts)
    if len(weights) != len(state_dicts):
        raise ValueError(f"{len(weights)} weights for {len(state_dicts)} state dicts")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"soup weights must be >= 0 with a positive sum, got {list(weights)}")
    w = w / w.sum()
    keys = _same_keys(state_dicts)
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        stacked = torch.stack([sd[key].to(torch.float64) for sd in state_dicts])
        out[key] = _weighted_sum(w, stacked).to(state_dicts[0][key].dtype)
    return out


def score_weights(scores: Sequence[float], temperature: float | None = None) -> list[float]:
    """Merge weights from selection scores ``S_k``; non-negative, summing to one.

    * ``temperature=None``: fitness-proportional, ``w_k = max(S_k, 0) / Σ_j max(S_j, 0)``
      (uniform when no score is positive).
    * ``temperature=T > 0``: softmax, ``w_k = exp(S_k / T) / Σ_j exp(S_j / T)``; any sign of score.

    A NaN score (a member whose metrics broke) gets weight 0; if every score is NaN the
    weights are uniform.
    """
    s = torch.tensor([float(x) for x in scores], dtype=torch.float64)
    if s.numel() == 0:
        raise ValueError("score_weights needs at least one score")
    ok = ~torch.isnan(s)
    if not ok.any():
        return [1.0 / s.numel()] * s.numel()
    if temperature is None:
        w = torch.where(ok, s.clamp_min(0.0), torch.zeros_like(s))
        if w.sum() <= 0:
            w = ok.to(torch.float64)
    else:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        w = torch.softmax(torch.where(ok, s / temperature, torch.full_like(s, -math.inf)), dim=0)
    return float_list(w / w.sum())


def weighted_soup(
    state_dicts: Sequence[StateDict], scores: Sequence[float], temperature: float | None = None
) -> dict[str, torch.Tensor]:
    """Soup with weights from the members' selection scores: ``soup(θ, score_weights(S, T))``.

    ``θ = Σ_k w_k θ_k`` with ``w`` from :func:`score_weights`, so better-scored members
    count more than in the main paper's uniform soup.
    """
    if len(scores) != len(state_dicts):
        raise ValueError(f"{len(scores)} scores for {len(state_dicts)} state dicts")
    return soup(state_dicts, score_weights(scores, temperature))


def greedy_soup(
    state_dicts: Sequence[StateDict], evaluate: Callable[[StateDict], float]
) -> tuple[dict[str, torch.Tensor], list[int], list[float]]:
    """Greedy soup: add members in score order only while a held-out score improves.

    ``state_dicts`` come best first (selection order). The soup starts as the first member;
    candidate ``i`` is the uniform soup of the members kept so far plus member ``i``; it is
    kept if ``evaluate(candidate) > evaluate(current)``, and the search **stops** at the
    first candidate that does not improve. (Wortsman et al. 2022's greedy soup, Recipe 1,
    skips such a candidate and tries the rest; stopping keeps the soup a prefix of the score
    order and costs at most M evaluations.)

    Returns ``(soup, kept, held_out)``: the soup, the indices kept (a prefix ``0..j``), and
    the held-out score of every soup evaluated, in order (``held_out[0]`` is the best member
    alone). ``evaluate`` is called ``len(held_out)`` times.
    """
    if not state_dicts:
        raise ValueError("greedy_soup needs at least one state dict")
    kept = [0]
    current = soup(state_dicts[:1])
    best = float(evaluate(current))
    held_out = [best]
    for i in range(1, len(state_dicts)):
        candidate = soup([state_dicts[j] for j in [*kept, i]])
        score = float(evaluate(candidate))
        held_out.append(score)
        if not score > best:  # NaN never improves
            break
        kept.append(i)
        current, best = candidate, score
    return current, kept, held_out


def wise_ft(early: StateDict, late: StateDict, delta: float) -> dict[str, torch.Tensor]:
    """WiSE-FT interpolation ``δ·θ_early + (1 − δ)·θ_late`` (WiSE-FT for reasoning, §3.2, eq. 2).

    ``delta = 0`` returns the late weights, ``delta = 1`` the early ones. In the scheduler
    ``late`` is the soup of the top M and ``early`` the round-0 weights.
    """
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    if early.keys() != late.keys():
        raise ValueError("early and late state dicts must have the same keys")
    return {k: delta * early[k] + (1.0 - delta) * late[k] for k in late}


def task_vector(theta: StateDict, base: StateDict) -> dict[str, torch.Tensor]:
    """``τ = θ − θ_base`` per tensor (task arithmetic, Ilharco et al. 2022; CycleQD §3.2)."""
    if theta.keys() != base.keys():
        raise ValueError("theta and base state dicts must have the same keys")
    return {k: theta[k] - base[k] for k in theta}


def crossover_weights(n: int, mu: float, sigma: float, generator: torch.Generator) -> list[float]:
    """``n`` i.i.d. draws ``w_i ~ N(μ, σ²)`` for :func:`task_arithmetic` (CycleQD §3.2: μ = 1, σ = 0.03)."""
    if n < 1 or sigma < 0:
        raise ValueError(f"need n >= 1 and sigma >= 0, got n={n}, sigma={sigma}")
    draws = torch.randn(n, generator=generator, dtype=torch.float64)
    return float_list(mu + sigma * draws)


def task_arithmetic(base: StateDict, state_dicts: Sequence[StateDict], w: Sequence[float]) -> dict[str, torch.Tensor]:
    """CycleQD's crossover: ``θ = θ_base + Σ_i (w_i / Σ_j w_j)·τ_i`` with ``τ_i = θ_i − θ_base``.

    CycleQD §3.2 merges two parents, ``θ_base + (w1/(w1+w2))·τ1 + (w2/(w1+w2))·τ2``; this is the
    same formula for any number of parents. The ``w_i`` may be negative
    (:func:`crossover_weights`); ``Σ_j w_j`` must not be 0. Because the mixing weights sum to
    one, the result equals ``Σ_i (w_i/Σ_j w_j)·θ_i`` whatever ``θ_base`` is: the base matters
    only for rounding. Computed in float64, returned in each tensor's dtype; non-floating
    tensors come from ``base``.
    """
    if not state_dicts or len(w) != len(state_dicts):
        raise ValueError(f"{len(w)} weights for {len(state_dicts)} state dicts")
    weights = torch.tensor([float(x) for x in w], dtype=torch.float64)
    total = weights.sum()
    if not torch.isfinite(weights).all() or abs(float(total)) < 1e-8:
        raise ValueError(f"task-arithmetic weights must be finite with a non-zero sum, got {list(w)}")
    mix = weights / total
    keys = _same_keys([base, *state_dicts])
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        b = base[key]
        if not b.is_floating_point():
            out[key] = b.clone()
            continue
        b64 = b.to(torch.float64)
        taus = torch.stack([sd[key].to(torch.float64) - b64 for sd in state_dicts])
        out[key] = (b64 + _weighted_sum(mix, taus)).to(b.dtype)
    return out


# ---- mutations ---------------------------------------------------------------------------
def perturb(state_dict: StateDict, sigma: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``θ + σ·ε`` with ``ε ~ N(0, I)`` drawn from ``generator``, for every floating tensor.

    Pop-GRPO's re-seeding step, where each member adopts the soup (σ_p = 0.01 in the main paper). Integer buffers pass through.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if value.is_floating_point() and sigma > 0:
            noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
            out[key] = value + sigma * noise
        else:
            out[key] = value.clone()
    return out


def svd_mutable(tensor: torch.Tensor) -> bool:
    """Whether :func:`svd_mutate` changes this tensor: a floating matrix with both sides > 1.

    Tensors of more than two dimensions are viewed as ``[shape[0], rest]``. Vectors (biases,
    norms) and ``1 × n`` / ``n × 1`` matrices are rank one and pass through (CycleQD §3.3).
    """
    if not tensor.is_floating_point() or tensor.dim() < 2:
        return False
    return tensor.shape[0] > 1 and tensor[0].numel() > 1


def svd_scales(tau: StateDict, w_max: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Draw ``w ~ U[0, w_max]^r`` for each :func:`svd_mutable` tensor of ``tau`` (``r`` = min side).

    Draws are float64, made in ``tau``'s key order from ``generator``, so the same generator
    state gives the same scales (CycleQD §3.3 and its appendix A.1.3: ``w_max = 0.3``).
    """
    if w_max < 0:
        raise ValueError(f"w_max must be >= 0, got {w_max}")
    out: dict[str, torch.Tensor] = {}
    for key, value in tau.items():
        if svd_mutable(value):
            rank = min(value.shape[0], value[0].numel())
            out[key] = w_max * torch.rand(rank, generator=generator, dtype=torch.float64)
    return out


def svd_mutate(tau: StateDict, scales: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CycleQD's SVD mutation of a task vector: ``τ'_l = U_l diag(w_l ⊙ σ_l) V_lᵀ`` (CycleQD §3.3).

    For every tensor named in ``scales`` (``[r]``, one factor per singular component), the
    matrix ``τ_l = U_l diag(σ_l) V_lᵀ`` (thin SVD, float64) has its ``i``-th component scaled
    by ``w_i``; ``w = 1`` returns ``τ_l`` (up to rounding). Tensors not named in ``scales``
    pass through unchanged — :func:`svd_scales` names every :func:`svd_mutable` one, so
    biases and other rank-one parameters pass through.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in tau.items():
        if key not in scales:
            out[key] = value.clone()
            continue
        if not svd_mutable(value):
            raise ValueError(f"{key}: shape {tuple(value.shape)} has rank one; it cannot be SVD-mutated")
        matrix = value.to(torch.float64).reshape(value.shape[0], -1)
        u, s, vh = _thin_svd(matrix)
        w = torch.as_tensor(scales[key], dtype=torch.float64)
        if w.shape != s.shape:
            raise ValueError(f"{key}: {tuple(w.shape)} scales for {s.numel()} singular values")
        out[key] = ((u * (w * s)) @ vh).reshape(value.shape).to(value.dtype)
    return out


@dataclass(frozen=True)
class GaussianMutation:
    """``scheduler.mutate=gaussian``: each member adds ``σ·ε`` to the merged weights when it adopts
    them (:func:`perturb`; main paper §4.3). Plain data, so it travels to Ray actors."""

    sigma: float = 0.0

    @property
    def needs_base(self) -> bool:
        """False: :meth:`apply` needs no round-0 weights."""
        return False

    def apply(
        self, merged: StateDict, generator: torch.Generator, base: StateDict | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``θ = θ_merged + σ·ε``; the description is empty (the ``WeightMutation`` protocol of
        popgrpo.algorithms.merges)."""
        del base
        return perturb(merged, self.sigma, generator), {}


@dataclass(frozen=True)
class SvdMutation:
    """``scheduler.mutate=svd``: :func:`svd_mutate` of the task vector relative to the member's
    round-0 weights, with ``w ~ U[0, w_max]``; ``mode="scale"`` scales components by ``w``
    (CycleQD §3.3's formula), ``mode="add"`` by ``1 + w`` (CycleQD's released code adds
    ``U diag(w ⊙ σ) Vᵀ``). Plain data, so it travels to Ray actors."""

    w_max: float = 0.3
    mode: Literal["scale", "add"] = "scale"

    @property
    def needs_base(self) -> bool:
        """True: the task vector is taken against the member's round-0 weights."""
        return True

    def apply(
        self, merged: StateDict, generator: torch.Generator, base: StateDict | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``θ = θ_base + svd_mutate(θ_merged − θ_base, w)`` for each matrix, and ``θ_merged`` itself
        for rank-one tensors; ``base`` (θ_base) is required. The description summarises the
        draws ``w``: ``{n, mean, min, max}``."""
        if base is None:
            raise ValueError("the svd mutation needs base weights (the round-0 weights)")
        if self.mode not in _SVD_FACTORS:
            raise ValueError(f"unknown svd mutation mode {self.mode!r}")
        tau = task_vector(merged, base)
        draws = svd_scales(tau, self.w_max, generator)
        factors = {k: _SVD_FACTORS[self.mode](w) for k, w in draws.items()}
        mutated = svd_mutate(tau, factors)
        out: dict[str, torch.Tensor] = {}
        for key, value in merged.items():
            if key in factors:
                out[key] = (base[key].to(torch.float64) + mutated[key].to(torch.float64)).to(value.dtype)
            else:
                out[key] = value.clone()
        all_w = torch.cat(list(draws.values())) if draws else torch.zeros(0, dtype=torch.float64)
        summary: dict[str, float] = {"n": int(all_w.numel())}
        if all_w.numel():
            summary.update(mean=float(all_w.mean()), min=float(all_w.min()), max=float(all_w.max()))
        return out, summary


# SvdMutation.mode: the factor each singular component is scaled by, from its draw w.
_SVD_FACTORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"scale": lambda w: w, "add": lambda w: 1.0 + w}

Mutation = GaussianMutation | SvdMutation  # the built-in mutations (scheduler.mutate)


def mutate(
    merged: StateDict, mutation: Mutation, generator: torch.Generator, base: StateDict | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Apply ``mutation`` to the merged weights (its ``apply``); return the weights and a JSON-able description."""
    return mutation.apply(merged, generator, base)


# Typed wrappers of the torch calls whose stubs leave types unknown.
def _weighted_sum(w: torch.Tensor, stacked: torch.Tensor) -> torch.Tensor:
    """``Σ_k w_k stacked_k``: ``torch.tensordot(w, stacked, dims=1)`` for ``w [K]``, ``stacked [K, ...]``."""
    return cast(torch.Tensor, torch.tensordot(w, stacked, dims=1))  # pyright: ignore[reportUnknownMemberType]  # torch: tensordot's a, b unannotated


def _thin_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``U [m, r], σ [r], Vᵀ [r, n]`` of ``matrix [m, n]``, ``r = min(m, n)``."""
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]  # torch: linalg.svd has no stub
    return cast(torch.Tensor, u), cast(torch.Tensor, s), cast(torch.Tensor, vh)


def _same_keys(state_dicts: Sequence[StateDict]) -> list[str]:
    keys = list(state_dicts[0].keys())
    for sd in state_dicts[1:]:
        if list(sd.keys()) != keys:
            raise ValueError("state dicts to merge must have the same keys")
    return keys
