"""Each population mechanism in a short run: what the members hold after a round is what the lineage says.

With ``perturb_sigma = 0`` a member that copies or returns holds exactly the weights it was
given, so the weights after each round can be checked against the weights before it and the
decision the lineage records. The Ray test runs every mechanism end to end on actors and
checks it gives the in-process run's numbers.
"""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.scheduler import run_rounds
from tests.configs import RAY_PAIRS, SHORT_ROUNDS, pop_grpo

K = 4
ROUNDS = (f"population.size={K}", "run.epochs=6", *SHORT_ROUNDS)
MECHANISMS = ["soup", "soup_svd", "independent", "truncation", "repulsion", "frontier", "islands"]


def _drive(cfg, executor, close=True):
    """Run every round; per decision: (record, every member's weights before adopting, after)."""
    rounds, rows, before = [], [], []
    adopt = executor.adopt

    def adopt_and_watch(bases, adoptions, round_index):
        before.append(executor.get_weights(range(K)))
        return adopt(bases, adoptions, round_index)

    executor.adopt = adopt_and_watch

    def on_round(i, epoch_end, member_rows, record):
        rows.extend(r for per in member_rows for r in per)
        if record is not None:
            rounds.append((record, before[-1], executor.get_weights(range(K))))

    try:
        run_rounds(cfg, executor, on_round)
        final = executor.get_weights(range(K))
    finally:
        executor.adopt = adopt
        if close:
            executor.close()
    return rounds, rows, final


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_independent_without_mutation_or_reset_is_k_independent_runs():
    # best-of-K by config: the population mechanism that changes nothing trains what no scheduler trains
    cfg = pop_grpo(
        *ROUNDS, "scheduler.population=independent", "scheduler.mutate=none", "scheduler.reset_optimizer=false"
    )
    off = pop_grpo(*ROUNDS, "scheduler.enabled=false")
    rounds, rows, final = _drive(cfg, LocalExecutor(cfg))
    _, rows_off, final_off = _drive(off, LocalExecutor(off))
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(rows_off))
    assert all(_equal(a, b) for a, b in zip(final, final_off, strict=True))
    population = rounds[0][0]["population"]
    assert population["kind"] == "independent" and population["extra_samples"] == 0
    assert population["members"]["0"] == {"base": "own", "mutate": False, "reset": False}
    assert "merge" not in rounds[0][0] and rounds[0][0]["perturb"] == {"kind": "none", "members": []}


def test_perturb_and_reset_without_averaging_differs_from_independent_runs():
    cfg = pop_grpo(*ROUNDS, "scheduler.population=independent")
    off = pop_grpo(*ROUNDS, "scheduler.enabled=false")
    rounds, _, final = _drive(cfg, LocalExecutor(cfg))
    _, _, final_off = _drive(off, LocalExecutor(off))
    assert not any(_equal(a, b) for a, b in zip(final, final_off, strict=True))
    for rec, before, after in rounds:
        assert rec["perturb"]["members"] == list(range(K))
        for k in range(K):  # own weights plus a small perturbation: near, not equal
            diff = after[k]["trunk.0.weight"] - before[k]["trunk.0.weight"]
            assert 0.005 < float(diff.std()) < 0.02


def test_truncation_copies_are_exact_and_the_rest_untouched():
    cfg = pop_grpo(
        *ROUNDS, "scheduler.population=truncation", "scheduler.perturb_sigma=0", "scheduler.truncation_fraction=0.5"
    )
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    assert len(rounds) == 2
    for rec, before, after in rounds:
        copies = {int(d): s for d, s in rec["copies"].items()}
        assert len(copies) == 2 and set(copies) == set(rec["ranking"][2:])
        for k in range(K):
            source = copies.get(k, k)
            assert _equal(after[k], before[source])
        assert rec["population"]["members"][str(rec["ranking"][-1])]["reset"] is True
        assert rec["population"]["members"][str(rec["ranking"][0])] == {"base": "own", "mutate": False, "reset": False}


