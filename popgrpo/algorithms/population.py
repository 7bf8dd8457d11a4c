"""Population mechanisms: what the scheduler does with the members at a round's end, as pure decisions.

``scheduler.population`` names an entry of :data:`~popgrpo.registry.POPULATION_STEPS`; each is a
function ``(PopulationInputs) → PopulationDecision`` that reads the members' metrics rows of
the round (and, on demand, their behaviour descriptors or the frontier store's index) and says,
for each member that reported, where it continues from (:class:`Adoption`): its own weights,
the merge of a set of members, a copy of another member, or a stored frontier snapshot; which
mutation it adds; whether its Adam state is reset; which behaviours it is repelled from. The
decision touches no weights and no actors: the round loop (:mod:`popgrpo.runtime.scheduler`)
fetches what it names, builds each distinct base once and hands the adoptions to the
executor. So a decision can be made on any subset of the members (``inputs.members``: the
members that reported, as an asynchronous round has them), replayed from its inputs, and
tested without Ray.

Built-ins (docs/MECHANISMS.md has the design, the costs and when to pick which):

* ``soup`` (default): the main paper's round (§4.3): rank by the round's objective, merge the
  top M (``scheduler.merge``), every member continues from the merge with its own mutation.
* ``soup_svd``: the soup with CycleQD's SVD mutation in its released-code form (``add``),
  named as one choice (docs/MERGING.md's ablation).
* ``independent``: no averaging: every member keeps its own weights, adds its mutation and
  (``scheduler.reset_optimizer``) resets Adam; the ingredient arms "perturb + reset" and
  "reset only" (``scheduler.mutate=none``).
* ``truncation``: PBT's exploit/explore (Jaderberg et al. 2017) and truncation selection as
  in successive halving: the bottom fraction copies a top-fraction member and mutates it.
* ``repulsion``: every member keeps its weights and is pushed away from the behaviours of
  the members ranked above it (NEA2/RS-CMSA taboo regions, DvD, SVGD's repulsive term); with
  ``scheduler.repulsion_from=self`` from its own past behaviours only (no coupling).
* ``frontier``: Go-Explore (Ecoffet et al. 2021): the bottom fraction returns to stored
  snapshots of members that opened new archive cells, chosen by a count-based weight.
* ``islands``: FunSearch's island model (Romera-Paredes et al. 2024; EvoTune, arXiv
  2504.05108): islands of members that never average weights; every few rounds an island's
  elite migrates (its weights copied over a worst member of the next island), or the worse
  half of the islands restart from the better half's elites.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from popgrpo.algorithms.merges import WeightMutation
from popgrpo.columns import json_float
from popgrpo.core.seeding import STREAM_POPULATION, derive_seed
from popgrpo.core.selection import cyclic_objective, objective_scores, select_top_m
from popgrpo.registry import MUTATIONS, POPULATION_STEPS

if TYPE_CHECKING:
    from popgrpo.config import Config

__all__ = [
    "MERGED",
    "OWN",
    "POPULATION_STEPS",
    "Adoption",
    "FrontierEntry",
    "PopulationDecision",
    "PopulationInputs",
    "copy_base",
    "elite_base",
    "frontier_step",
    "independent_step",
    "island_of",
    "islands_step",
    "ranking",
    "replaced_count",
    "repulsion_step",
    "soup_step",
    "soup_svd_step",
    "truncation_step",
]

OWN = "own"  # the member's own weights (nothing is sent)
MERGED = "merged"  # the merge of PopulationDecision.merge
Description = dict[str, Any]  # JSON-able, for the lineage log


def copy_base(member: int) -> str:
    """The base key of a copy of member ``member``'s end-of-round weights."""
    return f"member:{member}"


def elite_base(key: str) -> str:
    """The base key of the frontier snapshot ``key``."""
    return f"elite:{key}"


@dataclass(frozen=True)
class Adoption:
    """What one member does at a round's end (plain data: it travels to the member's actor).

    ``base``: :data:`OWN`, :data:`MERGED`, :func:`copy_base` or :func:`elite_base`.
    ``mutation``: added to the base from the member's (member, round) stream; None adds nothing.
    ``reset_optimizer``: Adam's moments start afresh. ``repel``: behaviour descriptors ``[M][B]``
    whose neighbourhood lowers the member's returns until its next adoption (None: none).
    ``repel_keep``: the member adds ``repel`` to the centres it already holds instead of
    replacing them (``scheduler.repulsion_from=self``: its own history, which only the member keeps).
    """

    base: str
    mutation: WeightMutation | None
    reset_optimizer: bool
    repel: tuple[tuple[float, ...], ...] | None = None
    repel_keep: bool = False

    @property
    def changes_weights(self) -> bool:
        return self.base != OWN or self.mutation is not None


