"""popgrpo.study.discovery: a run's (or K runs') discovery from its files."""

import json
import math

import pandas as pd
import pytest

from popgrpo.envs.idea import IdeaEnv
from popgrpo.study.discovery import archived_best_quality, run_discovery


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
