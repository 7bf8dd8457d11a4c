"""Population mechanisms as pure decisions: each one's effect on hand-made member rows.

Every decision is checked for what it does to whom (a test fails if the mechanism does
nothing): which members keep their weights, which copy or return to whom, which are
mutated, reset or repelled, and what the driver must fetch.
"""

import math

import pytest

from popgrpo.algorithms.population import (
    MERGED,
    OWN,
    POPULATION_STEPS,
    FrontierEntry,
    PopulationInputs,
    copy_base,
    elite_base,
    replaced_count,
)
from popgrpo.config import ConfigError, load_config
from popgrpo.core.merge import GaussianMutation, SvdMutation
from popgrpo.core.selection import pop_scores, select_top_m
from tests.configs import defaults

K = 6
SELECTING = (f"population.size={K}", "scheduler.enabled=true", "scheduler.objectives=[reward_max]")
QUALITY = [0.3, 0.9, 0.1, 0.7, 0.5, 0.2]  # reward_max per member: ranking 1, 3, 4, 0, 5, 2


def _inputs(cfg, round_index=0, new=(3, 0, 5, 1, 0, 2), members=None, behaviours=None, frontier=()):
    members = list(range(K)) if members is None else members
    rows = [
        [
            {"member": k, "reward_max": QUALITY[k], "diversity": 1.0 + k / 10, "archive_new": new[k] - new[k] // 2},
            {"member": k, "reward_max": QUALITY[k], "diversity": 1.0 + k / 10, "archive_new": new[k] // 2},
        ]
        for k in members
    ]
    return PopulationInputs(round_index, 2 * (round_index + 1), members, rows, cfg, behaviours, tuple(frontier))


RANKING = [1, 3, 4, 0, 5, 2]


def test_soup_is_the_main_papers_round():
    cfg = load_config(None, [f"population.size={K}", "scheduler.enabled=true"])
    inputs = _inputs(cfg)
    decision = POPULATION_STEPS.get("soup")(inputs)
    scores = pop_scores(inputs.last_rows)
    assert decision.merge == select_top_m(scores, 3) and decision.merge_scores == [scores[k] for k in decision.merge]
    assert decision.record["selected"] == decision.merge and decision.record["objective"] == "pop_score"
    assert set(decision.adoptions) == set(range(K))
    for a in decision.adoptions.values():
        assert (a.base, a.mutation, a.reset_optimizer, a.repel) == (
            MERGED,
            GaussianMutation(sigma=0.01),
            True,
            None,
        )
    assert (
        decision.mutation == {"kind": "gaussian", "sigma": 0.01} and decision.fetch == [] and decision.frontier is None
    )


def test_soup_svd_names_the_add_svd_mutation_whatever_merge_and_mutate_say():
    cfg = defaults(*SELECTING, "scheduler.merge=wise_ft", "scheduler.mutate=gaussian", "scheduler.svd_mode=scale")
    decision = POPULATION_STEPS.get("soup_svd")(_inputs(cfg))
    assert decision.merge == RANKING[:3]
    assert all(
        a.base == MERGED and a.mutation == SvdMutation(w_max=0.3, mode="add") for a in decision.adoptions.values()
    )
    assert decision.mutation["kind"] == "svd" and decision.mutation["mode"] == "add"


@pytest.mark.parametrize(("mutate", "reset"), [("gaussian", True), ("none", True), ("none", False)])
def test_independent_keeps_every_members_own_weights(mutate, reset):
    cfg = defaults(*SELECTING, f"scheduler.mutate={mutate}", f"scheduler.reset_optimizer={str(reset).lower()}")
    decision = POPULATION_STEPS.get("independent")(_inputs(cfg))
    expected_mutation = GaussianMutation(sigma=0.01) if mutate == "gaussian" else None
    for a in decision.adoptions.values():
        assert (a.base, a.mutation, a.reset_optimizer) == (OWN, expected_mutation, reset)
    assert decision.merge == [] and decision.fetch == [] and decision.record["ranking"] == RANKING
    no_op = decision.adoptions[0]
    assert no_op.changes_weights == (mutate == "gaussian")


def test_replaced_count():
    assert [replaced_count(k, 0.25) for k in (1, 2, 3, 4, 8, 9, 100)] == [0, 1, 1, 1, 2, 2, 25]
    assert replaced_count(5, 0.5) == 2 and replaced_count(6, 0.5) == 3


def test_truncation_copies_top_into_bottom_and_leaves_the_rest():
    cfg = defaults(*SELECTING, "scheduler.truncation_fraction=0.34")  # n = 2 of 6
    decision = POPULATION_STEPS.get("truncation")(_inputs(cfg))
    top, bottom = RANKING[:2], RANKING[-2:]
    copies = decision.record["copies"]
    assert sorted(int(k) for k in copies) == sorted(bottom) and set(copies.values()) <= set(top)
    for k, a in decision.adoptions.items():
        if k in bottom:
            assert a.base == copy_base(copies[str(k)]) and a.mutation == GaussianMutation(sigma=0.01)
            assert a.reset_optimizer
        else:
            assert (a.base, a.mutation, a.reset_optimizer) == (OWN, None, False)  # untouched
    assert decision.fetch == sorted(set(copies.values()))
    again = POPULATION_STEPS.get("truncation")(_inputs(cfg))
    assert again.record["copies"] == copies  # seeded by (run.seed, round)
    # over rounds the sources are drawn from the whole top fraction, not always the best
    drawn = {
        s for r in range(12) for s in POPULATION_STEPS.get("truncation")(_inputs(cfg, r)).record["copies"].values()
    }
    assert drawn == set(top)


def test_truncation_on_a_subset_of_members_decides_for_those_only():
    cfg = defaults(*SELECTING, "scheduler.truncation_fraction=0.5")
    decision = POPULATION_STEPS.get("truncation")(_inputs(cfg, members=[0, 2, 3, 5]))
    assert set(decision.adoptions) == {0, 2, 3, 5}
    assert decision.record["ranking"] == [3, 0, 5, 2]
    assert {int(k) for k in decision.record["copies"]} == {5, 2}
    assert set(decision.record["copies"].values()) <= {3, 0}


def test_repulsion_pushes_each_member_from_the_fitter_members_behaviours():
    cfg = defaults(*SELECTING, "scheduler.mutate=none")
    asked = []

    def behaviours(ids):
        asked.append(list(ids))
        # two groups per member; member 4's second group broke (NaN): left out
        return {k: [[k / 10, 0.5], [math.nan, 0.5] if k == 4 else [k / 10, 0.9]] for k in ids}

    decision = POPULATION_STEPS.get("repulsion")(_inputs(cfg, behaviours=behaviours))
    assert asked == [RANKING]
    for rank, k in enumerate(RANKING):
        a = decision.adoptions[k]
        assert (a.base, a.mutation) == (OWN, None)
        expected = [(j / 10, y) for j in RANKING[:rank] for y in ((0.5,) if j == 4 else (0.5, 0.9))]
        assert list(a.repel or ()) == expected
    assert decision.adoptions[RANKING[0]].repel == ()  # the best avoids nobody
    assert decision.record["strength"] == 0.5 and decision.record["bandwidth"] == 0.1
    with pytest.raises(ValueError, match="behaviours"):
        POPULATION_STEPS.get("repulsion")(_inputs(cfg))


def test_repulsion_from_self_repels_each_member_from_its_own_behaviours_only():
    cfg = defaults(*SELECTING, "scheduler.mutate=none", "scheduler.repulsion_from=self")

    def behaviours(ids):
        return {k: [[k / 10, 0.5], [math.nan, 0.5] if k == 4 else [k / 10, 0.9]] for k in ids}

    decision = POPULATION_STEPS.get("repulsion")(_inputs(cfg, behaviours=behaviours))
    for k in range(K):  # the best (member 1) is no longer special: everyone avoids itself, nobody else
        a = decision.adoptions[k]
        assert (a.base, a.mutation, a.repel_keep) == (OWN, None, True)
        assert list(a.repel or ()) == [(k / 10, y) for y in ((0.5,) if k == 4 else (0.5, 0.9))]
    assert decision.record["repulsion_from"] == "self" and decision.record["ranking"] == RANKING
    fitter = POPULATION_STEPS.get("repulsion")(_inputs(defaults(*SELECTING), behaviours=behaviours))
    assert fitter.record["repulsion_from"] == "fitter"
    assert not any(a.repel_keep for a in fitter.adoptions.values())  # fitter replaces the centres each round
    with pytest.raises(ConfigError, match="repulsion_from"):
        defaults(*SELECTING, "scheduler.repulsion_from=others")


@pytest.mark.parametrize(
    ("overrides", "mutated", "reset", "repelled"),
    [
        (("scheduler.population=independent", "scheduler.mutate=none"), False, True, False),  # Adam reset alone
        (("scheduler.population=independent", "scheduler.reset_optimizer=false"), True, False, False),  # perturbation
        (
            ("scheduler.population=repulsion", "scheduler.mutate=none", "scheduler.reset_optimizer=false"),
            False,
            False,
            True,
        ),
    ],
    ids=["reset alone", "perturbation alone", "penalty alone"],
)
def test_each_ingredient_arm_is_one_config(overrides, mutated, reset, repelled):
    # docs/MECHANISMS.md's ingredients table: each arm changes exactly one thing at a round's end
    cfg = defaults(*SELECTING, *overrides)
    decision = POPULATION_STEPS.get(cfg.scheduler.population)(
        _inputs(cfg, behaviours=lambda ids: {k: [[k / 10, 0.5]] for k in ids})
    )
    for k, a in decision.adoptions.items():
        assert a.base == OWN and a.reset_optimizer == reset
        assert (a.mutation == GaussianMutation(sigma=0.01)) if mutated else a.mutation is None
        assert bool(a.repel) == (repelled and k != RANKING[0]), k


def test_frontier_stores_discoverers_and_returns_the_worst_to_them():
    cfg = defaults(*SELECTING, "scheduler.frontier_capacity=3", "scheduler.truncation_fraction=0.34")
    # round 0: cells opened 3, 0, 5, 1, 0, 2 → candidates 0, 2, 3, 5; the store keeps 2, 0, 5
    first = POPULATION_STEPS.get("frontier")(_inputs(cfg))
    store = first.frontier
    assert store is not None and [e.member for e in store] == [2, 0, 5] and len(store) == 3
    assert first.fetch == [0, 2, 5]  # new snapshots: their weights are fetched
    returners = RANKING[-2:]
    picks = first.record["returns"]
    assert sorted(int(k) for k in picks) == sorted(returners)
    # weight cells/sqrt(1 + visits), visits counted at once: 5/1 → 5/1.41 = 3.5 still beats 3/1
    assert list(picks.values()) == ["0.2", "0.2"]
    for k, a in first.adoptions.items():
        if k in returners:
            assert a.base == elite_base(picks[str(k)]) and a.mutation is not None and a.reset_optimizer
        else:
            assert (a.base, a.mutation, a.reset_optimizer) == (OWN, None, False)
    visits = {e.key: e.visits for e in store}
    assert visits == {"0.2": 2, "0.0": 0, "0.5": 0}
    # round 1: nobody opens a cell; the store persists, and the unvisited 0.0 (3/1) now beats 0.2 (5/1.73)
    second = POPULATION_STEPS.get("frontier")(_inputs(cfg, round_index=1, new=(0,) * K, frontier=store))
    assert second.fetch == [] and {e.key for e in second.frontier or []} == {"0.2", "0.0", "0.5"}
    assert [second.record["returns"][str(k)] for k in RANKING[-2:]] == ["0.0", "0.2"]


def test_frontier_weight_is_discoveries_over_root_visits():
    assert FrontierEntry("a", 0, 0, cells=8, visits=3).weight == pytest.approx(4.0)


def test_vectorised_members_refuse_a_partial_adam_reset():
    with pytest.raises(ConfigError, match="reset_optimizer"):
        defaults(*SELECTING, "scheduler.population=truncation", "population.vectorize=true")
    defaults(
        *SELECTING, "scheduler.population=truncation", "population.vectorize=true", "scheduler.reset_optimizer=false"
    )
    defaults(*SELECTING, "scheduler.population=repulsion", "population.vectorize=true")


def test_a_plugin_step_is_a_registered_function():
    from popgrpo.algorithms.population import Adoption, PopulationDecision

    def everyone_copies_the_best(inputs):
        best = max(inputs.members, key=lambda k: inputs.rows[inputs.members.index(k)][-1]["reward_max"])
        adoptions = {k: Adoption(copy_base(best), None, False) for k in inputs.members}
        return PopulationDecision(adoptions=adoptions, record={"best": best}, mutation={"kind": "none"}, fetch=[best])

    POPULATION_STEPS.register("test_copy_best", everyone_copies_the_best)
    try:
        cfg = defaults(*SELECTING, "scheduler.population=test_copy_best")
        decision = POPULATION_STEPS.get(cfg.scheduler.population)(_inputs(cfg))
        assert decision.fetch == [1] and {a.base for a in decision.adoptions.values()} == {"member:1"}
    finally:
        POPULATION_STEPS._entries.pop("test_copy_best")
        POPULATION_STEPS._resolved.pop("test_copy_best", None)


def test_top_m_binds_only_the_mechanisms_that_merge():
    base = ["population.size=2", "scheduler.enabled=true"]  # top_m defaults to 3
    with pytest.raises(ConfigError, match="top_m"):
        load_config(None, [*base, "scheduler.population=soup_svd"])
    for mechanism in ("independent", "truncation", "repulsion", "frontier"):
        assert load_config(None, [*base, f"scheduler.population={mechanism}"]).scheduler.top_m == 3


ISLANDS = (*SELECTING, "scheduler.population=islands", "scheduler.islands=3")  # islands {0,1} {2,3} {4,5}


def test_islands_ring_migration_copies_each_elite_over_the_next_islands_worst():
    decision = POPULATION_STEPS.get("islands")(_inputs(defaults(*ISLANDS)))
    # elites 1, 3, 4 (reward_max 0.9, 0.7, 0.5); worst 0, 2, 5: 1 → island 1's 2, 3 → 5, 4 → 0
    assert decision.record["islands"] == {"0": [1, 0], "1": [3, 2], "2": [4, 5]}
    assert decision.record["copies"] == {"0": 4, "2": 1, "5": 3} and decision.fetch == [1, 3, 4]
    assert decision.merge == []  # islands never average weights
    for k, adoption in decision.adoptions.items():
        if str(k) in decision.record["copies"]:
            assert adoption.base == copy_base(decision.record["copies"][str(k)]) and adoption.reset_optimizer
            assert adoption.mutation == GaussianMutation(sigma=0.01)
        else:
            assert (adoption.base, adoption.mutation, adoption.reset_optimizer) == (OWN, None, False)


def test_islands_reset_restarts_the_worse_half_from_a_better_islands_elite():
    decision = POPULATION_STEPS.get("islands")(_inputs(defaults(*ISLANDS, "scheduler.migration=reset")))
    copies = decision.record["copies"]
    assert set(copies) == {"4", "5"} and len(set(copies.values())) == 1 and copies["4"] in (1, 3)
    assert all(decision.adoptions[k].base == OWN for k in range(4)) and decision.merge == []


def test_islands_migrate_only_every_interval_rounds():
    cfg = defaults(*ISLANDS, "scheduler.migration_interval=2")
    quiet = POPULATION_STEPS.get("islands")(_inputs(cfg, round_index=0))
    assert quiet.record["migrate"] is False and quiet.record["copies"] == {} and quiet.fetch == []
    assert all(a.base == OWN and a.mutation is None for a in quiet.adoptions.values())
    assert POPULATION_STEPS.get("islands")(_inputs(cfg, round_index=1)).record["copies"]


def test_more_islands_than_members_is_refused():
    with pytest.raises(ConfigError, match=r"scheduler.islands \(7\) must be <= population.size \(6\)"):
        load_config(None, [*ISLANDS[:-1], "scheduler.islands=7"])
