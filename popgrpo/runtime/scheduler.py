"""The round loop: train T epochs, then (Pop-GRPO) select → merge → mutate, and log it.

Each decision at the end of a round is a helper that returns what to do *and* a JSON-able
description of it, in the spirit of Ray Tune's PBT helpers: :func:`plan_round` (which members,
under which objective), :func:`merge_selected` (the merged model), :func:`mutation_for` (what
each member adds when it adopts the merged model). :func:`run_rounds` carries them out through an executor
and assembles the lineage record. The strategies are chosen by config only
(``scheduler.merge``, ``scheduler.mutate`` and ``scheduler.objectives`` name entries of the
registries in :mod:`popgrpo.registry`); the defaults are the main paper's
S_k ranking, uniform soup and Gaussian perturbation. See docs/MERGING.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from popgrpo.algorithms.evaluation import PURPOSE_GREEDY, PURPOSE_MERGED, WeightsEvaluator
from popgrpo.algorithms.initial_weights import round0_weights
from popgrpo.algorithms.merges import MERGES, MUTATIONS, MergeInputs, WeightMutation
from popgrpo.config import Config
from popgrpo.core.seeding import STREAM_MERGE, torch_generator
from popgrpo.core.selection import cyclic_objective, objective_scores, select_top_m
from popgrpo.runtime.executor import Executor
from popgrpo.schema import json_float

__all__ = [
    "LazyEvaluator",
    "MergeDecision",
    "RoundPlan",
    "decide_merge",
    "describe_adoption",
    "merge_selected",
    "mutation_for",
    "plan_round",
    "round_lengths",
    "run_rounds",
]

Weights = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class RoundPlan:
    selected: list[int]  # member ids, best first
    record: dict
    scores: list[float]  # the selected members' objective scores, best first


def round_lengths(epochs: int, interval: int) -> list[int]:
    """Epochs per round: full rounds of ``interval``, the last one possibly shorter."""
    n_full, rest = divmod(epochs, interval)
    return [interval] * n_full + ([rest] if rest else [])


def plan_round(round_index: int, epoch_end: int, last_rows: list[dict], config: Config) -> RoundPlan:
    """Score members on their last epoch of the round under this round's objective; choose the top M.

    The objective is ``scheduler.objectives[round mod len]`` (CycleQD §3.1's rotation). The
    default, ``pop_score``, is ``S_k = d_k · (1 + max R_k)`` with ``d_k`` the member's diversity
    and ``max R_k`` its max reward in that epoch (main paper §4.3). With several objectives the
    record also carries every member's values of the others as ``behaviour``.
    """
    sched = config.scheduler
    objective = cyclic_objective(round_index, sched.objectives)
    scores = objective_scores(last_rows, objective)
    selected = select_top_m(scores, min(sched.top_m, len(scores)))  # an async merge may see fewer than M
    record = {
        "round": round_index,
        "epoch_end": epoch_end,
        "objective": objective,
        "scores": {str(r["member"]): json_float(s) for r, s in zip(last_rows, scores, strict=True)},
        "selected": selected,
    }
    others = [o for o in sched.objectives if o != objective]
    if others:
        values = {o: objective_scores(last_rows, o) for o in others}
        record["behaviour"] = {
            str(r["member"]): {o: json_float(values[o][i]) for o in others} for i, r in enumerate(last_rows)
        }
    return RoundPlan(selected, record, [scores[k] for k in selected])


def merge_selected(
    selected: Sequence[int],
    weights: Sequence[Weights],
    scores: Sequence[float],
    round_index: int,
    config: Config,
    evaluate: Callable[[Weights], dict] | None = None,
) -> tuple[dict[str, torch.Tensor], dict]:
    """Merge the top-M members' weights (best first) as ``scheduler.merge`` says.

    Returns the merged weights and the lineage description: ``kind``, the ``members`` merged,
    their ``weights`` in the merge, and the strategy's parameters (``temperature``; greedy soup's
    ``candidates``, ``metric`` and ``held_out`` scores; ``delta``; the crossover draws ``w`` with
    ``mu``, ``sigma``). ``evaluate(weights) → metrics`` is greedy soup's held-out evaluation.
    θ_0 (``wise_ft``'s early checkpoint, ``task_arithmetic``'s base) is the round-0 weights
    (:func:`~popgrpo.algorithms.initial_weights.round0_weights`); ``task_arithmetic`` draws its ``w``
    from the stream ``(run.seed, STREAM_MERGE, round)``.
    """
    selected = list(selected)
    inputs = MergeInputs(
        selected=selected,
        weights=weights,
        scores=scores,
        params=config.scheduler,
        round0=lambda: round0_weights(config, selected),
        generator=lambda: torch_generator(config.run.seed, STREAM_MERGE, round_index),
        evaluate=evaluate,
    )
    return MERGES.get(config.scheduler.merge)(inputs)


def mutation_for(config: Config) -> tuple[WeightMutation, dict]:
    """The mutation every member applies when it adopts the merged model, and its lineage description."""
    return MUTATIONS.get(config.scheduler.mutate)(config.scheduler)


@dataclass(frozen=True)
class MergeDecision:
    merged: dict[str, torch.Tensor]
    mutation: WeightMutation
    record: dict  # the lineage record: plan, merge, perturb (without the members) and eval


class LazyEvaluator:
    """The held-out evaluator, built on first use (greedy soup, ``eval.merged``), else never."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._evaluator: WeightsEvaluator | None = None

    def get(self) -> WeightsEvaluator | None:
        if self._evaluator is None and (self.config.scheduler.merge == "greedy_soup" or self.config.eval.merged):
            self._evaluator = WeightsEvaluator(self.config)
        return self._evaluator


