"""popgrpo.core.discovery against its formulas: best noise-free values, peaks reached, samples to first discovery."""

import json
import math

import pytest
import torch

from popgrpo.core.discovery import (
    best_value,
    first_hits,
    parse_first_hits,
    parse_peak_fractions,
    peak_fractions,
    peak_hits,
    reachable_peaks,
    union_discovery,
)

HEIGHTS = torch.tensor([1.0, 2.0, 3.0])


def test_best_value_skips_nan_and_masked_entries():
    values = torch.tensor([0.5, math.nan, 2.0, 1.5])
    assert best_value(values) == 2.0
    assert best_value(values, torch.tensor([True, True, False, True])) == 1.5
    assert math.isnan(best_value(values, torch.tensor([False, True, False, False])))
    assert math.isnan(best_value(torch.empty(0)))


def test_a_peak_is_reached_at_the_fraction_of_its_own_height():
    quality = torch.tensor([0.9, 0.89, 1.8, 2.69, 2.7])
    peak = torch.tensor([0, 0, 1, 2, 2])
    # thresholds 0.9·[1, 2, 3] = [0.9, 1.8, 2.7] of each idea's own peak
    assert peak_hits(quality, peak, HEIGHTS, 0.9).tolist() == [True, False, True, False, True]


def test_first_hits_give_each_peaks_first_position_in_sampling_order():
    quality = torch.tensor([0.1, 2.9, 0.95, 3.0, 1.0, 1.9])
    peak = torch.tensor([0, 2, 0, 2, 0, 1])
    assert first_hits(quality, peak, HEIGHTS, 0.9) == {0: 2, 1: 5, 2: 1}
    executed = torch.tensor([True, False, False, True, True, False])
    assert first_hits(quality, peak, HEIGHTS, 0.9, executed) == {0: 4, 2: 3}
    assert first_hits(quality, peak, HEIGHTS, 1.0) == {0: 4, 2: 3}


def test_peak_fractions_are_each_basins_closest_approach_to_its_top():
    quality = torch.tensor([0.1, 2.9, 0.95, 3.0, 1.0, 1.2])
    peak = torch.tensor([0, 2, 0, 2, 0, 1])
    assert peak_fractions(quality, peak, HEIGHTS) == pytest.approx({0: 1.0, 1: 0.6, 2: 1.0})
    executed = torch.tensor([True, True, True, False, False, False])
    fractions = peak_fractions(quality, peak, HEIGHTS, executed)
    assert fractions == {0: pytest.approx(0.95), 2: pytest.approx(2.9 / 3.0)}  # peak 1 unvisited
    # a peak's fraction reaches f when first_hits at f finds it (away from rounding at the boundary)
    for f in (0.5, 0.9, 0.96, 0.97, 1.0):
        assert {p for p, x in fractions.items() if x >= f} == set(first_hits(quality, peak, HEIGHTS, f, executed))
    assert parse_peak_fractions('{"1": 0.5}') == {1: 0.5} and parse_peak_fractions(None) is None


def test_parse_first_hits_reads_json_mappings_and_unknowns():
    assert parse_first_hits('{"2": 7, "0": 1}') == {2: 7, 0: 1}
    assert parse_first_hits({"1": 3}) == {1: 3}
    assert parse_first_hits(None) is None
    assert parse_first_hits(math.nan) is None


def _row(epoch, member, ideas, hits, best_expected=math.nan, best_quality=math.nan, fractions=None, **keys):
    peaks = None if hits is None else json.dumps({str(p): i for p, i in hits.items()})
    near = None if fractions is None else json.dumps({str(p): f for p, f in fractions.items()})
    return {
        "epoch": epoch,
        "member": member,
        "ideas": ideas,
        "discovery_best_expected": best_expected,
        "discovery_best_quality": best_quality,
        "discovery_peaks": peaks,
        "discovery_peak_fraction": near,
        **keys,
    }


def test_union_counts_samples_in_lockstep_and_unions_peaks():
    rows = [
        _row(0, 0, 10, {}, 0.2, 0.4),
        _row(0, 1, 10, {0: 3}, 0.3, math.nan),
        _row(1, 0, 10, {0: 0, 2: 9}, 0.5, 1.0),
        _row(1, 1, 10, {2: 4}, math.nan, 0.9),
    ]
    found = union_discovery(rows)
    # peak 0: epoch 0, member 1's 4th idea: both members had sampled 4 → 8
    # peak 2: epoch 1 (20 before); member 1's 5th idea (2·5 = 10) beats member 0's 10th (2·10 = 20) → 30
    assert found.first_discovery == {0: 8, 2: 30}
    assert found.peaks == frozenset({0, 2})
    assert found.samples_to_first(1) is None and found.samples == 40
    assert (found.best_expected, found.best_quality) == (0.5, 1.0)
    assert found.peaks_known
    assert [(p.epoch, p.samples, p.peaks, p.best_expected) for p in found.trajectory] == [
        (0, 20, 1, 0.3),
        (1, 40, 2, 0.5),
    ]


