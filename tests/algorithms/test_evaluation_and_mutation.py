"""Members' pass@k / best@k columns and SVD re-seeding; the driver's held-out evaluation of weights."""

import math

import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.evaluation import PURPOSE_GREEDY, PURPOSE_MERGED, WeightsEvaluator
from popgrpo.algorithms.initial_weights import initial_weights, round0_weights
from popgrpo.algorithms.member import Member
from popgrpo.core.merge import GaussianMutation, SvdMutation, mutate, soup
from popgrpo.core.seeding import STREAM_PERTURB, torch_generator
from tests.configs import defaults

TWO_MEMBERS = ("grpo.steps_per_epoch=2", "population.size=2")


def test_member_rows_report_pass_and_best_at_k():
    row = Member(0, defaults(*TWO_MEMBERS), LocalArchive()).train_epochs(1)[0]
    assert 0.0 <= row["pass_at_k"] <= 1.0
    assert row["best_at_k"] >= row["reward_mean"]  # the best of k is at least the average idea
    always = Member(0, defaults(*TWO_MEMBERS, "eval.success_threshold=-1000"), LocalArchive()).train_epochs(1)[0]
    never = Member(0, defaults(*TWO_MEMBERS, "eval.success_threshold=1000"), LocalArchive()).train_epochs(1)[0]
    assert (always["pass_at_k"], never["pass_at_k"]) == (1.0, 0.0)
    # the threshold only changes the report, never training
    assert always["reward_mean"] == never["reward_mean"] == row["reward_mean"]
    k1 = Member(0, defaults(*TWO_MEMBERS, "eval.k=1"), LocalArchive()).train_epochs(1)[0]
    assert k1["best_at_k"] == pytest.approx(row["reward_mean"])  # best@1 is the mean reward


def test_svd_reseed_follows_the_formula_per_member_and_round():
    cfg = defaults(*TWO_MEMBERS, "scheduler.mutate=svd")
    m0, m1 = Member(0, cfg, LocalArchive()), Member(1, cfg, LocalArchive())
    m0.train_epochs(1)
    merged = m0.get_weights()
    mutation = SvdMutation(w_max=0.3)
    info0 = m0.adopt(merged, mutation, round_index=1)
    info1 = m1.adopt(merged, mutation, round_index=1)
    assert info1 != info0  # each member its own draws
    w0, w1 = m0.get_weights(), m1.get_weights()
    expected, expected_info = mutate(
        merged, mutation, torch_generator(cfg.run.seed, STREAM_PERTURB, 0, 1), initial_weights(cfg, 0)
    )
    assert all(torch.equal(w0[k], expected[k]) for k in w0) and info0 == expected_info
    assert info0["n"] == 8 + 64 + 128 + 16 + 16 and 0.0 <= info0["min"] <= info0["max"] <= 0.3
    assert torch.equal(w0["trunk.0.bias"], merged["trunk.0.bias"])  # biases pass through
    assert not torch.equal(w0["trunk.0.weight"], w1["trunk.0.weight"])
    again = Member(0, cfg, LocalArchive())
    again.adopt(merged, mutation, round_index=1)
    assert torch.equal(again.get_weights()["trunk.2.weight"], w0["trunk.2.weight"])


def test_gaussian_reseed_accepts_a_mutation_or_a_sigma():
    cfg = defaults(*TWO_MEMBERS)
    a, b = Member(0, cfg, LocalArchive()), Member(0, cfg, LocalArchive())
    base = a.get_weights()
    assert a.adopt(base, GaussianMutation(sigma=0.01), 3) == {}
    b.adopt(base, 0.01, 3)
    assert all(torch.equal(a.get_weights()[k], b.get_weights()[k]) for k in base)


def test_round0_weights_shared_and_independent():
    cfg = defaults(*TWO_MEMBERS)
    assert all(torch.equal(v, initial_weights(cfg, 0)[k]) for k, v in round0_weights(cfg, [1]).items())
    ind = defaults(*TWO_MEMBERS, "population.shared_init=false")
    expected = soup([initial_weights(ind, 0), initial_weights(ind, 1)])
    assert all(torch.equal(v, expected[k]) for k, v in round0_weights(ind, [0, 1]).items())


def test_held_out_evaluation_is_seeded_by_round_and_purpose():
    cfg = defaults(*TWO_MEMBERS, "eval.samples=16", "eval.k=4")
    evaluator = WeightsEvaluator(cfg)
    weights = initial_weights(cfg, 0)
    a = evaluator(weights, 2, PURPOSE_GREEDY)
    assert a == evaluator(weights, 2, PURPOSE_GREEDY)  # common random numbers for greedy soup's candidates
    assert a != evaluator(weights, 2, PURPOSE_MERGED) and a != evaluator(weights, 3, PURPOSE_GREEDY)
    assert (a["n"], a["k"], a["threshold"]) == (16, 4, 1.0)
    assert 0.0 <= a["pass_at_1"] <= a["pass_at_k"] <= 1.0
    assert a["best_at_k"] >= a["reward_mean"] and a["reward_max"] >= a["best_at_k"]
    assert a["pop_score"] == pytest.approx(a["diversity"] * (1 + a["reward_max"]))
    assert all(math.isfinite(v) for v in a.values())
    # a member trained on the same seed is unaffected by evaluations made in between
    before = Member(0, cfg, LocalArchive()).train_epochs(1)
    evaluator(weights, 0, PURPOSE_MERGED)
    assert Member(0, cfg, LocalArchive()).train_epochs(1)[0]["reward_mean"] == before[0]["reward_mean"]
