"""Merge and mutation strategies of Pop-GRPO's round, registered by name.

``scheduler.merge`` and ``scheduler.mutate`` name an entry of :data:`MERGES` / :data:`MUTATIONS`;
the config's allowed values are these registries' keys, so a new strategy is one registered
function. Each returns what to do *and* a JSON-able description of it for the lineage log.
The math is in :mod:`popgrpo.core.merge`; see docs/MERGING.md for the strategies.

The config takes its allowed names from here, so this module loads without torch: each
strategy imports :mod:`popgrpo.core.merge` when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from popgrpo.schema import json_float

if TYPE_CHECKING:
    import torch

    from popgrpo.core.merge import Mutation

__all__ = ["MERGES", "MUTATIONS", "MergeInputs", "register_merge", "register_mutation"]

Weights = Mapping[str, "torch.Tensor"]


@dataclass(frozen=True)
class MergeInputs:
    """What a merge strategy may use: the top-M members (best first) and the round's context."""

    selected: list[int]  # member ids, best first
    weights: Sequence[Weights]  # their weights, in that order
    scores: Sequence[float]  # their selection scores
    params: Any  # the scheduler config section (strategy parameters)
    round0: Callable[[], dict[str, torch.Tensor]]  # θ_0 of the selected members, built on demand
    generator: Callable[[], torch.Generator]  # the round's merge stream, created on demand
    evaluate: Callable[[Weights], dict] | None = None  # held-out evaluation of weights (greedy soup)


MergeFn = Callable[[MergeInputs], tuple[dict, dict]]
MutationFn = Callable[[Any], tuple["Mutation", dict]]

MERGES: dict[str, MergeFn] = {}
MUTATIONS: dict[str, MutationFn] = {}


def register_merge(name: str) -> Callable[[MergeFn], MergeFn]:
    """Register a merge strategy under ``name`` (a value of ``scheduler.merge``)."""

    def add(fn: MergeFn) -> MergeFn:
        MERGES[name] = fn
        return fn

    return add


def register_mutation(name: str) -> Callable[[MutationFn], MutationFn]:
    """Register a mutation under ``name`` (a value of ``scheduler.mutate``)."""

    def add(fn: MutationFn) -> MutationFn:
        MUTATIONS[name] = fn
        return fn

    return add


def _uniform(m: int) -> list[float]:
    return [1.0 / m] * m


@register_merge("soup")
def _soup(x: MergeInputs):
    """Uniform mean of the top M (model soup, main paper §4.3)."""
    from popgrpo.core.merge import soup

    return soup(x.weights), {"kind": "soup", "members": x.selected, "weights": _uniform(len(x.selected))}


@register_merge("weighted_soup")
def _weighted_soup(x: MergeInputs):
    """Mean weighted by the selection scores (``weighted_soup_temperature``)."""
    from popgrpo.core.merge import score_weights, soup

    temperature = x.params.weighted_soup_temperature
    w = score_weights(x.scores, temperature)
    description = {"kind": "weighted_soup", "members": x.selected, "weights": w}
    description.update(scores=[json_float(s) for s in x.scores], temperature=temperature)
    return soup(x.weights, w), description


@register_merge("greedy_soup")
def _greedy_soup(x: MergeInputs):
    """Add members in score order while the held-out ``greedy_soup_metric`` improves (Wortsman et al. 2022)."""
    from popgrpo.core.merge import greedy_soup

    if x.evaluate is None:
        raise ValueError("greedy_soup needs a held-out evaluate function")
    metric = x.params.greedy_soup_metric
    merged, kept, held_out = greedy_soup(x.weights, lambda sd: x.evaluate(sd)[metric])
    description = {"kind": "greedy_soup", "members": [x.selected[i] for i in kept], "weights": _uniform(len(kept))}
    description.update(candidates=x.selected, metric=metric, held_out=[json_float(h) for h in held_out])
    return merged, description


@register_merge("wise_ft")
def _wise_ft(x: MergeInputs):
    """δ·θ_0 + (1 − δ)·soup (WiSE-FT for reasoning §3.2)."""
    from popgrpo.core.merge import soup, wise_ft

    delta = x.params.wise_ft_delta
    merged = wise_ft(x.round0(), soup(x.weights), delta)
    description = {"kind": "wise_ft", "members": x.selected, "weights": _uniform(len(x.selected))}
    description.update(delta=delta, early="round0")
    return merged, description


@register_merge("task_arithmetic")
def _task_arithmetic(x: MergeInputs):
    """θ_0 + Σ_i (w_i/Σ_j w_j)·(θ_i − θ_0), w_i ~ N(μ, σ²) (CycleQD §3.2)."""
    from popgrpo.core.merge import crossover_weights, task_arithmetic

    mu, sigma = x.params.task_arithmetic_mu, x.params.task_arithmetic_sigma
    w = crossover_weights(len(x.selected), mu, sigma, x.generator())
    merged = task_arithmetic(x.round0(), x.weights, w)
    description = {"kind": "task_arithmetic", "members": x.selected, "weights": [v / sum(w) for v in w]}
    description.update(w=w, mu=mu, sigma=sigma, base="round0")
    return merged, description


@register_mutation("gaussian")
def _gaussian(params):
    """θ + σ_p·ε (main paper §4.3)."""
    from popgrpo.core.merge import Mutation

    return Mutation("gaussian", sigma=params.perturb_sigma), {"kind": "gaussian", "sigma": params.perturb_sigma}


@register_mutation("svd")
def _svd(params):
    """Scale the singular components of the task vector by w_i ~ U[0, w_max] (CycleQD §3.3)."""
    from popgrpo.core.merge import Mutation

    mutation = Mutation("svd", w_max=params.svd_w_max, mode=params.svd_mode)
    return mutation, {"kind": "svd", "w_max": params.svd_w_max, "mode": params.svd_mode, "base": "round0"}
