"""The weight-space toolbox, each function against its formula on small hand-made tensors."""

import itertools
import math

import pytest
import torch

from popgrpo.core.merge import (
    GaussianMutation,
    SvdMutation,
    crossover_weights,
    greedy_soup,
    mutate,
    score_weights,
    soup,
    svd_mutable,
    svd_mutate,
    svd_scales,
    task_arithmetic,
    task_vector,
    weighted_soup,
    wise_ft,
)
from popgrpo.core.metrics import (
    best_at_k,
    group_pass_best_at_k,
    group_pass_best_at_k_batches,
    pairwise_diversity,
    pairwise_diversity_batches,
    pass_at_k,
    pass_at_k_rows,
)
from popgrpo.core.selection import cyclic_objective, objective_scores, pop_score


def _sd(w, b):
    return {"w": torch.tensor(w, dtype=torch.float32), "b": torch.tensor(b, dtype=torch.float32)}


A = _sd([[1.0, 2.0], [3.0, 4.0]], [1.0, -1.0])
B = _sd([[5.0, 0.0], [-1.0, 2.0]], [0.0, 3.0])
BASE = _sd([[1.0, 1.0], [1.0, 1.0]], [0.5, 0.5])


# ---- weighted soup -------------------------------------------------------------------------
def test_score_weights_sum_to_one_proportional_and_softmax():
    w = score_weights([3.0, 1.0])
    assert w == pytest.approx([0.75, 0.25]) and sum(w) == pytest.approx(1.0)
    assert score_weights([2.0, -1.0, 2.0]) == pytest.approx([0.5, 0.0, 0.5])  # negative scores clip to 0
    assert score_weights([-1.0, -2.0]) == pytest.approx([0.5, 0.5])  # none positive: uniform
    assert score_weights([1.0, math.nan]) == pytest.approx([1.0, 0.0])  # broken member gets nothing
    assert score_weights([math.nan, math.nan]) == pytest.approx([0.5, 0.5])
    soft = score_weights([1.0, 0.0, -1.0], temperature=0.5)
    expected = torch.softmax(torch.tensor([2.0, 0.0, -2.0], dtype=torch.float64), 0).tolist()
    assert soft == pytest.approx(expected) and sum(soft) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        score_weights([1.0], temperature=0.0)


def test_weighted_soup_is_the_score_weighted_mean():
    merged = weighted_soup([A, B], [3.0, 1.0])
    assert torch.allclose(merged["w"], 0.75 * A["w"] + 0.25 * B["w"])
    assert torch.allclose(merged["b"], 0.75 * A["b"] + 0.25 * B["b"])
    assert torch.equal(weighted_soup([A, B], [1.0, 1.0])["w"], soup([A, B])["w"])  # equal scores: the soup


# ---- greedy soup ---------------------------------------------------------------------------
def _members(*values):
    return [{"w": torch.full((2,), float(v))} for v in values]


def test_greedy_soup_stops_at_the_first_candidate_that_does_not_improve():
    # Held-out score: closeness of the soup to 2. Members 4, 0, 2, 100 (best first by score).
    calls = []

    def held_out(sd):
        calls.append(float(sd["w"][0]))
        return -abs(float(sd["w"][0]) - 2.0)

    merged, kept, scores = greedy_soup(_members(4, 0, 2, 100), held_out)
    # {4}: -2; {4, 0} → 2: 0 (kept); {4, 0, 2} → 2: 0, not better → stop; member 100 never tried.
    assert kept == [0, 1]
    assert scores == pytest.approx([-2.0, 0.0, 0.0])
    assert calls == pytest.approx([4.0, 2.0, 2.0])
    assert torch.equal(merged["w"], torch.full((2,), 2.0))


