"""Short populations with each merge, mutation and selection rotation: the lineage says what was applied.

With ``perturb_sigma = 0`` every member re-seeds to exactly the merged model, so the weights
the members hold after a round can be checked against the merge formula applied to the
weights the scheduler fetched, with the parameters the lineage record reports.
"""

import itertools
import time

import pandas as pd
import pytest
import torch

from popgrpo.algorithms.evaluation import PURPOSE_MERGED, WeightsEvaluator
from popgrpo.algorithms.initial_weights import initial_weights, round0_weights
from popgrpo.core.merge import SvdMutation, mutate, score_weights, soup, task_arithmetic, wise_ft
from popgrpo.core.seeding import STREAM_PERTURB, torch_generator
from popgrpo.core.selection import objective_scores, select_top_m
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.scheduler import run_rounds
from tests.configs import RAY_PAIRS, SHORT_ROUNDS, pop_grpo

K = 4
ROUNDS = (f"population.size={K}", "run.epochs=6", *SHORT_ROUNDS, "scheduler.perturb_sigma=0")

STRATEGIES = {
    "soup": [],
    "weighted_soup": ["scheduler.merge=weighted_soup"],
    "greedy_soup": ["scheduler.merge=greedy_soup"],
    "wise_ft": ["scheduler.merge=wise_ft", "scheduler.wise_ft_delta=0.25"],
    "task_arithmetic": ["scheduler.merge=task_arithmetic", "scheduler.task_arithmetic_sigma=0.3"],
}


def _drive(cfg, executor):
    """Run every round; per merging round: (record, fetched top-M weights, every member's weights after)."""
    fetched, rounds, rows = [], [], []
    get_weights = executor.get_weights
    executor.get_weights = lambda ids: fetched.append(get_weights(ids)) or fetched[-1]

    def on_round(i, epoch_end, member_rows, record):
        rows.extend(r for per in member_rows for r in per)
        if record is not None:
            rounds.append((record, fetched[-1], get_weights(range(K)), [per[-1] for per in member_rows]))

    try:
        run_rounds(cfg, executor, on_round)
        final = get_weights(range(K))
    finally:
        executor.close()
    return rounds, rows, final


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_each_merge_strategy_is_applied_as_recorded(strategy):
    cfg = pop_grpo(*ROUNDS, *STRATEGIES[strategy])
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    assert [rec["round"] for rec, *_ in rounds] == [0, 1]  # 3 rounds; the last merges nothing
    evaluator = WeightsEvaluator(cfg)
    for rec, fetched, after, _ in rounds:
        merge = rec["merge"]
        assert merge["kind"] == strategy and rec["objective"] == "pop_score"
        assert len(fetched) == len(rec["selected"]) == 3  # only the top M were fetched
        assert sum(merge["weights"]) == pytest.approx(1.0)
        if strategy == "soup":
            expected = soup(fetched)
            assert merge == {"kind": "soup", "members": rec["selected"], "weights": [1 / 3] * 3}
        elif strategy == "weighted_soup":
            scores = [rec["scores"][str(k)] for k in rec["selected"]]
            assert merge["weights"] == pytest.approx(score_weights(scores)) and merge["scores"] == scores
            expected = soup(fetched, merge["weights"])
        elif strategy == "greedy_soup":
            kept, held_out = merge["members"], merge["held_out"]
            assert merge["candidates"] == rec["selected"] and kept == rec["selected"][: len(kept)]
            assert merge["metric"] == "pop_score"
            assert all(b > a for a, b in itertools.pairwise(held_out[: len(kept)]))  # each kept member improved
            if len(kept) < 3:  # stopped: the next candidate did not improve, and no other was tried
                assert len(held_out) == len(kept) + 1 and held_out[-1] <= held_out[len(kept) - 1]
            expected = soup(fetched[: len(kept)])
        elif strategy == "wise_ft":
            assert merge["delta"] == 0.25 and merge["early"] == "round0"
            expected = wise_ft(initial_weights(cfg, 0), soup(fetched), 0.25)
        else:
            w = merge["w"]
            assert merge["weights"] == pytest.approx([x / sum(w) for x in w]) and (merge["mu"], merge["sigma"]) == (
                1.0,
                0.3,
            )
            assert len(set(w)) == 3  # drawn, not constant
            expected = task_arithmetic(round0_weights(cfg, rec["selected"]), fetched, w)
        assert all(_equal(member, expected) for member in after)  # σ_p = 0: every member is the merge
        assert rec["perturb"] == {"kind": "gaussian", "sigma": 0.0, "members": list(range(K))}
        ev = rec["eval"]
        assert (ev["k"], ev["threshold"]) == (4, 1.0) and sorted(ev["members"]) == ["0", "1", "2", "3"]
        assert all(0.0 <= m["pass_at_k"] <= 1.0 for m in ev["members"].values())
        assert ev["merged"] == evaluator(expected, rec["round"], PURPOSE_MERGED)  # pass@k of this merge


