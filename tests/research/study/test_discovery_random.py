"""Random search beside a discovery study (popgrpo.research.study.discovery_random): widths tuned on the
tuning instance only, the committed arm recomputes, and random_search in study.discovery
follows core's sampled_discovery."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from popgrpo.envs.idea import IdeaEnv
from popgrpo.research.study.discovery import WIDTHS, random_search
from popgrpo.research.study.discovery_plan import TUNING
from popgrpo.research.study.discovery_random import RANDOM_FILE, TUNED_METRICS, WIDTH_FILE, search_unit, tuned_widths

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "results" / "discovery"


def test_tuned_widths_take_each_metrics_best_width():
    tuning = pd.DataFrame(
        [{"landscape": "paper", "intensity": 1, "width": w, **{m: 0.0 for m in TUNED_METRICS}} for w in (0.5, 1.0, 2.0)]
    )
    tuning.loc[tuning["width"] == 2.0, "best_quality"] = 1.0  # higher is better
    tuning.loc[tuning["width"] == 0.5, "discovery_time"] = -1.0  # lower is better
    widths = tuned_widths(tuning)
    assert widths[("paper", 1, "best_quality")] == 2.0
    assert widths[("paper", 1, "discovery_time")] == 0.5
    assert widths[("paper", 1, "peaks")] == 0.5  # ties: the narrowest


def test_random_search_counts_only_executed_ideas_unless_asked():
    env = IdeaEnv()
    everything = random_search(env, 4096, 2.0, torch.Generator().manual_seed(0), 0.7, executed_only=False)
    executed = random_search(env, 4096, 2.0, torch.Generator().manual_seed(0), 0.7)
    assert everything.samples == executed.samples == 4096
    assert executed.best_quality <= everything.best_quality
    ideas = 2.0 * torch.randn((4096, 16), generator=torch.Generator().manual_seed(0))
    assert everything.best_quality == pytest.approx(float(env.quality(ideas).max()))


def test_the_committed_arm_was_tuned_on_the_tuning_instance_only_and_recomputes():
    widths = pd.read_parquet(COMMITTED / WIDTH_FILE)
    arm = pd.read_parquet(COMMITTED / RANDOM_FILE)
    trials = pd.read_parquet(COMMITTED / "discovery_trials.parquet")
    assert sorted(widths["width"].unique()) == list(WIDTHS)
    assert not set(arm["instance"]) & set(TUNING.instances) and not set(arm["seed"]) & set(TUNING.seeds)
    units = trials[["landscape", "instance", "intensity", "seed"]].drop_duplicates()
    assert len(arm) == len(units)
    chosen = tuned_widths(widths)
    row = arm[(arm["landscape"] == "collapse") & (arm["intensity"] == 1)].iloc[0]
    assert row["width_best_quality"] == chosen[("collapse", 1, "best_quality")]
    found = search_unit("collapse", int(row["instance"]), 1, int(row["seed"]), 76_800, row["width_best_quality"], 0.7)
    # The quality is float32 arithmetic: another numpy or torch build may sum in another order,
    # which moves the last bits (a few float32 ulps), so the recomputation is held to 1e-6.
    assert found["best_quality"] == pytest.approx(row["best_quality"], rel=1e-6)


def test_discovery_summary_carries_coverage_and_far_peaks():
    from popgrpo.core.discovery import Discovery
    from popgrpo.research.study.discovery import discovery_summary

    found = Discovery(
        best_expected=0.5,
        best_quality=1.8,
        samples=100,
        first_discovery={1: 10, 3: 50},
        peaks_known=True,
        trajectory=(),
        peak_fraction={0: 0.5, 1: 0.9, 3: 0.75},
    )
    summary = discovery_summary(found, frozenset({0, 1, 2, 3}), far=frozenset({2, 3}), threshold=0.7)
    assert summary["peaks"] == 2.0
    assert summary["coverage"] == pytest.approx((0 + 0.2 + 0 + 0.05) / 4)
    assert summary["far_peaks"] == 1.0  # peak 3 (0.75 >= 0.7); peak 2 never visited
    assert summary["far_coverage"] == pytest.approx(0.05 / 2)
    assert summary["discovery_time"] == pytest.approx((1 + 0.1 + 1 + 0.5) / 4)
    assert summary["peak_fraction_mean"] == pytest.approx((0.5 + 0.9 + 0 + 0.75) / 4)


def test_the_tuning_tables_redraw_with_random_search(tmp_path):
    import shutil

    from popgrpo.research.study.discovery_report import render_discovery

    committed = COMMITTED.parent / "discovery-tuning"
    for name in (
        "plan.json",
        "discovery_trials.parquet",
        "discovery_curves.parquet",
        "wall.jsonl",
        RANDOM_FILE,
        WIDTH_FILE,
    ):
        shutil.copy(committed / name, tmp_path / name)
    render_discovery(tmp_path)
    for name in ("arms.md", "tuning.md", "random_search.md"):
        assert (tmp_path / name).read_text() == (committed / name).read_text()
    assert "in-sample best width" in (tmp_path / "random_search.md").read_text()
    assert "| random search |" in (tmp_path / "arms.md").read_text()
