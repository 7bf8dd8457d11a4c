"""popgrpo.research.study.stats against known values: scipy's and statsmodels' outputs, hand computations."""

import math

import numpy as np
import pytest
from scipy import stats

from popgrpo.research.study.stats import (
    Claim,
    bootstrap_ci,
    hierarchical_bootstrap_ci,
    holm,
    judge,
    paired_test,
    tost_paired,
    verdicts_markdown,
)

A = [1.20, 1.05, 1.31, 0.98, 1.17, 1.25]
B = [1.02, 1.01, 1.10, 0.97, 1.00, 1.08]


def test_paired_test_is_scipys():
    result = paired_test(A, B)
    assert result.n == 6
    assert result.mean == pytest.approx(np.mean(np.subtract(A, B)))
    assert result.t_p == pytest.approx(stats.ttest_rel(A, B).pvalue)
    assert result.wilcoxon_p == pytest.approx(stats.wilcoxon(A, B).pvalue)
    d = np.subtract(A, B)
    assert result.dz == pytest.approx(d.mean() / d.std(ddof=1))


def test_paired_test_of_degenerate_samples():
    same = paired_test([1.0, 2.0], [1.0, 2.0])
    assert math.isnan(same.t_p) and math.isnan(same.wilcoxon_p) and math.isnan(same.dz)
    shifted = paired_test([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])
    assert shifted.dz == math.inf and shifted.t_p == 0.0 and shifted.mean == pytest.approx(0.5)
    assert paired_test([1.0, math.nan, 3.0], [0.0, 1.0, 1.0]).n == 2  # a pair with a NaN is dropped


def test_holm_matches_a_hand_computation():
    # sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → running max 0.06
    adjusted, reject = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert reject == [True, False, False, True]
    assert holm([0.3, 0.02]) == (pytest.approx([0.3, 0.04]), [False, True])


def test_holm_counts_an_untestable_claim_in_the_family():
    adjusted, reject = holm([0.02, math.nan])
    assert adjusted[0] == pytest.approx(0.04) and math.isnan(adjusted[1])
    assert reject == [True, False]


def test_tost_matches_a_hand_computation_and_statsmodels():
    from statsmodels.stats.weightstats import ttost_paired

    d = np.subtract(A, B)
    margin = 0.2
    n, mean, se = len(d), d.mean(), d.std(ddof=1) / math.sqrt(len(d))
    lower = 1 - stats.t.cdf((mean + margin) / se, n - 1)
    upper = stats.t.cdf((mean - margin) / se, n - 1)
    result = tost_paired(A, B, margin=margin)
    assert (result.p_lower, result.p_upper) == (pytest.approx(lower), pytest.approx(upper))
    assert result.p == pytest.approx(max(lower, upper))
    assert result.p == pytest.approx(ttost_paired(np.array(A), np.array(B), -margin, margin)[0])


def test_tost_says_equivalent_only_when_the_interval_fits_the_margin():
    rng = np.random.default_rng(0)
    tight = rng.normal(0.0, 0.01, size=12)  # mean ≈ 0, small spread
    assert tost_paired(tight, margin=0.05).p < 0.05
    assert tost_paired(tight, margin=0.001).p > 0.05
    wide = rng.normal(0.0, 0.5, size=5)  # mean ≈ 0 too, but far too uncertain
    assert tost_paired(wide, margin=0.05).p > 0.05
    assert tost_paired([0.01, 0.01, 0.01], margin=0.05).p == 0.0
    with pytest.raises(ValueError, match="margin"):
        tost_paired(tight, margin=0.0)


def test_bootstrap_ci_is_scipys_percentile_interval():
    d = np.subtract(A, B)
    expected = stats.bootstrap(
        (d,), np.mean, n_resamples=2000, method="percentile", rng=np.random.default_rng(3)
    ).confidence_interval
    assert bootstrap_ci(A, B, n_resamples=2000, seed=3) == (pytest.approx(expected.low), pytest.approx(expected.high))
    assert bootstrap_ci([0.2, 0.2, 0.2]) == (0.2, 0.2)


def test_hierarchical_bootstrap_widens_when_one_instance_carries_the_effect():
    seeds = [0.01, -0.01, 0.02, 0.0] * 3
    carried = [*seeds[:8], 0.9, 1.1, 1.0, 0.95]  # landscape 2 alone gains
    groups = [0] * 4 + [1] * 4 + [2] * 4
    flat_low, flat_high = bootstrap_ci(carried, n_resamples=4000, seed=1)
    low, high = hierarchical_bootstrap_ci(carried, groups, n_resamples=4000, seed=1)
    assert low <= np.mean(carried) <= high
    assert high - low > 1.5 * (flat_high - flat_low)  # instances, not seeds, are the units of evidence
    assert low < 0.05  # the one-instance gain is not established
    same_low, same_high = hierarchical_bootstrap_ci(seeds, [0] * 12, n_resamples=4000, seed=1)
    assert same_low < np.mean(seeds) < same_high
    with pytest.raises(ValueError, match="group labels"):
        hierarchical_bootstrap_ci(seeds, [0, 1])