def test_islands_copy_elites_exactly_and_never_average():
    # two islands {0, 1} and {2, 3}; ring migration every round: each island's elite replaces the
    # other island's worst. Every member then holds exactly some member's end-of-round weights.
    cfg = pop_grpo(*ROUNDS, "scheduler.population=islands", "scheduler.perturb_sigma=0")
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    assert len(rounds) == 2
    for rec, before, after in rounds:
        assert "merge" not in rec and rec["islands"].keys() == {"0", "1"}
        copies = {int(d): s for d, s in rec["copies"].items()}
        assert len(copies) == 2 and all((d < 2) != (s < 2) for d, s in copies.items())  # across islands
        for k in range(K):
            assert _equal(after[k], before[copies.get(k, k)])
        assert rec["population"]["members"][str(next(iter(copies)))]["reset"] is True


def test_frontier_returns_to_stored_snapshots():
    cfg = pop_grpo(
        *ROUNDS,
        "scheduler.population=frontier",
        "scheduler.perturb_sigma=0",
        "scheduler.frontier_capacity=2",
        "run.epochs=8",
    )
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    snapshots = {}  # key → the weights of that member at the end of that round
    for rec, before, after in rounds:
        for entry in rec["frontier"]:
            round_index, member = (int(x) for x in entry["key"].split("."))
            if round_index == rec["round"]:
                snapshots[entry["key"]] = before[member]
        assert len(rec["frontier"]) <= 2
        returners = {int(k): key for k, key in rec["returns"].items()}
        assert returners and set(returners) == set(rec["ranking"][-1:])
        for k in range(K):
            expected = snapshots[returners[k]] if k in returners else before[k]
            assert _equal(after[k], expected)
    # a later round can return to an older snapshot (memory, not only a copy of the present)
    assert any(int(key.split(".")[0]) < rec["round"] for rec, *_ in rounds for key in rec["returns"].values())


@pytest.mark.parametrize("source", ["fitter", "self"])
def test_repulsion_centres_in_a_short_run_are_the_records_descriptors(source):
    # After each round, every member holds exactly the centres a hand computation from the
    # lineage gives: fitter, this round's descriptors of the members ranked above it; self,
    # its own descriptors of every round so far, and nobody else's.
    cfg = pop_grpo(*ROUNDS, "scheduler.population=repulsion", f"scheduler.repulsion_from={source}", "run.epochs=8")
    executor = LocalExecutor(cfg)
    held, records = [], []

    def on_round(i, epoch_end, member_rows, record):
        if record is not None:
            records.append(record)
            held.append([None if m.repel is None else m.repel.tolist() for m in executor.members])

    try:
        run_rounds(cfg, executor, on_round)
        final = executor.get_weights(range(K))
    finally:
        executor.close()
    assert len(records) == 3
    history = {k: [] for k in range(K)}
    for record, centres in zip(records, held, strict=True):
        assert record["repulsion_from"] == source
        own = {int(k): [c for c in d if all(_finite(v) for v in c)] for k, d in record["descriptors"].items()}
        assert all(len(own[k]) == cfg.policy.n_prompts for k in range(K))
        for rank, k in enumerate(record["ranking"]):
            if source == "self":
                history[k] += own[k]
                expected = history[k]
            else:
                expected = [c for j in record["ranking"][:rank] for c in own[j]]
            flat = [v for c in centres[k] or [] for v in c]
            assert flat == pytest.approx([v for c in expected for v in c]), (record["round"], k)
    # the members trained differently from one another under either coupling
    assert not _equal(final[0], final[1])


