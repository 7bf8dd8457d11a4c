"""A member's discovery columns: what popgrpo.core.discovery computes of the epoch's own ideas."""

import json
import math

import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.discovery import epoch_discovery
from popgrpo.algorithms.member import Member
from popgrpo.algorithms.step import NO_ARCHIVE_ANSWER, Scores, StepStats
from popgrpo.config import load_config
from popgrpo.core.discovery import union_discovery
from popgrpo.envs.idea import IdeaEnv


def _step(ideas: torch.Tensor, env: IdeaEnv, success: torch.Tensor | None = None) -> StepStats:
    n = ideas.shape[0]
    scores = Scores(
        features=ideas,
        complexity=env.complexity(ideas).reshape(1, n),
        rewards=torch.zeros(1, n),
        finite=torch.ones(1, n, dtype=torch.bool),
        n_bad=0,
        expected=env.expected_reward(ideas),
        success=success,
    )
    return StepStats(
        scores=scores, archive=NO_ARCHIVE_ANSWER, entropy=torch.tensor(0.0), kl=torch.tensor(0.0), identities=ideas
    )


def test_epoch_discovery_finds_the_peaks_its_ideas_sit_on():
    env = IdeaEnv()
    far = torch.full((2, 16), 40.0)  # Q ≈ 0: no peak
    centres = env.peak_centres
    assert env.peak(centres[[3, 6]]).tolist() == [3, 6]  # each in its own basin (not every peak is)
    steps = [_step(far, env), _step(torch.stack([centres[6], far[0], centres[3] + 0.05, centres[6]]), env)]
    row = epoch_discovery(steps, env, 0.9)
    # positions count every idea of the epoch in order: step 0 has 2, so step 1's are 2, 3, 4, 5
    assert json.loads(str(row["discovery_peaks"])) == {"3": 4, "6": 2}
    fractions = json.loads(str(row["discovery_peak_fraction"]))
    assert fractions["6"] == 1.0 and 0.9 < fractions["3"] < 1.0  # 0.05 off its centre
    assert set(fractions) == {str(int(p)) for p in env.peak(torch.cat([far, centres[[3, 6]]]))}
    all_ideas = torch.cat([far, centres[6:7], far[:1], centres[3:4] + 0.05])
    assert row["discovery_best_quality"] == float(env.quality(all_ideas).double().max())
    assert row["discovery_best_expected"] == float(env.expected_reward(all_ideas).double().max())


def test_ideas_that_were_not_executed_are_not_discoveries():
    env = IdeaEnv()
    ideas = env.peak_centres[[3, 4]]
    not_run = torch.tensor([math.nan, 1.0])  # a proxy's control_fraction executed the second only
    row = epoch_discovery([_step(ideas, env, not_run)], env, 0.9)
    assert json.loads(str(row["discovery_peaks"])) == {str(int(env.peak(ideas[1:]))): 1}
    assert row["discovery_best_quality"] == float(env.quality(ideas[1:]).double()[0])


def test_member_rows_carry_discovery_columns_that_bound_the_control():
    config = load_config(None, ["grpo.steps_per_epoch=2", "population.size=2"])
    rows = Member(0, config, LocalArchive()).train_epochs(3) + Member(1, config, LocalArchive()).train_epochs(3)
    for row in rows:
        assert row["discovery_best_expected"] >= row["control_expected_reward"]  # the max is at least the mean
        assert row["discovery_best_quality"] >= row["discovery_best_expected"]  # p_exec ≤ 1
        assert isinstance(row["discovery_peaks"], str)
        fractions = {int(p): f for p, f in json.loads(row["discovery_peak_fraction"]).items()}
        assert fractions and max(fractions.values()) <= 1.0
        # the best quality is that of the basin that came closest in absolute terms
        heights = IdeaEnv(config.env).peak_quality
        assert row["discovery_best_quality"] == pytest.approx(max(f * float(heights[p]) for p, f in fractions.items()))
    found = union_discovery(rows)
    assert found.samples == sum(r["ideas"] for r in rows)
    assert found.best_expected == max(r["discovery_best_expected"] for r in rows)
