"""The round loop: train T epochs, then carry out the population mechanism's decision, and log it.

At each round's end :class:`PopulationRounds` asks ``scheduler.population``'s step (a pure
function of the members' rows, :mod:`popgrpo.algorithms.population`) what every member does:
continue from the merge of the top M (the main paper's soup), from its own weights, from a
copy of another member or from a frontier snapshot; with which mutation; with or without a
fresh Adam; repelled from which behaviours. It then carries that out: fetches only the
weights the decision names, merges them (:func:`merge_selected`, ``scheduler.merge``; the
result and a JSON-able description, in the spirit of Ray Tune's PBT helpers), hands each
member its adoption through the executor, evaluates the merge (``eval.merged``: a report, made
once the members have their bases) and assembles the lineage record.
The defaults are the main paper's S_k ranking, uniform soup and Gaussian perturbation. See
docs/MERGING.md and docs/MECHANISMS.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial

import torch

from popgrpo.algorithms.evaluation import PURPOSE_GREEDY, PURPOSE_MERGED
from popgrpo.algorithms.merges import MERGES, MergeInputs
from popgrpo.algorithms.population import (
    MERGED,
    OWN,
    POPULATION_STEPS,
    Adoption,
    FrontierEntry,
    PopulationDecision,
    PopulationInputs,
)
from popgrpo.columns import json_float
from popgrpo.config import Config
from popgrpo.core.seeding import STREAM_MERGE, torch_generator
from popgrpo.runtime.executor import Executor

__all__ = [
    "FrontierStore",
    "PopulationRounds",
    "frontier_store",
    "merge_selected",
    "round_lengths",
    "run_rounds",
]

Weights = Mapping[str, torch.Tensor]


def round_lengths(epochs: int, interval: int) -> list[int]:
    """Epochs per round: full rounds of ``interval``, the last one possibly shorter."""
    n_full, rest = divmod(epochs, interval)
    return [interval] * n_full + ([rest] if rest else [])


def merge_selected(
    selected: Sequence[int],
    weights: Sequence[Weights],
    scores: Sequence[float],
    round_index: int,
    config: Config,
    evaluate: Callable[[Weights], dict] | None = None,
    round0: Callable[[], Weights] | None = None,
) -> tuple[dict[str, torch.Tensor], dict]:
    """Merge the top-M members' weights (best first) as ``scheduler.merge`` says.

    Returns the merged weights and the lineage description: ``kind``, the ``members`` merged,
    their ``weights`` in the merge, and the strategy's parameters (``temperature``; greedy soup's
    ``candidates``, ``metric`` and ``held_out`` scores; ``delta``; the crossover draws ``w`` with
    ``mu``, ``sigma``). ``evaluate(weights) → metrics`` is greedy soup's held-out evaluation.
    ``round0()`` gives θ_0 of the selected members (``wise_ft``'s early checkpoint,
    ``task_arithmetic``'s base; :meth:`Executor.round0_weights`), asked only by the merges that
    use it; ``task_arithmetic`` draws its ``w`` from the stream ``(run.seed, STREAM_MERGE, round)``.
    """
    selected = list(selected)
    merge = config.scheduler.merge

    def no_round0() -> Weights:
        raise ValueError(f"scheduler.merge={merge} needs θ_0, and no round0 was given")

    inputs = MergeInputs(
        selected=selected,
        weights=weights,
        scores=scores,
        params=config.scheduler,
        round0=lambda: dict((round0 or no_round0)()),
        generator=lambda: torch_generator(config.run.seed, STREAM_MERGE, round_index),
        evaluate=evaluate,
    )
    return MERGES.get(merge)(inputs)


def run_rounds(
    config: Config,
    executor: Executor,
    on_round: Callable[[int, int, list[list[dict]], dict | None], None],
    start_round: int = 0,
    rounds: PopulationRounds | None = None,
    pending: list[list[dict]] | None = None,
) -> None:
    """Train rounds ``start_round, …``; after each, ``on_round(round, epoch_end, rows_per_member, record)``.

    ``pending``: each member's rows of round ``start_round − 1``, whose end was not carried out
    (the last round of a finished run, which is being extended): it is carried out first and
    reported as ``on_round(start_round − 1, epoch_end, [[], …], record)``.

    The lineage record is ``None`` when the scheduler is off or after the final round
    (nothing is merged once training is over). ``start_round > 0`` continues a resumed run
    whose members already hold the state at the end of round ``start_round − 1``. ``rounds``
    (default: a new one) carries out each round's end; a caller that checkpoints passes its
    own, to save its :meth:`~PopulationRounds.state_dict` (the frontier store) in ``on_round``
    and to hand a resumed run the store it had. Only the
    weights a decision names are fetched (the top M of a soup, copy sources, new frontier
    snapshots); held-out evaluations (greedy soup, the merged model's pass@k) and θ_0 are the
    executor's (:meth:`Executor.evaluate`, :meth:`Executor.round0_weights`).
    """
    lengths = round_lengths(config.run.epochs, config.scheduler.interval_epochs)
    epoch_end = sum(lengths[:start_round])
    rounds = PopulationRounds(config, executor) if rounds is None else rounds
    if pending is not None and config.scheduler.enabled and 0 < start_round < len(lengths):
        executor.train_after_adopt(dict.fromkeys(range(executor.n_actors), lengths[start_round]))
        record = rounds.end_round(start_round - 1, epoch_end, list(range(executor.n_members)), pending)
        on_round(start_round - 1, epoch_end, [[] for _ in pending], record)
    for round_index in range(start_round, len(lengths)):
        n_epochs = lengths[round_index]
        rows = executor.train(n_epochs, round_index)
        epoch_end += n_epochs
        record = None
        is_last = round_index == len(lengths) - 1
        if config.scheduler.enabled and not is_last:
            # Every actor adopts, then trains the next round: sent together, so that no actor
            # waits for the driver in between (the same calls, in the same order, on each actor).
            executor.train_after_adopt(dict.fromkeys(range(executor.n_actors), lengths[round_index + 1]))
            record = rounds.end_round(round_index, epoch_end, list(range(executor.n_members)), rows)
        on_round(round_index, epoch_end, rows, record)


class PopulationRounds:
    """Carries out ``scheduler.population``'s decision at a round's end, and keeps what outlives a round.

    The decision is the pure function the registry names (:mod:`popgrpo.algorithms.population`);
    here are its effects: fetch the weights it names, merge, send each distinct base once to
    the members through the executor, evaluate the merge, and the frontier store's snapshots (driver
    memory, saved with each round's checkpoint through :meth:`state_dict` and given back to a
    resumed run's loop: ``state``, as :func:`frontier_store` checked it). ``end_round`` takes
    the members that reported and their rows, so it serves a round over any subset of the
    population.
    """

    def __init__(self, config: Config, executor: Executor, state: FrontierStore | None = None) -> None:
        self.config = config
        self.executor = executor
        self.step = POPULATION_STEPS.get(config.scheduler.population)
        self.frontier: list[FrontierEntry] = [] if state is None else list(state.entries)
        # frontier entry key → the weights stored with it
        self.snapshots: dict[str, Weights] = {} if state is None else dict(state.snapshots)

    def state_dict(self) -> dict | None:
        """What the round checkpoint keeps of the loop: the frontier store, or None while it is empty.

        ``{"frontier": [{key, member, round, cells, visits}, …] (the store's order),
        "snapshots": {key: {parameter name: tensor}}}``; :func:`frontier_store` reads it back.
        An empty store saves nothing: a resumed run without one starts empty, as this one is.
        """
        if not self.frontier:
            return None
        return {
            "frontier": [asdict(entry) for entry in self.frontier],
            "snapshots": {key: dict(weights) for key, weights in self.snapshots.items()},
        }

    def end_round(self, round_index: int, epoch_end: int, members: list[int], rows: list[list[dict]]) -> dict:
        """Decide, fetch, merge, adopt for ``members`` (with their ``rows``); return the round's lineage record."""
        inputs = PopulationInputs(
            round_index=round_index,
            epoch_end=epoch_end,
            members=members,
            rows=rows,
            config=self.config,
            behaviours=self.executor.behaviours,
            frontier=tuple(self.frontier),
        )
        decision: PopulationDecision = self.step(inputs)
        fetched = self._fetch(decision)
        merged = self._merge(decision, fetched, round_index)
        if decision.frontier is not None:
            self._update_frontier(decision.frontier, fetched, round_index)
        bases = self._bases(decision, fetched, merged.weights)
        scored = None
        if merged.weights is not None and self.config.eval.merged:
            # A report, not an input to any decision: sent before the adoption and its answer
            # taken after it, so that on Ray the evaluator actor scores the merged model while
            # the members adopt. Its own (round, purpose) stream makes the order immaterial to
            # the numbers.
            scored = self.executor.submit_evaluate(merged.weights, round_index, PURPOSE_MERGED)
        infos = self.executor.adopt(bases, decision.adoptions, round_index + 1)
        if scored is not None:
            merged.evaluation = scored()
            merged.eval_samples = self._samples_per_evaluation()
        mutated = [k for k, a in sorted(decision.adoptions.items()) if a.mutation is not None]
        perturb_record = {**decision.mutation, "members": mutated}
        if any(infos[k] for k in mutated):  # what each member drew (svd: its w), when the mutation describes it
            perturb_record["w"] = {str(k): infos[k] for k in mutated}
        record = dict(decision.record)
        if merged.record is not None:
            record["merge"] = merged.record
        record["perturb"] = perturb_record
        record["eval"] = _eval_record(self.config, [member_rows[-1] for member_rows in rows], merged.evaluation)
        record["population"] = {
            "kind": self.config.scheduler.population,
            "members": {str(k): _adoption_record(a) for k, a in sorted(decision.adoptions.items())},
            "extra_samples": decision.extra_samples + merged.extra_samples,
            "eval_samples": merged.eval_samples,
        }
        return record

    def _fetch(self, decision: PopulationDecision) -> dict[int, Weights]:
        """The end-of-round weights the decision needs: the merge set first (best first, one call), then the rest."""
        fetched: dict[int, Weights] = {}
        if decision.merge:
            fetched.update(zip(decision.merge, self.executor.get_weights(decision.merge), strict=True))
        copied = [_copied(a.base) for a in decision.adoptions.values() if a.base.startswith("member:")]
        rest = sorted({k for k in [*decision.fetch, *copied] if k not in fetched})
        if rest:
            fetched.update(zip(rest, self.executor.get_weights(rest), strict=True))
        return fetched

    def _merge(self, decision: PopulationDecision, fetched: Mapping[int, Weights], round_index: int) -> _Merged:
        """The merge of ``decision.merge`` (``scheduler.merge``) and the samples greedy soup's
        evaluations spent (the merged model's own evaluation is sent before the adoption and taken after it)."""
        config = self.config
        if not decision.merge:
            return _Merged()
        evaluate = self.executor.evaluate
        weights = [fetched[k] for k in decision.merge]
        merged, record = merge_selected(
            decision.merge,
            weights,
            decision.merge_scores,
            round_index,
            config,
            evaluate=partial(evaluate, round_index=round_index, purpose=PURPOSE_GREEDY),
            round0=partial(self.executor.round0_weights, decision.merge),
        )
        greedy = len(record.get("held_out", []))  # greedy soup's candidates scored
        return _Merged(merged, record, extra_samples=greedy * self._samples_per_evaluation())

    def _samples_per_evaluation(self) -> int:
        """The held-out ideas one evaluation samples: ``eval.samples`` for each prompt."""
        return self.config.policy.n_prompts * self.config.eval.samples

    def _bases(
        self, decision: PopulationDecision, fetched: Mapping[int, Weights], merged: Weights | None
    ) -> dict[str, Weights]:
        """Each distinct base the adoptions name (not ``own``), by its key."""
        bases: dict[str, Weights] = {}
        for adoption in decision.adoptions.values():
            key = adoption.base
            if key == MERGED and merged is not None:
                bases[key] = merged
            elif key.startswith("member:"):
                bases[key] = fetched[_copied(key)]
            elif key.startswith("elite:") and key.removeprefix("elite:") in self.snapshots:
                bases[key] = self.snapshots[key.removeprefix("elite:")]
            elif key != OWN:
                raise ValueError(
                    f"{self.config.scheduler.population}: an adoption names base {key!r}, which it did not ask for"
                )
        return bases

    def _update_frontier(self, entries: list[FrontierEntry], fetched: Mapping[int, Weights], round_index: int) -> None:
        """Keep the decision's store index; new entries (this round's) take their member's fetched weights."""
        snapshots: dict[str, Weights] = {}
        for entry in entries:
            if entry.key in self.snapshots:
                snapshots[entry.key] = self.snapshots[entry.key]
            elif entry.round == round_index:
                snapshots[entry.key] = fetched[entry.member]
            else:
                raise RuntimeError(f"frontier entry {entry.key} has no stored weights")
        self.frontier, self.snapshots = list(entries), snapshots


@dataclass(frozen=True)
class FrontierStore:
    """The frontier store a resumed run starts from: its index and each entry's weights."""

    entries: tuple[FrontierEntry, ...]
    snapshots: Mapping[str, Weights]


_ENTRY_FIELDS = {"key": str, "member": int, "round": int, "cells": int, "visits": int}


def frontier_store(state: object, config: Config, reference: Weights, round_index: int) -> FrontierStore:
    """Check a checkpoint's frontier store (:meth:`PopulationRounds.state_dict`) before a run resumes from it.

    A checkpoint is untrusted input: the store must be what this run could have written at the
    end of round ``round_index``: at most ``scheduler.frontier_capacity`` entries of exactly
    the five fields, keys ``"<round>.<member>"`` of a member of the population and a round not
    after ``round_index``, no key twice, counts ≥ 0, and one snapshot per entry, no more, whose
    tensors have the names, shapes and dtypes of ``reference`` (a member's weights from the same
    checkpoint) and are finite. Raises ValueError naming the first thing wrong.
    """
    sched = config.scheduler
    if not isinstance(state, dict) or set(state) != {"frontier", "snapshots"}:
        raise ValueError("frontier store: not a {frontier, snapshots} mapping")
    if sched.population != "frontier":
        raise ValueError(f"frontier store: the run's scheduler.population is {sched.population!r}, not 'frontier'")
    raw_entries, raw_snapshots = state["frontier"], state["snapshots"]
    if not isinstance(raw_entries, list) or not isinstance(raw_snapshots, dict):
        raise ValueError("frontier store: 'frontier' must be a list and 'snapshots' a mapping")
    if len(raw_entries) > sched.frontier_capacity:
        raise ValueError(
            f"frontier store: {len(raw_entries)} entries, above frontier_capacity {sched.frontier_capacity}"
        )
    entries: list[FrontierEntry] = []
    for raw in raw_entries:
        if not isinstance(raw, dict) or set(raw) != set(_ENTRY_FIELDS):
            raise ValueError(f"frontier store: an entry is not {{{', '.join(_ENTRY_FIELDS)}}}")
        for name, kind in _ENTRY_FIELDS.items():
            if type(raw[name]) is not kind:  # bool is an int: refused too
                raise ValueError(f"frontier store: entry field {name!r} is not {kind.__name__}")
        entry = FrontierEntry(**raw)
        if not 0 <= entry.member < config.population.size or not 0 <= entry.round <= round_index:
            raise ValueError(f"frontier store: entry {entry.key!r}: no member {entry.member} in round {entry.round}")
        if entry.key != f"{entry.round}.{entry.member}" or entry.cells < 0 or entry.visits < 0:
            raise ValueError(f"frontier store: entry {entry.key!r} is not <round>.<member> with counts ≥ 0")
        entries.append(entry)
    keys = [e.key for e in entries]
    if len(set(keys)) != len(keys) or set(raw_snapshots) != set(keys):
        raise ValueError("frontier store: its snapshots are not one per entry")
    snapshots: dict[str, Weights] = {}
    for key in keys:
        weights = raw_snapshots[key]
        if not isinstance(weights, dict) or set(weights) != set(reference):
            raise ValueError(f"frontier store: snapshot {key!r} does not hold the policy's parameters")
        for name, tensor in weights.items():
            like = reference[name]
            if not isinstance(tensor, torch.Tensor) or tensor.shape != like.shape or tensor.dtype != like.dtype:
                raise ValueError(
                    f"frontier store: snapshot {key!r}: {name} is not a {like.dtype} tensor of {tuple(like.shape)}"
                )
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"frontier store: snapshot {key!r}: {name} is not finite")
        snapshots[key] = weights
    return FrontierStore(tuple(entries), snapshots)


@dataclass
class _Merged:
    """A round's merge: the weights (None: nothing merged), its lineage record, its evaluation and their samples."""

    weights: Weights | None = None
    record: dict | None = None
    evaluation: dict | None = None
    extra_samples: int = 0  # spent to choose the merge (greedy soup's held-out candidates)
    eval_samples: int = 0  # spent to report it (eval.merged)


def _copied(base: str) -> int:
    """The member a ``member:j`` base copies."""
    return int(base.removeprefix("member:"))


def _adoption_record(adoption: Adoption) -> dict:
    """One member's line of the population record."""
    out: dict = {"base": adoption.base, "mutate": adoption.mutation is not None, "reset": adoption.reset_optimizer}
    if adoption.repel is not None:  # how many centres it was given (repulsion_from=self: added to its own)
        out["repel"] = len(adoption.repel)
    return out


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