def test_judge_gives_each_verdict_and_corrects_the_family():
    rng = np.random.default_rng(1)
    base = rng.normal(1.0, 0.1, size=10)
    claims = [
        Claim.paired("a beats b", base + 0.3 + rng.normal(0, 0.02, 10), base, margin=0.05),
        Claim.paired("a loses", base - 0.3 + rng.normal(0, 0.02, 10), base, margin=0.05),
        Claim.paired("lower is better", base - 0.3 + rng.normal(0, 0.02, 10), base, 0.05, higher_is_better=False),
        Claim.paired("same", base + rng.normal(0, 0.005, 10), base, margin=0.05),
        Claim.paired("unsure", base + rng.normal(0.02, 0.2, 10), base, margin=0.05),
    ]
    verdicts = judge(claims, n_resamples=999)
    assert [v.word for v in verdicts] == ["better", "worse", "better", "equivalent within ±0.05", "inconclusive"]
    raw = [v.p for v in verdicts]
    assert [v.p_holm for v in verdicts] == pytest.approx(holm(raw)[0])
    assert verdicts[0].ci[0] > 0.2 and verdicts[3].ci[1] < 0.05
    table = verdicts_markdown(verdicts)
    assert "| same | 10 |" in table and "**equivalent within ±0.05**" in table
    record = verdicts[4].record()
    assert record["verdict"] == "inconclusive" and record["n"] == 10 and record["margin"] == 0.05


def test_a_claim_significant_alone_can_be_inconclusive_in_a_large_family():
    d = [0.05, 0.09, 0.01, 0.06, 0.04]  # t-test p ≈ 0.02 alone
    alone = judge([Claim("gain", tuple(d), margin=0.01)], n_resamples=199)[0]
    assert alone.p < 0.05 and alone.word == "better"
    family = judge(
        [Claim("gain", tuple(d), margin=0.01)] + [Claim(f"null {i}", (0.1, -0.1, 0.05), 0.01) for i in range(5)],
        n_resamples=199,
    )
    assert family[0].p == alone.p and family[0].p_holm > 0.05 and family[0].word == "inconclusive"


def test_a_real_difference_smaller_than_the_margin_says_so():
    d = (-0.012, -0.018, -0.025, -0.025, -0.028)  # consistent, but far inside ±0.05
    (verdict,) = judge([Claim("small loss", d, margin=0.05)], n_resamples=199)
    assert verdict.outcome == "worse" and verdict.within_margin
    assert verdict.word == "worse, within ±0.05"
    assert verdict.record()["outcome"] == "worse"


def test_paired_claims_need_one_value_per_unit():
    with pytest.raises(ValueError, match="one of each per unit"):
        Claim.paired("x", [1.0, 2.0], [1.0], margin=0.1)


def test_a_claim_with_too_few_units_is_not_measured_and_stays_out_of_the_family():
    d = [0.05, 0.09, 0.01, 0.06, 0.04]
    claims = [Claim("gain", tuple(d), margin=0.01), Claim("one seed", (0.3,), margin=0.01, labels={"arm": "x"})]
    counted = judge(claims, n_resamples=99)  # min_n 0: the one-seed claim's NaN p counts as 1 in Holm
    gain, one = judge(claims, n_resamples=99, min_n=2)
    assert one.outcome == "not measured" and one.word == "not measured" and math.isnan(one.p_holm)
    assert gain.p_holm == pytest.approx(gain.p) and counted[0].p_holm == pytest.approx(2 * gain.p)
    assert one.record() == {"claim": "one seed", "n": 1, "verdict": "not measured", "arm": "x"}


def test_a_records_labels_follow_the_statistics_unless_named_first():
    claim = Claim("a − b", (0.1, 0.2, 0.15), margin=0.05, labels={"study": "s", "metric": "m"}, note="per seed")
    (verdict,) = judge([claim], n_resamples=99)
    assert verdict.extra == {"study": "s", "metric": "m"}
    keys = list(verdict.record())
    assert keys[0] == "claim" and keys[-3:] == ["verdict", "study", "metric"] and "per seed" not in str(keys)
    assert list(verdict.record(first=("study",)))[:2] == ["study", "claim"]


def test_verdicts_markdown_draws_the_columns_asked_for():
    from popgrpo.research.study.stats import CLAIM, VERDICT, label_column, verdicts_json

    claim = Claim("a − b", (0.1, 0.2, 0.15), margin=0.05, labels={"metric": "reward"})
    verdicts = judge([claim], n_resamples=99)
    table = verdicts_markdown(verdicts, [CLAIM, label_column("metric", "metric"), VERDICT])
    assert table == f"| claim | metric | verdict |\n| --- | --- | --- |\n| a − b | reward | **{verdicts[0].word}** |\n"
    assert verdicts_json([{"x": np.float32(0.5)}]) == '[\n {\n  "x": 0.5\n }\n]\n'


def test_survival_test_pairs_units_and_counts_who_was_first():
    from popgrpo.research.study.stats import holm_survival, survival_test

    rng = np.random.default_rng(0)
    late = np.array([9.0, 9.0, 9.0, 9.0]), np.array([False, False, False, False])  # censored at 9
    early = np.array([2.0, 3.0, 2.0, 9.0]), np.array([True, True, True, False])
    test = survival_test("late − early", *late, *early, rng=rng, n_resamples=99, labels={"family": "x"})
    assert test.order == (3, 1, 0) and test.tau == 9.0 and test.rmst_a == 9.0 and test.diff > 0
    (adjusted,) = holm_survival([test])
    assert adjusted.p_holm == pytest.approx(test.p) and adjusted.record()["family"] == "x"