@dataclass(frozen=True)
class FrontierEntry:
    """One stored snapshot of the frontier (its weights are kept by the round loop, by ``key``).

    ``cells``: archive cells the member opened in the round that ended with these weights;
    ``visits``: how often members have returned to it.
    """

    key: str
    member: int
    round: int
    cells: int
    visits: int = 0

    @property
    def weight(self) -> float:
        """Go-Explore's count-based selection weight: discoveries / sqrt(1 + visits)."""
        return self.cells / math.sqrt(1.0 + self.visits)


@dataclass(frozen=True)
class PopulationInputs:
    """What a population step may read. ``rows[i]`` are member ``members[i]``'s rows of the round.

    ``behaviours(ids)`` fetches each member's ``[P][B]`` behaviour descriptors of its last
    epoch: where each of its groups found its best idea (one call to the executor; only
    mechanisms that need them ask). ``frontier`` is the frontier
    store's index as the last round left it.
    """

    round_index: int
    epoch_end: int
    members: Sequence[int]
    rows: Sequence[Sequence[Mapping[str, Any]]]
    config: Config
    behaviours: Callable[[Sequence[int]], Mapping[int, Sequence[Sequence[float]]]] | None = None
    frontier: Sequence[FrontierEntry] = ()

    @property
    def last_rows(self) -> list[Mapping[str, Any]]:
        return [member_rows[-1] for member_rows in self.rows]


@dataclass(frozen=True)
class PopulationDecision:
    """A round's decision: each reporting member's :class:`Adoption`, and what the driver must fetch.

    ``merge``: the members to merge (best first) with ``merge_scores``, when some adoption's
    base is :data:`MERGED`. ``fetch``: other members whose end-of-round weights are needed
    (copy sources, new frontier snapshots). ``frontier``: the store's index after this round
    (its new entries' weights are the fetched ones); None leaves the store as it is.
    ``record``: the lineage description (the round loop adds the merge, the mutation draws
    and the evaluation). ``extra_samples``: ideas sampled to make the decision beyond the
    members' training (0 for every built-in: they read the training rows).
    """

    adoptions: dict[int, Adoption]
    record: Description
    mutation: Description  # the mutation's lineage description
    merge: list[int] = field(default_factory=list[int])
    merge_scores: list[float] = field(default_factory=list[float])
    fetch: list[int] = field(default_factory=list[int])
    frontier: list[FrontierEntry] | None = None
    extra_samples: int = 0


# ---- helpers -------------------------------------------------------------------------------
def ranking(inputs: PopulationInputs) -> tuple[str, list[float], list[int], Description]:
    """The round's objective, each reporting member's score, the members best first, and the record.

    The objective is ``scheduler.objectives[round mod len]`` (CycleQD's rotation); scores come
    from each member's last row of the round; ties and NaNs as :func:`select_top_m`. The record
    is the main paper's (``round``, ``epoch_end``, ``objective``, ``scores``; ``behaviour``:
    the other objectives' values when there are several).
    """
    sched = inputs.config.scheduler
    last_rows = inputs.last_rows
    objective = cyclic_objective(inputs.round_index, sched.objectives)
    scores = objective_scores(last_rows, objective)
    order = [inputs.members[i] for i in select_top_m(scores, len(scores))]
    record: Description = {
        "round": inputs.round_index,
        "epoch_end": inputs.epoch_end,
        "objective": objective,
        "scores": {str(r["member"]): json_float(s) for r, s in zip(last_rows, scores, strict=True)},
    }
    others = [o for o in sched.objectives if o != objective]
    if others:
        values = {o: objective_scores(last_rows, o) for o in others}
        record["behaviour"] = {
            str(r["member"]): {o: json_float(values[o][i]) for o in others} for i, r in enumerate(last_rows)
        }
    return objective, scores, order, record