def test_greedy_soup_records_an_early_stop():
    # The stop rule exercised in a real run: at least one round keeps fewer than the M candidates,
    # and then exactly one candidate beyond the kept ones was evaluated.
    cfg = pop_grpo(*ROUNDS, "scheduler.merge=greedy_soup", "scheduler.greedy_soup_metric=reward_max")
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    merges = [rec["merge"] for rec, *_ in rounds]
    assert any(len(m["members"]) < len(m["candidates"]) for m in merges), merges
    for m in merges:
        assert len(m["held_out"]) == min(len(m["members"]) + 1, len(m["candidates"]))


def test_svd_mutation_is_applied_per_member_and_recorded():
    cfg = pop_grpo(*ROUNDS, "scheduler.mutate=svd")
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    for rec, fetched, after, _ in rounds:
        perturb = rec["perturb"]
        assert {k: perturb[k] for k in ("kind", "w_max", "mode", "base")} == {
            "kind": "svd",
            "w_max": 0.3,
            "mode": "scale",
            "base": "round0",
        }
        merged = soup(fetched)
        for k, member in enumerate(after):
            generator = torch_generator(cfg.run.seed, STREAM_PERTURB, k, rec["round"] + 1)
            expected, info = mutate(merged, SvdMutation(w_max=0.3), generator, initial_weights(cfg, k))
            assert _equal(member, expected) and perturb["w"][str(k)] == info
            assert torch.equal(member["mean_head.bias"], merged["mean_head.bias"])  # biases pass through
            assert not torch.equal(member["mean_head.weight"], merged["mean_head.weight"])
        assert perturb["w"]["0"] != perturb["w"]["1"]


def test_cyclic_selection_rotates_the_objective_and_reports_the_rest_as_behaviour():
    objectives = ["reward_max", "diversity", "archive_coverage"]
    cfg = pop_grpo(*ROUNDS, f"scheduler.objectives=[{', '.join(objectives)}]", "run.epochs=8")
    rounds, _, _ = _drive(cfg, LocalExecutor(cfg))
    assert [rec["objective"] for rec, *_ in rounds] == objectives
    for rec, _, _, last_rows in rounds:
        scores = objective_scores(last_rows, rec["objective"])
        assert rec["selected"] == select_top_m(scores, 3)
        assert rec["scores"] == {str(k): s for k, s in enumerate(scores)}
        others = [o for o in objectives if o != rec["objective"]]
        assert rec["behaviour"] == {str(k): {o: last_rows[k][o] for o in others} for k in range(K)}


