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