def test_greedy_soup_keeps_all_while_improving_and_one_when_nothing_helps():
    counter = itertools.count()
    merged, kept, scores = greedy_soup(_members(1, 2, 3), lambda sd: next(counter))  # always improving
    assert kept == [0, 1, 2] and scores == [0, 1, 2]
    assert torch.equal(merged["w"], soup(_members(1, 2, 3))["w"])
    merged, kept, scores = greedy_soup(_members(5, 0, 1), lambda sd: float(sd["w"][0]))  # higher is better
    assert kept == [0] and scores == pytest.approx([5.0, 2.5])
    assert torch.equal(merged["w"], torch.full((2,), 5.0))
    _, kept, _ = greedy_soup(_members(1, 2), lambda sd: math.nan)  # NaN never improves
    assert kept == [0]


# ---- WiSE-FT -------------------------------------------------------------------------------
def test_wise_ft_end_points_and_formula():
    assert torch.equal(wise_ft(BASE, A, 0.0)["w"], A["w"])  # δ = 0: the late (merged) weights
    assert torch.equal(wise_ft(BASE, A, 1.0)["b"], BASE["b"])  # δ = 1: the early checkpoint
    mid = wise_ft(BASE, A, 0.25)
    assert torch.allclose(mid["w"], 0.25 * BASE["w"] + 0.75 * A["w"])