def decide_merge(
    config: Config,
    round_index: int,
    epoch_end: int,
    last_rows: list[dict],
    fetch: Callable[[list[int]], list[dict[str, torch.Tensor]]],
    evaluators: LazyEvaluator,
) -> MergeDecision:
    """Select from ``last_rows`` (one per member, by member id), merge, and choose the mutation.

    ``fetch(member_ids)`` returns those members' weights. The record's ``selected`` names
    member ids, also when ``last_rows`` holds only some members (asynchronous rounds).
    """
    plan = plan_round(round_index, epoch_end, last_rows, config)
    ids = [int(r["member"]) for r in last_rows]
    selected = [ids[i] for i in plan.selected]
    weights = fetch(selected)
    evaluator = evaluators.get()
    held_out = None if evaluator is None else partial(evaluator, round_index=round_index, purpose=PURPOSE_GREEDY)
    merged, merge_record = merge_selected(selected, weights, plan.scores, round_index, config, held_out)
    merged_eval = (
        evaluator(merged, round_index, PURPOSE_MERGED) if evaluator is not None and config.eval.merged else None
    )
    mutation, perturb_record = mutation_for(config)
    record = {
        **plan.record,
        "selected": selected,
        "merge": merge_record,
        "perturb": perturb_record,
        "eval": _eval_record(config, last_rows, merged_eval),
    }
    return MergeDecision(merged, mutation, record)


def describe_adoption(record: dict, members: Sequence[int], infos: Sequence[dict]) -> None:
    """Complete the record's ``perturb`` with the members that adopted and what each drew."""
    record["perturb"]["members"] = list(members)
    if any(infos):  # what each member drew (svd: its w), when the mutation describes it
        record["perturb"]["w"] = {str(k): info for k, info in zip(members, infos, strict=True)}


def run_rounds(
    config: Config,
    executor: Executor,
    on_round: Callable[[int, int, list[list[dict]], dict | None], None],
    start_round: int = 0,
) -> None:
    """Train rounds ``start_round, …``; after each, ``on_round(round, epoch_end, rows_per_member, record)``.

    The lineage record is ``None`` when the scheduler is off or after the final round
    (nothing is merged once training is over). ``start_round > 0`` continues a resumed run
    whose members already hold the state at the end of round ``start_round − 1``. Only the
    top-M weights are fetched; held-out evaluations (greedy soup, the merged model's pass@k)
    run in this process on them.
    """
    lengths = round_lengths(config.run.epochs, config.scheduler.interval_epochs)
    epoch_end = sum(lengths[:start_round])
    evaluators = LazyEvaluator(config)
    for round_index in range(start_round, len(lengths)):
        n_epochs = lengths[round_index]
        rows = executor.train(n_epochs, round_index)
        epoch_end += n_epochs
        record = None
        is_last = round_index == len(lengths) - 1
        if config.scheduler.enabled and not is_last:
            last_rows = [member_rows[-1] for member_rows in rows]
            decision = decide_merge(config, round_index, epoch_end, last_rows, executor.get_weights, evaluators)
            infos = executor.adopt(decision.merged, decision.mutation, round_index + 1)
            describe_adoption(decision.record, range(len(last_rows)), infos or [{}] * len(last_rows))
            record = decision.record
        on_round(round_index, epoch_end, rows, record)


def _eval_record(config: Config, last_rows: list[dict], merged: dict | None) -> dict:
    """pass@k / best@k of the round: each member's last epoch (training groups) and the merged model."""
    record = {
        "k": config.eval.k,
        "threshold": config.eval.success_threshold,
        "members": {
            str(r["member"]): {key: json_float(r[key]) for key in ("pass_at_k", "best_at_k")} for r in last_rows
        },
    }
    if merged is not None:
        record["merged"] = {key: json_float(v) if isinstance(v, float) else v for key, v in merged.items()}
    return record