def test_union_keeps_each_peaks_best_fraction_for_other_thresholds():
    rows = [
        _row(0, 0, 10, {}, fractions={1: 0.5, 4: 0.8}),
        _row(0, 1, 10, {4: 2}, fractions={4: 0.93}),
        _row(1, 0, 10, {}, fractions={1: 0.7}),
    ]
    found = union_discovery(rows)
    assert found.peak_fraction == {1: 0.7, 4: 0.93}
    assert found.peaks_at(0.9) == found.peaks == frozenset({4})
    assert found.peaks_at(0.6) == frozenset({1, 4}) and found.peaks_at(0.95) == frozenset()


def test_union_charges_units_with_fewer_ideas_only_what_they_sampled():
    rows = [_row(0, 0, 4, {}), _row(0, 1, 100, {1: 9})]
    assert union_discovery(rows).first_discovery == {1: 4 + 10}


def test_union_over_k_runs_is_the_population_union_when_runs_are_units():
    population = [_row(e, k, 8, {k: e}) for e in range(2) for k in range(3)]
    runs = [{**_row(e, 0, 8, {k: e}), "run": k} for e in range(2) for k in range(3)]
    assert union_discovery(runs, unit=("run", "member")) == union_discovery(population)
    with pytest.raises(ValueError, match="several rows of one unit"):
        union_discovery(runs)


def test_union_without_peak_columns_knows_no_peaks():
    found = union_discovery([_row(0, 0, 5, None, 0.7), {"epoch": 1, "member": 0, "ideas": 5}])
    assert not found.peaks_known and found.peaks == frozenset()
    assert found.best_expected == 0.7 and math.isnan(found.best_quality) and found.samples == 10


def test_reachable_peaks_are_those_whose_centre_is_in_their_own_basin():
    assert reachable_peaks(torch.tensor([6, 1, 5, 3])) == frozenset({1, 3})


def test_peak_coverage_is_the_mean_excess_over_the_threshold():
    from popgrpo.core.discovery import peak_coverage, peak_reach

    fractions = {0: 0.95, 1: 0.6, 3: 0.8}  # peak 2 never visited
    # mean over peaks 0..3 of max(0, f − 0.7): (0.25 + 0 + 0 + 0.1) / 4
    assert peak_coverage(fractions, range(4), 0.7) == pytest.approx(0.35 / 4)
    assert peak_coverage(fractions, [1, 2], 0.7) == 0.0  # spread alone (0.6) buys nothing
    assert peak_coverage(fractions, [0], 0.9) == pytest.approx(0.05)
    assert math.isnan(peak_coverage(fractions, [], 0.7))
    assert peak_reach(fractions, [3, 0, 1, 2], 0.8) == {0: True, 1: False, 2: False, 3: True}


def test_sampled_discovery_of_one_stream_is_union_discovery_of_its_rows():
    from popgrpo.core.discovery import sampled_discovery

    quality = torch.tensor([0.1, 2.9, 0.95, 3.0, 1.0, 1.9, 0.2])
    peak = torch.tensor([0, 2, 0, 2, 0, 1, 1])
    expected = quality / 2
    executed = torch.tensor([True, False, True, True, True, True, False])
    halves = [(quality[:3], peak[:3], expected[:3], executed[:3]), (quality[3:], peak[3:], expected[3:], executed[3:])]
    found = sampled_discovery(halves, HEIGHTS, 0.9)
    # the same ideas as one unit's two epochs of rows
    rows = []
    for epoch, (q, p, e, x) in enumerate(halves):
        hits = first_hits(q, p, HEIGHTS, 0.9, x)
        rows.append(
            {
                "epoch": epoch,
                "member": 0,
                "ideas": len(q),
                "discovery_best_expected": best_value(e, x),
                "discovery_best_quality": best_value(q, x),
                "discovery_peaks": json.dumps({str(k): v for k, v in hits.items()}),
                "discovery_peak_fraction": json.dumps({str(k): v for k, v in peak_fractions(q, p, HEIGHTS, x).items()}),
            }
        )
    union = union_discovery(rows)
    assert found.first_discovery == union.first_discovery == {0: 3, 1: 6, 2: 4}
    assert found.peak_fraction == pytest.approx(union.peak_fraction)
    assert (found.best_quality, found.best_expected, found.samples) == (3.0, 1.5, 7)
    assert (union.best_quality, union.best_expected, union.samples) == (3.0, 1.5, 7)