# ---- task arithmetic (CycleQD crossover) ---------------------------------------------------
def test_task_arithmetic_matches_cycleqd_formula():
    w1, w2 = 0.9, 1.2
    merged = task_arithmetic(BASE, [A, B], [w1, w2])
    tau1, tau2 = task_vector(A, BASE), task_vector(B, BASE)
    for k in merged:
        expected = BASE[k] + (w1 / (w1 + w2)) * tau1[k] + (w2 / (w1 + w2)) * tau2[k]
        assert torch.allclose(merged[k], expected, atol=1e-6)
    # mixing weights sum to one, so the base cancels: it is the weighted mean of the parents
    assert torch.allclose(merged["w"], soup([A, B], [w1, w2])["w"], atol=1e-6)
    # equal w: the uniform soup; negative w are allowed, a zero sum is not
    assert torch.allclose(task_arithmetic(BASE, [A, B], [1.0, 1.0])["w"], soup([A, B])["w"])
    odd = task_arithmetic(BASE, [A, B], [2.0, -1.0])
    assert torch.allclose(odd["w"], 2.0 * A["w"] - B["w"])
    with pytest.raises(ValueError, match="non-zero sum"):
        task_arithmetic(BASE, [A, B], [1.0, -1.0])
    assert torch.equal(A["w"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # inputs untouched


def test_crossover_weights_are_seeded_normal_draws():
    a = crossover_weights(3, 1.0, 0.03, torch.Generator().manual_seed(7))
    b = crossover_weights(3, 1.0, 0.03, torch.Generator().manual_seed(7))
    assert a == b and len(a) == 3 and a != crossover_weights(3, 1.0, 0.03, torch.Generator().manual_seed(8))
    many = torch.tensor(crossover_weights(20000, 1.0, 0.03, torch.Generator().manual_seed(0)))
    assert float(many.mean()) == pytest.approx(1.0, abs=1e-3) and float(many.std()) == pytest.approx(0.03, rel=0.03)
    assert crossover_weights(2, 0.5, 0.0, torch.Generator()) == [0.5, 0.5]


# ---- SVD mutation --------------------------------------------------------------------------
def test_svd_mutation_with_unit_scales_returns_tau_and_biases_pass_through():
    g = torch.Generator().manual_seed(3)
    tau = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(4, generator=g), "row": torch.randn(1, 5, generator=g)}
    assert svd_mutable(tau["w"]) and not svd_mutable(tau["b"]) and not svd_mutable(tau["row"])
    same = svd_mutate(tau, {"w": torch.ones(3, dtype=torch.float64)})
    assert torch.allclose(same["w"], tau["w"], atol=1e-6)
    assert torch.equal(same["b"], tau["b"]) and torch.equal(same["row"], tau["row"])
    assert torch.equal(svd_mutate(tau, {"w": torch.zeros(3)})["w"], torch.zeros(4, 3))


def test_svd_mutation_scales_each_singular_component():
    u, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(2, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    sigma = torch.tensor([3.0, 1.0], dtype=torch.float64)
    tau = {"w": u[:, :2] @ torch.diag(sigma) @ v.T}
    scales = torch.tensor([0.5, 2.0], dtype=torch.float64)  # components in descending σ order
    out = svd_mutate(tau, {"w": scales})["w"]
    assert torch.allclose(out, u[:, :2] @ torch.diag(scales * sigma) @ v.T, atol=1e-10)
    assert torch.linalg.svdvals(out).tolist() == pytest.approx([2.0, 1.5])
    with pytest.raises(ValueError, match="scales"):
        svd_mutate(tau, {"w": torch.ones(3)})


def test_svd_scales_are_uniform_in_range_one_per_component_and_seeded():
    tau = {"a": torch.zeros(5, 3), "b": torch.zeros(5), "c": torch.zeros(2, 3, 4)}
    s1 = svd_scales(tau, 0.3, torch.Generator().manual_seed(11))
    s2 = svd_scales(tau, 0.3, torch.Generator().manual_seed(11))
    assert set(s1) == {"a", "c"} and s1["a"].shape == (3,) and s1["c"].shape == (2,)
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    wide = torch.zeros(1).expand(5000, 2000)  # only the shape matters: rank 2000
    big = svd_scales({"m": wide}, 0.3, torch.Generator().manual_seed(0))["m"]
    assert big.shape == (2000,) and float(big.min()) >= 0.0 and float(big.max()) <= 0.3
    assert float(big.mean()) == pytest.approx(0.15, abs=0.01)


def test_mutate_svd_is_relative_to_base_and_seeded():
    g = torch.Generator().manual_seed(5)
    base = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    merged = {"w": base["w"] + torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    mutation = SvdMutation(w_max=0.3)
    out1, info1 = mutate(merged, mutation, torch.Generator().manual_seed(9), base)
    out2, info2 = mutate(merged, mutation, torch.Generator().manual_seed(9), base)
    out3, _ = mutate(merged, mutation, torch.Generator().manual_seed(10), base)
    assert torch.equal(out1["w"], out2["w"]) and info1 == info2 and not torch.equal(out1["w"], out3["w"])
    assert torch.equal(out1["b"], merged["b"])  # the bias passes through (not base + rounding)
    w = svd_scales(task_vector(merged, base), 0.3, torch.Generator().manual_seed(9))["w"]
    expected = base["w"] + svd_mutate(task_vector(merged, base), {"w": w})["w"]
    assert torch.allclose(out1["w"], expected, atol=1e-6)
    assert info1["n"] == 3 and info1["min"] == pytest.approx(float(w.min())) and info1["max"] <= 0.3
    added, _ = mutate(merged, SvdMutation(w_max=0.3, mode="add"), torch.Generator().manual_seed(9), base)
    expected_add = base["w"] + svd_mutate(task_vector(merged, base), {"w": 1.0 + w})["w"]
    assert torch.allclose(added["w"], expected_add, atol=1e-6)
    with pytest.raises(ValueError, match="base"):
        mutate(merged, mutation, torch.Generator())
    with pytest.raises(ValueError, match="unknown svd mutation mode 'double'"):
        mutate(merged, SvdMutation(mode="double"), torch.Generator(), base)  # pyright: ignore[reportArgumentType]
    assert mutation.needs_base and not GaussianMutation(0.1).needs_base


def test_mutate_gaussian_is_perturb():
    out, info = mutate(A, GaussianMutation(sigma=0.1), torch.Generator().manual_seed(4))
    noise = torch.randn(2, 2, generator=torch.Generator().manual_seed(4))
    assert torch.equal(out["w"], A["w"] + 0.1 * noise) and info == {}


# ---- cyclic selection ------------------------------------------------------------------------
def test_cyclic_objective_rotates_and_objective_scores_read_rows():
    objectives = ["reward_max", "diversity", "archive_coverage"]
    assert [cyclic_objective(r, objectives) for r in range(5)] == [
        "reward_max",
        "diversity",
        "archive_coverage",
        "reward_max",
        "diversity",
    ]
    assert cyclic_objective(7, ["pop_score"]) == "pop_score"
    rows = [{"diversity": 0.5, "reward_max": 1.0, "archive_coverage": 0.2}, {"diversity": 0.9, "reward_max": 0.0}]
    assert objective_scores(rows, "pop_score") == [pop_score(0.5, 1.0), pop_score(0.9, 0.0)]
    assert objective_scores(rows, "diversity") == [0.5, 0.9]


# ---- pass@k and best@k -----------------------------------------------------------------------
def _brute_best(values, k):
    return sum(max(c) for c in itertools.combinations(values, k)) / math.comb(len(values), k)


def test_best_at_k_is_the_expected_max_of_k_draws():
    values = [0.3, -1.0, 2.0, 0.7, 0.7]
    rows = torch.tensor([values, values[::-1]])
    for k in range(1, 6):
        assert best_at_k(rows, k).tolist() == pytest.approx([_brute_best(values, k)] * 2)
    assert float(best_at_k(rows, 1)[0]) == pytest.approx(sum(values) / 5)  # k = 1: the mean
    assert float(best_at_k(rows, 5)[0]) == pytest.approx(2.0)  # k = n: the max
    with pytest.raises(ValueError):
        best_at_k(rows, 6)


def test_pass_at_k_rows_and_group_means():
    successes = torch.tensor([[True, False, False, True], [False] * 4, [True] * 4])
    assert pass_at_k_rows(successes, 2).tolist() == pytest.approx([pass_at_k(4, 2, 2), 0.0, 1.0])
    rewards = torch.tensor([[1.0, 0.0, 0.2, 1.5], [0.0, 0.1, 0.2, 0.3], [math.nan, 2.0, 2.0, 2.0]])
    p, b = group_pass_best_at_k(rewards, threshold=1.0, k=2)
    assert p == pytest.approx((pass_at_k(4, 2, 2) + 0.0) / 2)  # the NaN row is left out
    assert b == pytest.approx((_brute_best([1.0, 0.0, 0.2, 1.5], 2) + _brute_best([0.0, 0.1, 0.2, 0.3], 2)) / 2)
    assert all(math.isnan(x) for x in group_pass_best_at_k(torch.tensor([[math.nan, 1.0]]), 1.0, 1))


def test_batched_pass_best_and_diversity_equal_each_batch_alone():
    """A member reduces its epoch's steps in one call: each batch's value is the one-batch function's."""
    g = torch.Generator().manual_seed(5)
    rewards = torch.randn(4, 3, 6, generator=g)
    rewards[1, 0, 2] = math.nan  # one row of batch 1 left out
    rewards[3] = math.inf  # batch 3: every row left out → NaN
    passed, best = group_pass_best_at_k_batches(rewards, threshold=0.5, k=3)
    for s in range(4):
        p, b = group_pass_best_at_k(rewards[s], threshold=0.5, k=3)
        if s == 3:
            assert math.isnan(p) and math.isnan(b) and passed[s].isnan() and best[s].isnan()
        else:
            assert float(passed[s]) == pytest.approx(p) and float(best[s]) == pytest.approx(b)
    ideas = torch.randn(5, 9, 4, generator=g)
    div = pairwise_diversity_batches(ideas)
    assert div.tolist() == pytest.approx([pairwise_diversity(x) for x in ideas], rel=1e-6)
    assert pairwise_diversity_batches(ideas[:, :1]).tolist() == [0.0] * 5
    with pytest.raises(ValueError):
        group_pass_best_at_k_batches(rewards[0], 0.5, 3)
