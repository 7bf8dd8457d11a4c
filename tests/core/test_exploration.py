"""The 2025 exploration shapers against their papers' formulas, on small hand-computed cases
and on brute force over every k-subset of a group."""

import itertools
import math

import numpy as np
import pytest
import torch

from popgrpo.core.exploration import (
    OutcomeCounts,
    count_bonus,
    maxk_advantages,
    passk_advantages,
    reinforce_advantages,
    unlikeliness_rewards,
    weight_positive,
)


def test_passk_advantage_of_a_hand_computed_group():
    # n = 4, one correct, k = 2: R̄ = 1 − C(3,2)/C(4,2) = 1/2, σ = 1/2,
    # correct (1 − R̄)/σ = 1, incorrect (1 − R̄ − C(2,1)/C(3,1))/σ = (1/2 − 2/3)/(1/2) = −1/3.
    adv = passk_advantages(torch.tensor([[1.5, 0.2, 0.0, 0.9]]), threshold=1.0, k=2, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]]))


def test_passk_with_k_1_is_binary_grpo_with_the_population_std():
    # c = 1 of 4: mean 1/4, σ = sqrt(3/16); correct 0.75/σ, incorrect −0.25/σ
    adv = passk_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), threshold=0.5, k=1, eps=0.0)
    sigma = math.sqrt(3 / 16)
    torch.testing.assert_close(adv, torch.tensor([[0.75 / sigma, -0.25 / sigma, -0.25 / sigma, -0.25 / sigma]]))


@pytest.mark.parametrize("rewards", [[0.0] * 5, [2.0] * 5, [2.0, 2.0, 2.0, 2.0, 0.0]])
def test_passk_is_zero_where_every_k_subset_agrees(rewards):
    # none correct, all correct, or every 2-subset of 5 holds a correct one (c = 4 > n − k)
    assert torch.equal(passk_advantages(torch.tensor([rewards]), 1.0, k=2), torch.zeros(1, 5))


@pytest.mark.parametrize(("n", "k"), [(5, 2), (6, 3), (6, 1), (7, 4)])
def test_passk_matches_the_mean_over_k_subsets(n, k):
    # Chen et al.'s derivation: an idea's advantage is the mean pass of the k-subsets holding it,
    # less the group's mean pass@k, over the subsets' standard deviation.
    gen = np.random.default_rng(n * 10 + k)
    correct = gen.random(n) < 0.4
    correct[0], correct[1] = True, False  # neither all nor none
    subsets = list(itertools.combinations(range(n), k))
    passes = {s: float(any(correct[list(s)])) for s in subsets}
    mean = np.mean(list(passes.values()))
    sigma = math.sqrt(mean * (1 - mean))
    expected = [(np.mean([p for s, p in passes.items() if i in s]) - mean) / sigma if sigma else 0 for i in range(n)]
    adv = passk_advantages(torch.tensor(correct.astype(float)[None]), 0.5, k, eps=0.0)
    np.testing.assert_allclose(adv[0].numpy(), expected, rtol=1e-6, atol=1e-6)


def test_maxk_advantage_of_a_hand_computed_group():
    # g = (3, 0, 1), k = 2: subsets holding 3 give 3 − 0 and 3 − 1 (over C(2,1) = 2): 2.5;
    # 1 gains 1 − 0 in {0, 1} and 0 in {1, 3}: 0.5; the lowest idea, 0, never adds anything.
    adv = maxk_advantages(torch.tensor([[3.0, 0.0, 1.0]]), k=2)
    torch.testing.assert_close(adv, torch.tensor([[2.5, 0.0, 0.5]]))


@pytest.mark.parametrize(("n", "k"), [(4, 2), (6, 3), (6, 6), (8, 4), (5, 1)])
def test_maxk_matches_pkpo_subsets_with_the_leave_one_out_baseline(n, k):
    gen = np.random.default_rng(n + k)
    rows = gen.normal(size=(3, n)).round(1)  # ties included
    rows[2, :3] = rows[2, 0]
    adv = maxk_advantages(torch.tensor(rows), k).numpy()
    for row, got in zip(rows, adv, strict=True):
        expected = []
        for i in range(n):
            gains = []
            for subset in itertools.combinations(range(n), k):
                if i in subset:
                    rest = [row[j] for j in subset if j != i]
                    gains.append(max(row[list(subset)]) - (max(rest) if rest else 0.0))
            expected.append(sum(gains) / math.comb(n - 1, k - 1))
        np.testing.assert_allclose(got, expected, atol=1e-9)
        assert k == 1 or (got >= -1e-12).all()  # k = 1: the reward itself


def test_maxk_weights_are_pkpos_unbiased_max_at_k_gradient_weights_plus_a_baseline():
    # Σ_i of the weight s_i = (1/C(n,k)) Σ_{I∋i} max_I g (unscaled) is k times the max@k estimate
    # (1/C(n,k)) Σ_I max_I g: every subset counted once per member. The baselines sum to the (k−1)
    # estimates; check the pieces on one group.
    g = torch.tensor([[0.3, 2.0, -1.0, 1.1, 0.7]], dtype=torch.float64)
    n, k = 5, 3
    subsets = list(itertools.combinations(range(n), k))
    max_at_k = sum(float(g[0, list(s)].max()) for s in subsets) / math.comb(n, k)
    baseline = sum(max(float(g[0, j]) for j in s if j != i) for i in range(n) for s in subsets if i in s) / math.comb(
        n, k
    )
    scaled = maxk_advantages(g, k).sum() * k / n  # undo the n/k scaling of each weight
    assert float(scaled) == pytest.approx(k * max_at_k - baseline)


def test_w_reinforce_signs_and_positive_weight():
    adv = reinforce_advantages(torch.tensor([[1.2, 0.3, 1.0]]), threshold=1.0)
    assert adv.tolist() == [[1.0, -1.0, 1.0]]
    weighted = weight_positive(adv, 0.1)
    torch.testing.assert_close(weighted, torch.tensor([[0.1, -1.0, 0.1]]))
    assert weight_positive(adv, 1.0) is adv


def test_unlikeliness_scales_positive_rewards_by_likelihood_rank():
    # log-likelihood ranks (0 = least likely): idx1 (−3) 0, idx2 (−2) 1, idx0 (−1) 2, idx3 (−0.5) 3
    rewards = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    logp = torch.tensor([[-1.0, -3.0, -2.0, -0.5]])
    out = unlikeliness_rewards(rewards, logp, beta=0.5)
    torch.testing.assert_close(out, torch.tensor([[1 - 0.5 * 2 / 4, 1.0, 0.0, 1 - 0.5 * 3 / 4]]))
    negative = torch.tensor([[-1.0, 2.0]])
    assert unlikeliness_rewards(negative, torch.tensor([[5.0, 0.0]]), 1.0).tolist() == [[-1.0, 2.0]]


def test_count_bonus_is_c_over_sqrt_n():
    np.testing.assert_allclose(count_bonus([0, 1, 4, 16], 0.5), [0.5, 0.5, 0.25, 0.125])


def test_outcome_counts_count_a_batch_together_and_round_trip():
    counts = OutcomeCounts(4)
    assert counts.add([1, 1, 2]).tolist() == [2, 2, 1]
    assert counts.add([1]).tolist() == [3] and counts.total == 4
    copy = OutcomeCounts(4)
    copy.load_state_dict(counts.state_dict())
    assert copy.counts.tolist() == [0, 3, 1, 0]
    with pytest.raises(ValueError, match="lie in"):
        counts.add([4])
