"""popgrpo.research.study.discovery: a run's (or K runs') discovery from its files."""

import json
import math

import pandas as pd
import pytest

from popgrpo.envs.idea import IdeaEnv
from popgrpo.research.study.discovery import archived_best_quality, reachable, run_discovery, trial_summary


def _metrics(hits_by_member: list[dict], best: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "epoch": [0] * len(best),
            "member": list(range(len(best))),
            "ideas": [10] * len(best),
            "discovery_best_expected": best,
            "discovery_best_quality": best,
            "discovery_peaks": [json.dumps(h) for h in hits_by_member],
        }
    )


def test_k_runs_are_charged_like_a_population_of_k():
    population = run_discovery(_metrics([{"3": 4}, {"5": 0}], [0.4, 0.9]))
    runs = run_discovery([_metrics([{"3": 4}], [0.4]), _metrics([{"5": 0}], [0.9])])
    assert population.first_discovery == runs.first_discovery == {3: 10, 5: 2}
    assert runs.best_expected == 0.9 and runs.samples == 20


def test_archived_best_quality_is_the_best_elite_without_noise():
    env = IdeaEnv()
    ideas = [env.peak_centres[4].tolist(), [30.0] * 16]
    archive = pd.DataFrame({"archive": [0, 0], "cell": [1, 2], "reward": [5.0, 0.1], "idea": ideas})
    assert archived_best_quality(archive, env) == pytest.approx(float(env.peak_quality[4]), rel=1e-6)
    assert math.isnan(archived_best_quality(archive.iloc[:0], env))


def test_trial_summary_counts_only_reachable_peaks_and_charges_never_found_as_one():
    frame = _metrics([{"3": 4}, {"5": 0}], [0.4, 0.9]).assign(
        discovery_peak_fraction=[json.dumps({"3": 0.95, "1": 0.5}), json.dumps({"5": 0.91})]
    )
    summary, curve = trial_summary(frame, frozenset({3, 4, 5}))
    # Peak 5 is found with the 2nd sample, peak 3 with the 10th; peak 4 never (counted as 1).
    assert summary["peaks"] == 2.0
    assert summary["discovery_time"] == pytest.approx((10 / 20 + 1.0 + 2 / 20) / 3)
    # Peak 4's basin was never visited: 0; peak 1 is not reachable and is left out.
    assert summary["peak_fraction_mean"] == pytest.approx((0.95 + 0.0 + 0.91) / 3)
    assert summary["peaks_at_0.9"] == 2.0
    assert summary["peaks_at_0.7"] == 2.0 and summary["samples"] == 20.0
    assert list(curve["peaks"]) == [2] and list(curve["samples"]) == [20]


def test_reachable_peaks_of_the_default_landscape_leave_out_the_shadowed_ones():
    env = IdeaEnv()
    found = reachable(env, env.peak_centres)
    assert found <= set(range(8)) and 7 in found
    for p in set(range(8)) - found:  # its centre lies in another peak's basin
        assert int(env.peak(env.peak_centres[p : p + 1])) != p


def test_spread_summary_is_the_last_quarters_mean_over_members():
    from popgrpo.research.study.discovery import spread_summary

    # five epochs: the last ⌈5/4⌉ = 2 (epochs 3 and 4) count, every member's rows
    frame = pd.DataFrame(
        {
            "epoch": [e for e in range(5) for _ in range(2)],
            "member": [0, 1] * 5,
            "entropy": [9.0] * 6 + [1.0, 1.2, 1.4, 1.6],
            "diversity": [9.0] * 6 + [0.1, 0.2, 0.3, 0.4],
        }
    )
    summary = spread_summary(frame)
    half_log_2pi_e = 0.5 * math.log(2 * math.pi * math.e)
    assert summary["entropy"] == pytest.approx(1.3) and summary["diversity"] == pytest.approx(0.25)
    assert summary["spread"] == pytest.approx(math.exp(1.3 - half_log_2pi_e))
    assert all(math.isnan(v) for v in spread_summary(frame[["epoch", "member"]]).values())


def test_a_real_trials_summary_carries_its_spread_beside_its_discovery(tmp_path):
    # Two short real runs on the collapse landscape, one starting with σ = 1 and one with σ = e^-1.5:
    # the trial summary reads both from the metrics.parquet the run wrote.
    from popgrpo.config import load_config, preset_path
    from popgrpo.envs import make_env
    from popgrpo.research.study.discovery import SPREAD_COLUMNS
    from popgrpo.research.study.plan import landscape_overrides
    from popgrpo.runtime.executor_spec import LOCAL
    from popgrpo.train import train

    base = [
        *landscape_overrides("collapse"),
        "population.size=2",
        "scheduler.enabled=false",
        "run.epochs=8",
        "grpo.steps_per_epoch=1",
        "eval.merged=false",
    ]
    summaries = {}
    for name, extra in {"wide": [], "narrow": ["policy.log_std_init=-1.5"]}.items():
        cfg = load_config(preset_path("pop_grpo"), [*base, *extra])
        train(cfg, tmp_path / name, LOCAL, progress=False)
        metrics = pd.read_parquet(tmp_path / name / "metrics.parquet")
        env = make_env(cfg.env)
        summary, _ = trial_summary(metrics, reachable(env, env.peak_centres), frozenset(env.far_peaks))
        last = metrics[metrics["epoch"] >= 6]  # the last quarter of 8 epochs, both members
        assert len(last) == 4 and summary["entropy"] == pytest.approx(float(last["entropy"].mean()))
        assert summary["diversity"] == pytest.approx(float(last["diversity"].mean())) and summary["diversity"] > 0
        assert {"far_coverage", "best_quality", *SPREAD_COLUMNS} <= summary.keys()
        summaries[name] = summary
    # the policy's σ barely moves in 8 one-step epochs: each run's spread is near where it started
    assert summaries["wide"]["spread"] == pytest.approx(1.0, abs=0.15)
    assert summaries["narrow"]["spread"] == pytest.approx(math.exp(-1.5), rel=0.15)
