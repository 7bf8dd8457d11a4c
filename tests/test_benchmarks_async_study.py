"""The pure parts of benchmarks/async_study.py: intervals, utilisation, what a budget reaches, the paired comparison."""

from __future__ import annotations

import math

import pytest

from benchmarks.async_study import (
    Call,
    compare,
    epochs_by,
    mean_sd,
    overlap,
    reached_rows,
    round_of_epoch,
    utilisation,
    write_region,
)


def test_overlap_clips_an_interval_to_a_window():
    assert overlap(1.0, 3.0, 0.0, 10.0) == 2.0
    assert overlap(1.0, 3.0, 2.0, 10.0) == 1.0
    assert overlap(1.0, 3.0, 0.0, 2.5) == 1.5
    assert overlap(1.0, 3.0, 4.0, 5.0) == 0.0


def test_utilisation_splits_busy_time_into_compute_and_sleep_and_clips_at_the_budget():
    # Two actors over [0, 10]: actor 0 busy 0–4 (last 3 s asleep) and 5–9 (last 1 s asleep);
    # actor 1 busy 0–8 (last 6 s asleep) and 9–12, of which only 9–10 is inside the budget.
    calls = [
        Call(0, 0, 10, 0.0, 4.0, 3.0),
        Call(0, 1, 10, 5.0, 9.0, 1.0),
        Call(1, 0, 10, 0.0, 8.0, 6.0),
        Call(1, 1, 10, 9.0, 12.0, 2.0),  # its sleep, 10–12, lies past the budget
    ]
    shares = utilisation(calls, n_actors=2, t0=0.0, budget=10.0)
    assert shares["busy"] == pytest.approx((4 + 4 + 8 + 1) / 20)
    assert shares["delay"] == pytest.approx((3 + 1 + 6 + 0) / 20)
    assert shares["compute"] == pytest.approx(shares["busy"] - shares["delay"])
    assert shares["idle"] == pytest.approx(1 - shares["busy"])
    with pytest.raises(ValueError):
        utilisation(calls, n_actors=0, t0=0.0, budget=10.0)


def test_a_budget_counts_only_the_calls_answered_by_then_and_their_rows():
    calls = [Call(0, 0, 10, 0.0, 4.0), Call(1, 0, 10, 0.0, 8.0), Call(0, 1, 10, 5.0, 9.0), Call(1, 1, 10, 9.0, 12.0)]
    assert epochs_by(calls, 8.0) == 20
    assert epochs_by(calls, 100.0) == 40
    assert reached_rows(calls, [[0], [1]], 9.0) == {(0, 0), (1, 0), (0, 1)}
    # A packed actor's rows belong to every member it holds.
    assert reached_rows(calls, [[0, 2], [1]], 4.0) == {(0, 0), (2, 0)}
    assert [round_of_epoch(e, 10) for e in (0, 9, 10, 25)] == [0, 0, 1, 2]


def test_mean_sd_drops_nans_and_has_no_sd_for_one_value():
    assert mean_sd([1.0, 3.0, math.nan]) == (2.0, pytest.approx(math.sqrt(2)))
    mean, sd = mean_sd([5.0])
    assert mean == 5.0 and math.isnan(sd)


def test_compare_pairs_arms_by_seed():
    rows = [{"arm": "sync", "seed": s, "x": float(s)} for s in range(4)] + [
        {"arm": "async", "seed": s, "x": float(s) + 1.0 + 0.1 * s} for s in range(4)
    ]
    (c,) = compare(rows, ["sync", "async"], ["x"])
    # Paired by seed: the differences are 1.0, 1.1, 1.2, 1.3 although the arms' spreads overlap.
    assert c["diff"] == pytest.approx(1.15)
    assert 1.0 <= c["ci"][0] < c["ci"][1] <= 1.3
    assert c["t_p"] < 0.01
    assert c["ratio"] == pytest.approx((1.5 + 1.15) / 1.5)


def test_write_region_replaces_its_own_block_and_keeps_the_rest(tmp_path):
    path = tmp_path / "B.md"
    path.write_text("# Benchmarks\n\nbefore\n")
    write_region(path, "one")
    write_region(path, "two")
    text = path.read_text()
    assert text.count("async-study:begin") == 1 and "two" in text and "one" not in text
    assert text.startswith("# Benchmarks\n\nbefore\n")
    # A tagged study has its own markers: writing it leaves the first one alone.
    write_region(path, "second", tag="scale2")
    write_region(path, "third", tag="scale2")
    text = path.read_text()
    assert "two" in text and "third" in text and "second" not in text
    assert text.index("async-study:end") < text.index("async-study-scale2:begin")