def test_per_member_outcome_counts_are_each_members_own():
    # explore.count_bonus with archive.shared=false: member 0 of two counts, and so trains, exactly
    # as member 0 alone; with a shared archive it counts both members' ideas and trains differently.
    bonus = ("explore.count_bonus=0.5", "scheduler.enabled=false", "run.epochs=4", "grpo.steps_per_epoch=2")
    runs = {}
    for name, extra in {"alone": ("population.size=1",), "private": (), "shared": ("archive.shared=true",)}.items():
        cfg = pop_grpo(*ROUNDS, *bonus, *extra)
        executor = LocalExecutor(cfg)
        rows = []
        try:
            run_rounds(
                cfg,
                executor,
                lambda i, e, member_rows, record, rows=rows: rows.extend(r for m in member_rows for r in m),
            )
            runs[name] = (executor.archives(), pd.DataFrame(rows), executor.get_weights([0])[0])
        finally:
            executor.close()
    (alone,), alone_rows, alone_weights = runs["alone"]
    private, private_rows, private_weights = runs["private"]
    (shared,), _, shared_weights = runs["shared"]
    ideas = private_rows.groupby("member")["ideas"].sum()
    assert len(private) == K and [a.outcomes.total for a in private] == [ideas[k] for k in range(K)]
    assert np.array_equal(private[0].outcomes.counts, alone.outcomes.counts)
    member0 = private_rows[private_rows["member"] == 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(member0, alone_rows.reset_index(drop=True))
    assert _equal(private_weights, alone_weights)
    assert shared.outcomes.total == ideas.sum() and not _equal(shared_weights, alone_weights)


def _finite(v):
    return v is not None and not math.isnan(v)


def test_the_lineage_charges_greedy_soups_held_out_samples():
    cfg = pop_grpo(*ROUNDS, "scheduler.merge=greedy_soup")
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    per_evaluation = cfg.policy.n_prompts * cfg.eval.samples
    for rec, *_ in rounds:
        population = rec["population"]
        assert population["extra_samples"] == len(rec["merge"]["held_out"]) * per_evaluation > 0
        assert population["eval_samples"] == per_evaluation  # the merged model's pass@k, reported only
        assert population["members"]["0"] == {"base": "merged", "mutate": True, "reset": True}


@pytest.mark.heavy
@pytest.mark.ray
def test_every_mechanism_runs_on_ray_as_in_process(ray_local):
    # The mechanism is the driver's decision: one set of actors serves every mechanism in
    # turn, each run starting from the actors' initial state.
    from popgrpo.runtime.ray_executor import RayExecutor

    overrides = [*RAY_PAIRS, "eval.merged=false"]
    executor = RayExecutor(pop_grpo(*ROUNDS, *overrides, "run.epochs=4"))
    members, archives = executor.snapshot()
    try:
        for mechanism, *extra in [*((m,) for m in MECHANISMS), ("repulsion", "scheduler.repulsion_from=self")]:
            cfg = pop_grpo(
                *ROUNDS, *overrides, f"scheduler.population={mechanism}", *extra, "run.epochs=4"
            )  # two rounds: one decision
            local = _drive(cfg, LocalExecutor(cfg))
            executor.load_member_states(members)
            executor.load_archive_states(archives)
            remote = _drive(cfg, executor, close=False)
            assert len(remote[0]) == 1 and [r[0] for r in remote[0]] == [r[0] for r in local[0]], mechanism
            assert remote[0][0][0]["population"]["kind"] == mechanism
            pd.testing.assert_frame_equal(pd.DataFrame(remote[1]), pd.DataFrame(local[1]))
            assert all(_equal(a, b) for a, b in zip(remote[2], local[2], strict=True)), mechanism
    finally:
        executor.close()


def test_pop_with_one_member_is_its_own_soup_plus_perturbation():
    # The ingredient arm "Pop-GRPO with K = 1": no population, only the round's perturbation and reset.
    one = pop_grpo(*ROUNDS, "population.size=1", "scheduler.top_m=1")
    off = pop_grpo(*ROUNDS, "population.size=1", "scheduler.enabled=false")
    records = []
    pop, alone = LocalExecutor(one), LocalExecutor(off)
    run_rounds(one, pop, lambda i, e, rows, record: records.append(record))
    run_rounds(off, alone, lambda *_: None)
    assert [r["merge"]["members"] for r in records if r] == [[0], [0]]
    assert all(r["perturb"]["members"] == [0] for r in records if r)
    assert not _equal(pop.get_weights([0])[0], alone.get_weights([0])[0])


def test_a_round_over_some_members_touches_only_them():
    # What an asynchronous round does: decide and adopt for the members that reported.
    from popgrpo.runtime.scheduler import PopulationRounds

    cfg = pop_grpo(
        *ROUNDS, "scheduler.population=truncation", "scheduler.truncation_fraction=0.5", "scheduler.perturb_sigma=0"
    )
    executor = LocalExecutor(cfg)
    rows = executor.train(2)
    before = executor.get_weights(range(K))
    reported = [0, 2, 3]
    record = PopulationRounds(cfg, executor).end_round(0, 2, reported, [rows[k] for k in reported])
    after = executor.get_weights(range(K))
    assert sorted(record["population"]["members"]) == ["0", "2", "3"] and set(record["scores"]) == {"0", "2", "3"}
    ((copy, source),) = ((int(d), s) for d, s in record["copies"].items())
    assert {copy, source} <= set(reported) and _equal(after[copy], before[source])
    assert _equal(after[1], before[1])  # did not report: untouched
