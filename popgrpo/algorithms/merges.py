"""Merge and mutation strategies of Pop-GRPO's round: the built-ins of two registries.

``scheduler.merge`` and ``scheduler.mutate`` name an entry of :data:`~popgrpo.registry.MERGES` /
:data:`~popgrpo.registry.MUTATIONS` (:mod:`popgrpo.registry` registers the functions below
by name, lazily), so a new strategy is one registered function, here or in a plugin. Each
returns what to do *and* a JSON-able description of it for the lineage log. The math is in
:mod:`popgrpo.core.merge`; see docs/MERGING.md for the strategies.

A mutation strategy returns a :class:`WeightMutation`: plain data that travels to the members'
actors, says whether it needs the member's round-0 weights (``needs_base``), and applies itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from popgrpo.columns import json_float
from popgrpo.registry import MERGES, MUTATIONS

if TYPE_CHECKING:
    import torch

__all__ = [
    "MERGES",
    "MUTATIONS",
    "MergeInputs",
    "WeightMutation",
    "gaussian_mutation",
    "greedy_soup_merge",
    "none_mutation",
    "soup_merge",
    "svd_mutation",
    "task_arithmetic_merge",
    "weighted_soup_merge",
    "wise_ft_merge",
]

Weights = Mapping[str, "torch.Tensor"]
Description = dict[str, Any]  # JSON-able, for the lineage log


@dataclass(frozen=True)
class MergeInputs:
    """What a merge strategy may use: the top-M members (best first) and the round's context."""

    selected: list[int]  # member ids, best first
    weights: Sequence[Weights]  # their weights, in that order
    scores: Sequence[float]  # their selection scores
    params: Any  # the scheduler config section (strategy parameters)
    round0: Callable[[], dict[str, torch.Tensor]]  # θ_0 of the selected members, built on demand
    generator: Callable[[], torch.Generator]  # the round's merge stream, created on demand
    evaluate: Callable[[Weights], dict[str, Any]] | None = None  # held-out evaluation of weights (greedy soup)


@runtime_checkable
class WeightMutation(Protocol):
    """What each member adds to the merged weights when it adopts them (``scheduler.mutate``).

    Picklable: the scheduler makes one and every member's actor applies it.
    :class:`popgrpo.core.merge.GaussianMutation` and :class:`~popgrpo.core.merge.SvdMutation` are the built-in ones.
    """

    @property
    def needs_base(self) -> bool:
        """Whether :meth:`apply` needs the member's round-0 weights as ``base``."""
        ...

    def apply(
        self, merged: Weights, generator: torch.Generator, base: Weights | None = None
    ) -> tuple[dict[str, torch.Tensor], Description]:
        """The member's weights and a JSON-able description (empty when there is nothing to say)."""
        ...


MergeFn = Callable[[MergeInputs], tuple[dict[str, "torch.Tensor"], Description]]
MutationFn = Callable[[Any], tuple[WeightMutation | None, Description]]  # None: add nothing


def _uniform(m: int) -> list[float]:
    return [1.0 / m] * m


def soup_merge(x: MergeInputs) -> tuple[dict[str, torch.Tensor], Description]:
    """Uniform mean of the top M (model soup, main paper §4.3)."""
    from popgrpo.core.merge import soup

    return soup(x.weights), {"kind": "soup", "members": x.selected, "weights": _uniform(len(x.selected))}


def weighted_soup_merge(x: MergeInputs) -> tuple[dict[str, torch.Tensor], Description]:
    """Mean weighted by the selection scores (``weighted_soup_temperature``)."""
    from popgrpo.core.merge import score_weights, soup

    temperature = x.params.weighted_soup_temperature
    w = score_weights(x.scores, temperature)
    description: Description = {"kind": "weighted_soup", "members": x.selected, "weights": w}
    description.update(scores=[json_float(s) for s in x.scores], temperature=temperature)
    return soup(x.weights, w), description


def greedy_soup_merge(x: MergeInputs) -> tuple[dict[str, torch.Tensor], Description]:
    """Add members in score order while the held-out ``greedy_soup_metric`` improves (Wortsman et al. 2022)."""
    from popgrpo.core.merge import greedy_soup

    evaluate = x.evaluate
    if evaluate is None:
        raise ValueError("greedy_soup needs a held-out evaluate function")
    metric: str = x.params.greedy_soup_metric
    merged, kept, held_out = greedy_soup(x.weights, lambda sd: float(evaluate(sd)[metric]))
    description: Description = {
        "kind": "greedy_soup",
        "members": [x.selected[i] for i in kept],
        "weights": _uniform(len(kept)),
    }
    description.update(candidates=x.selected, metric=metric, held_out=[json_float(h) for h in held_out])
    return merged, description


def wise_ft_merge(x: MergeInputs) -> tuple[dict[str, torch.Tensor], Description]:
    """δ·θ_0 + (1 − δ)·soup (WiSE-FT for reasoning §3.2)."""
    from popgrpo.core.merge import soup, wise_ft

    delta = x.params.wise_ft_delta
    merged = wise_ft(x.round0(), soup(x.weights), delta)
    description: Description = {"kind": "wise_ft", "members": x.selected, "weights": _uniform(len(x.selected))}
    description.update(delta=delta, early="round0")
    return merged, description


def task_arithmetic_merge(x: MergeInputs) -> tuple[dict[str, torch.Tensor], Description]:
    """θ_0 + Σ_i (w_i/Σ_j w_j)·(θ_i − θ_0), w_i ~ N(μ, σ²) (CycleQD §3.2)."""
    from popgrpo.core.merge import crossover_weights, task_arithmetic

    mu, sigma = x.params.task_arithmetic_mu, x.params.task_arithmetic_sigma
    w = crossover_weights(len(x.selected), mu, sigma, x.generator())
    merged = task_arithmetic(x.round0(), x.weights, w)
    description: Description = {"kind": "task_arithmetic", "members": x.selected, "weights": [v / sum(w) for v in w]}
    description.update(w=w, mu=mu, sigma=sigma, base="round0")
    return merged, description


def gaussian_mutation(params: Any) -> tuple[WeightMutation, Description]:
    """θ + σ_p·ε (main paper §4.3)."""
    from popgrpo.core.merge import GaussianMutation

    return GaussianMutation(sigma=params.perturb_sigma), {"kind": "gaussian", "sigma": params.perturb_sigma}


def svd_mutation(params: Any) -> tuple[WeightMutation, Description]:
    """Scale the singular components of the task vector by w_i ~ U[0, w_max] (CycleQD §3.3)."""
    from popgrpo.core.merge import SvdMutation

    mutation = SvdMutation(w_max=params.svd_w_max, mode=params.svd_mode)
    return mutation, {"kind": "svd", "w_max": params.svd_w_max, "mode": params.svd_mode, "base": "round0"}


def none_mutation(params: Any) -> tuple[None, Description]:
    """Add nothing: a member continues from its base as it is (the "reset without perturbation" arm)."""
    del params
    return None, {"kind": "none"}
