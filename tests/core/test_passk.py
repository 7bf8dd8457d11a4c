"""pass@k (Chen et al. 2021) against its formula and against brute force; a population's pooled pass@k."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from popgrpo.core.passk import mean_pass_at_k, pool_counts, population_summary, unbiased_pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """The share of all k-subsets of n samples (c of them passing) that hold a pass."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_equals_brute_force_and_the_binomial_formula(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            value = float(unbiased_pass_at_k(n, c, k))
            assert value == pytest.approx(brute_force(n, c, k), abs=1e-12)
            assert value == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_large_n_does_not_overflow_and_matches_the_formula():
    n, c = 2000, 7
    for k in (1, 10, 100, 1000):
        assert float(unbiased_pass_at_k(n, c, k)) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-9)


def test_pass_at_1_is_the_success_rate_and_broadcasts():
    values = unbiased_pass_at_k(np.array([10, 10, 4]), np.array([0, 3, 4]), 1)
    assert values.tolist() == pytest.approx([0.0, 0.3, 1.0])


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (3, 4, 1), (3, -1, 1), (3, 1, 0)])
def test_out_of_range_is_refused(n, c, k):
    with pytest.raises(ValueError):
        unbiased_pass_at_k(n, c, k)


def test_the_mean_over_problems_skips_those_with_fewer_than_k_samples():
    counts = {"a": (8, 0), "b": (8, 8), "c": (2, 1)}
    assert mean_pass_at_k(counts, 1) == pytest.approx((0 + 1 + 0.5) / 3)
    assert mean_pass_at_k(counts, 8) == pytest.approx(0.5)
    assert math.isnan(mean_pass_at_k({}, 1))


def test_a_population_pools_its_members_samples():
    # Two members who solve different problems: each alone solves one, together both.
    a, b = {"p": (4, 4), "q": (4, 0)}, {"p": (4, 0), "q": (4, 1)}
    assert pool_counts([a, b]) == {"p": (8, 4), "q": (8, 1)}
    summary = population_summary([a, b], [{"p": ["x"]}, {"q": ["y"], "p": []}], k=4)
    assert summary["population_solved"] == 2 and summary["best_member_solved"] == 1
    pooled = (float(unbiased_pass_at_k(8, 4, 4)) + float(unbiased_pass_at_k(8, 1, 4))) / 2
    assert summary["population_pass_at_k"] == pytest.approx(pooled)
    assert summary["best_member_pass_at_k"] == pytest.approx(max(0.5, float(unbiased_pass_at_k(4, 1, 4)) / 2))
    assert summary["population_pass_at_1"] == pytest.approx((4 / 8 + 1 / 8) / 2)
    assert summary["population_distinct_correct"] == 1.0


def test_distinct_correct_solutions_are_counted_once_across_members():
    summary = population_summary([{"p": (2, 2)}, {"p": (2, 2)}], [{"p": ["x", "y"]}, {"p": ["y", "z"]}], k=2)
    assert summary["population_distinct_correct"] == 3