def replaced_count(n_members: int, fraction: float) -> int:
    """Members replaced by truncation / frontier return: ``max(1, ⌊fraction·K⌋)``, at most ``⌊K/2⌋`` (0 for K = 1)."""
    if n_members < 2:
        return 0
    return min(n_members // 2, max(1, math.floor(fraction * n_members)))


def _mutation(config: Config) -> tuple[WeightMutation | None, Description]:
    return MUTATIONS.get(config.scheduler.mutate)(config.scheduler)


def _generator(config: Config, round_index: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(config.run.seed, STREAM_POPULATION, round_index))


# ---- the built-in steps ----------------------------------------------------------------------
def soup_step(inputs: PopulationInputs) -> PopulationDecision:
    """The main paper's round (§4.3): merge the top M (``scheduler.merge``), everyone adopts it.

    Every reporting member continues from the merged model with its own ``scheduler.mutate``
    mutation and (``scheduler.reset_optimizer``, on by default) a fresh Adam.
    """
    config = inputs.config
    _, scores, order, record = ranking(inputs)
    index = {k: i for i, k in enumerate(inputs.members)}
    selected = order[: config.scheduler.top_m]
    record["selected"] = selected
    mutation, description = _mutation(config)
    adoption = Adoption(MERGED, mutation, config.scheduler.reset_optimizer)
    return PopulationDecision(
        adoptions=dict.fromkeys(inputs.members, adoption),
        record=record,
        mutation=description,
        merge=selected,
        merge_scores=[scores[index[k]] for k in selected],
    )


def soup_svd_step(inputs: PopulationInputs) -> PopulationDecision:
    """The uniform soup of the top M plus CycleQD's SVD mutation in its ``add`` form, as one choice.

    τ' = τ + U diag(w ⊙ σ) Vᵀ, w ~ U[0, ``svd_w_max``] (CycleQD §3.3, released code) on the
    soup's task vector from the round-0 weights. It ignores ``scheduler.merge``,
    ``scheduler.mutate`` and ``scheduler.svd_mode``: this is the combination docs/MERGING.md's
    ablation found above best-of-K post hoc (1.169 ± 0.051 vs 1.078 ± 0.036), to be confirmed.
    """
    sched = inputs.config.scheduler.model_copy(update={"merge": "soup", "mutate": "svd", "svd_mode": "add"})
    config = inputs.config.model_copy(update={"scheduler": sched})
    return soup_step(replace(inputs, config=config))


def independent_step(inputs: PopulationInputs) -> PopulationDecision:
    """No averaging: every member keeps its own weights, adds its mutation, and resets Adam if told.

    The ingredient arms of a population without its population: ``scheduler.mutate=gaussian``
    is "perturb + reset without averaging", ``scheduler.mutate=none`` "reset without
    perturbation", and ``mutate=none`` with ``reset_optimizer=false`` changes nothing (K
    independent runs: best-of-K, as ``scheduler.enabled=false`` trains them).
    """
    config = inputs.config
    _, _, order, record = ranking(inputs)
    record["ranking"] = order
    mutation, description = _mutation(config)
    adoption = Adoption(OWN, mutation, config.scheduler.reset_optimizer)
    return PopulationDecision(adoptions=dict.fromkeys(inputs.members, adoption), record=record, mutation=description)


def truncation_step(inputs: PopulationInputs) -> PopulationDecision:
    """PBT's exploit/explore by truncation: the bottom fraction copies the top fraction and mutates.

    Members are ranked by the round's objective (``scheduler.objectives``, any selection
    statistic). The ``n = replaced_count(K, scheduler.truncation_fraction)`` worst each copy
    the end-of-round weights of one of the ``n`` best, drawn uniformly from the stream
    ``(run.seed, STREAM_POPULATION, round)`` (PBT's "truncation selection" exploit, Jaderberg
    et al. 2017, §3.1; successive halving keeps the top fraction in the same way), add their
    mutation (PBT's explore; here on the weights) and reset Adam when
    ``scheduler.reset_optimizer``. The others keep their weights and their Adam state.
    """
    config = inputs.config
    sched = config.scheduler
    _, _, order, record = ranking(inputs)
    n = replaced_count(len(order), sched.truncation_fraction)
    top, bottom = order[:n], order[len(order) - n :]
    draws = _generator(config, inputs.round_index).integers(0, n, size=n) if n else np.zeros(0, dtype=np.int64)
    sources = {dst: top[int(i)] for dst, i in zip(bottom, draws, strict=True)}
    mutation, description = _mutation(config)
    keep = Adoption(OWN, None, False)
    adoptions = {
        k: Adoption(copy_base(sources[k]), mutation, sched.reset_optimizer) if k in sources else keep
        for k in inputs.members
    }
    record.update(ranking=order, fraction=sched.truncation_fraction, copies={str(d): s for d, s in sources.items()})
    return PopulationDecision(
        adoptions=adoptions, record=record, mutation=description, fetch=sorted(set(sources.values()))
    )


def repulsion_step(inputs: PopulationInputs) -> PopulationDecision:
    """Every member keeps its weights and is repelled from where fitter members (or it itself) earned their returns.

    A member's behaviour is where its last epoch's groups found their best ideas (one
    descriptor per prompt, ``inputs.behaviours``; NaN descriptors are left out). Until its next
    adoption a member's returns are lowered by ``scheduler.repulsion_strength`` times a
    Gaussian kernel (bandwidth ``scheduler.repulsion_bandwidth``) of each idea's behaviour's
    distance to the nearest centre (:func:`popgrpo.core.repulsion.repulsion_penalty`). Whose
    behaviours are the centres is ``scheduler.repulsion_from``:

    * ``fitter`` (the population coupling): the member ranked r-th by the round's objective
      gets the descriptors of ranks 0 … r−1 of this round; the best member is repelled from
      nothing. The taboo regions of NEA2 (Preuss 2012) and RS-CMSA (Ahrari et al. 2017), as a
      smooth kernel term in the spirit of SVGD's repulsion (Liu & Wang 2016) and DvD
      (Parker-Holder et al. 2020).
    * ``self`` (uncoupled): every member gets its own descriptors of this round, added to the
      centres it already holds (``Adoption.repel_keep``), so it is repelled from where it found
      its best ideas at the end of every round so far. The whole history is kept, not a
      window: a taboo region marks a basin already explored, and a window would let a member
      drift back into one it left; the penalty is the nearest centre's, so more centres widen
      the taboo region but never deepen it beyond s. No member's descriptors reach another,
      and the ranking only goes to the record: K independent runs, each repelled from its own past.

    Mutation and Adam reset as ``independent``.
    """
    config = inputs.config
    sched = config.scheduler
    if inputs.behaviours is None:
        raise ValueError("the repulsion step needs the members' behaviours (PopulationInputs.behaviours)")
    _, _, order, record = ranking(inputs)
    descriptors = inputs.behaviours(order)
    mutation, description = _mutation(config)
    keep = sched.repulsion_from == "self"

    def usable(members: Sequence[int]) -> tuple[tuple[float, ...], ...]:
        centres = (tuple(float(v) for v in c) for j in members for c in descriptors[j])
        return tuple(c for c in centres if not any(math.isnan(v) for v in c))

    adoptions = {
        k: Adoption(OWN, mutation, sched.reset_optimizer, usable([k] if keep else order[:rank]), repel_keep=keep)
        for rank, k in enumerate(order)
    }
    record.update(
        ranking=order,
        descriptors={str(k): [[json_float(float(v)) for v in c] for c in descriptors[k]] for k in order},
        strength=sched.repulsion_strength,
        bandwidth=sched.repulsion_bandwidth,
        repulsion_from=sched.repulsion_from,
    )
    return PopulationDecision(adoptions=adoptions, record=record, mutation=description)


def frontier_step(inputs: PopulationInputs) -> PopulationDecision:
    """Go-Explore's return to the frontier: the bottom fraction restarts from stored discoverers.

    The archive stores ideas, not the weights that produced them, so the round loop keeps a
    small store of policy snapshots: after each round, every member that opened new archive
    cells (``archive_new`` summed over the round's epochs) is a candidate, stored with that
    count; the store keeps the ``scheduler.frontier_capacity`` snapshots of highest
    Go-Explore weight ``cells / sqrt(1 + visits)`` (Ecoffet et al. 2021, count-based cell
    selection; ties keep the newer). Then the ``replaced_count(K, truncation_fraction)``
    members ranked lowest by the round's objective each return to the snapshot of highest
    weight (its visits counted at once, so two members rarely pick the same one), add their
    mutation (explore from there) and reset Adam when ``scheduler.reset_optimizer``. The
    others keep their weights. The cost: each stored snapshot is one copy of a member's
    weights in the driver, and each new one one weight fetch.
    """
    config = inputs.config
    sched = config.scheduler
    _, _, order, record = ranking(inputs)
    candidates = [
        FrontierEntry(f"{inputs.round_index}.{k}", k, inputs.round_index, int(sum(r["archive_new"] for r in rows)))
        for k, rows in zip(inputs.members, inputs.rows, strict=True)
    ]
    pool = [*inputs.frontier, *[c for c in candidates if c.cells > 0]]
    # The newest first among equal weights: sorted is stable and the pool lists old before new.
    kept = sorted(reversed(pool), key=lambda e: -e.weight)[: sched.frontier_capacity]
    n = replaced_count(len(order), sched.truncation_fraction)
    mutation, description = _mutation(config)
    keep = Adoption(OWN, None, False)
    adoptions = dict.fromkeys(inputs.members, keep)
    returns: dict[str, str] = {}
    entries = {e.key: e for e in kept}
    for k in order[len(order) - n :] if kept else []:
        best = max(entries.values(), key=lambda e: (e.weight, e.round, -e.member))
        entries[best.key] = replace(best, visits=best.visits + 1)
        adoptions[k] = Adoption(elite_base(best.key), mutation, sched.reset_optimizer)
        returns[str(k)] = best.key
    new_keys = {c.key for c in candidates}
    stored = [entries[e.key] for e in kept]
    record.update(
        ranking=order,
        fraction=sched.truncation_fraction,
        returns=returns,
        frontier=[{"key": e.key, "cells": e.cells, "visits": e.visits} for e in stored],
    )
    return PopulationDecision(
        adoptions=adoptions,
        record=record,
        mutation=description,
        fetch=sorted(e.member for e in stored if e.key in new_keys),
        frontier=stored,
    )


def island_of(member: int, n_members: int, n_islands: int) -> int:
    """The island of member ``member`` of ``n_members`` split into ``n_islands`` contiguous blocks: ``⌊k·I/K⌋``."""
    return member * n_islands // n_members


def islands_step(inputs: PopulationInputs) -> PopulationDecision:
    """Islands that never average weights, with elite migration (FunSearch; EvoTune).

    Member k lives on island :func:`island_of` (``scheduler.islands`` contiguous blocks of the
    population). Between migrations every member keeps its weights and its Adam state. Every
    ``scheduler.migration_interval``-th round (``(round + 1) % interval == 0``) a migration
    copies weights, never averages them; the copies add their ``scheduler.mutate`` mutation
    and reset Adam when ``scheduler.reset_optimizer``:

    * ``ring``: island i's elite (its best reporting member by the round's objective) replaces
      the worst reporting member of the next island, i+1 mod I (among the islands that
      reported), with a copy of its end-of-round weights;
    * ``reset``: FunSearch's reset: the islands are ranked by their elite, and every member of
      the worse ⌊I/2⌋ islands copies the elite of one of the better islands, drawn uniformly
      from the stream ``(run.seed, STREAM_POPULATION, round)``.
    """
    config = inputs.config
    sched = config.scheduler
    _, _, order, record = ranking(inputs)
    size = config.population.size
    n_islands = min(sched.islands, size)
    groups: dict[int, list[int]] = {}  # island → its reporting members, best first
    for k in order:
        groups.setdefault(island_of(k, size, n_islands), []).append(k)
    migrate = (inputs.round_index + 1) % sched.migration_interval == 0
    sources: dict[int, int] = {}  # member → the elite whose weights it copies
    if migrate and len(groups) > 1:
        islands = sorted(groups)
        if sched.migration == "ring":
            for position, island in enumerate(islands):
                target = islands[(position + 1) % len(islands)]
                sources[groups[target][-1]] = groups[island][0]
        else:
            by_elite = sorted(islands, key=lambda i: order.index(groups[i][0]))
            n_reset = len(by_elite) // 2
            better, worse = by_elite[: len(by_elite) - n_reset], by_elite[len(by_elite) - n_reset :]
            draws = _generator(config, inputs.round_index).integers(0, len(better), size=len(worse))
            for island, draw in zip(worse, draws, strict=True):
                for k in groups[island]:
                    sources[k] = groups[better[int(draw)]][0]
    mutation, description = _mutation(config)
    keep = Adoption(OWN, None, False)
    adoptions = {
        k: Adoption(copy_base(sources[k]), mutation, sched.reset_optimizer) if k in sources else keep
        for k in inputs.members
    }
    record.update(
        ranking=order,
        islands={str(i): groups[i] for i in sorted(groups)},
        migrate=migrate,
        migration=sched.migration,
        copies={str(d): s for d, s in sorted(sources.items())},
    )
    return PopulationDecision(
        adoptions=adoptions, record=record, mutation=description, fetch=sorted(set(sources.values()))
    )