def test_defaults_are_unchanged_by_evaluation():
    # The default round (pop_score, soup, Gaussian σ_p) with and without the merged-model
    # evaluation: evaluating draws from its own stream, so training is identical.
    cfg = pop_grpo(*ROUNDS, "scheduler.perturb_sigma=0.01")
    quiet = pop_grpo(*ROUNDS, "scheduler.perturb_sigma=0.01", "eval.merged=false")
    rounds, rows, final = _drive(cfg, LocalExecutor(cfg))
    rounds_q, rows_q, final_q = _drive(quiet, LocalExecutor(quiet))
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(rows_q))
    assert all(_equal(a, b) for a, b in zip(final, final_q, strict=True))
    assert "merged" in rounds[0][0]["eval"] and "merged" not in rounds_q[0][0]["eval"]
    assert [r[0]["merge"] for r in rounds] == [r[0]["merge"] for r in rounds_q]


def _no_policy_here(*_args, **_kwargs):
    raise AssertionError("the driver built a policy")


@pytest.mark.ray
def test_ray_runs_a_non_default_strategy_as_local_does(ray_local, monkeypatch):
    # task_arithmetic needs θ_0 and eval.merged (the default) a held-out evaluation: on Ray
    # both come from the evaluator actor, and the driver builds no policy for either.
    import popgrpo.algorithms.evaluation
    import popgrpo.algorithms.initial_weights
    from popgrpo.runtime.ray_executor import RayExecutor

    overrides = [
        "scheduler.merge=task_arithmetic",
        "scheduler.mutate=svd",
        "scheduler.objectives=[reward_max, pop_score]",
        *RAY_PAIRS,
    ]
    cfg = pop_grpo(*ROUNDS, *overrides)
    assert cfg.eval.merged
    local = _drive(cfg, LocalExecutor(cfg))
    with monkeypatch.context() as patch:
        patch.setattr(popgrpo.algorithms.evaluation, "make_rollouts", _no_policy_here)
        patch.setattr(popgrpo.algorithms.initial_weights, "policy_kind", _no_policy_here)
        remote = _drive(cfg, RayExecutor(cfg))
    assert [r[0] for r in remote[0]] == [r[0] for r in local[0]]  # lineage, bit for bit
    assert [r[0]["merge"]["kind"] for r in remote[0]] == ["task_arithmetic"] * 2
    assert [r[0]["perturb"]["kind"] for r in remote[0]] == ["svd"] * 2
    assert [r[0]["objective"] for r in remote[0]] == ["reward_max", "pop_score"]
    assert all("merged" in r[0]["eval"] for r in remote[0])
    assert set(remote[0][0][0]["perturb"]["w"]) == {"0", "1", "2", "3"}
    pd.testing.assert_frame_equal(pd.DataFrame(remote[1]), pd.DataFrame(local[1]))
    assert all(_equal(a, b) for a, b in zip(remote[2], local[2], strict=True))


def test_the_evaluator_actors_start_is_timed_from_its_creation_to_its_readiness(ray_local):
    # With the scheduler on, the evaluator actor starts with the member actors; the driver first
    # waits for it at the first round's end. Its start's deadline must learn how long the start
    # took, not how long the driver went without needing it.
    import ray

    from popgrpo.runtime.deadlines import EVALUATOR_CONSTRUCTION
    from popgrpo.runtime.ray_executor import RayExecutor

    executor = RayExecutor(pop_grpo(*ROUNDS, *RAY_PAIRS, "population.size=2", "scheduler.top_m=2"))  # one member actor
    try:
        assert executor.evaluator_actor is not None and executor._evaluator_starting is not None  # prestarted
        created = executor._evaluator_starting[2]  # time.time() at the actor's creation
        ready_by = ray.get(executor.evaluator_actor.prepare.remote(False))  # queued behind the start's own call
        time.sleep(max(0.0, ready_by + 1.0 - time.time()))  # the first need comes at least 1 s after the start
        executor.round0_weights([0])
        [measured] = executor._deadlines.seconds[EVALUATOR_CONSTRUCTION]
    finally:
        executor.close()
    assert 0.0 < measured <= ready_by - created
