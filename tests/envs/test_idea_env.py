import math

import pytest
import torch

from popgrpo.envs import Environment, Landscape
from popgrpo.envs.idea import IdeaEnv


def test_peaks_follow_the_paper():
    env = IdeaEnv()
    assert env.idea_dim == 16
    assert torch.allclose(env.peak_quality, 0.5 + 0.3 * torch.arange(8.0))
    assert torch.allclose(env.peak_width, 2.0 + 0.5 * torch.arange(8.0))
    # quality at a centre is at least that peak's maximum (max over bumps)
    q = env.quality(env.peak_centres)
    assert (q >= env.peak_quality - 1e-6).all()
    assert float(env.quality(env.peak_centres[-1:])) == pytest.approx(2.6, abs=1e-6)
    assert isinstance(env, Environment)


def test_peak_layout_is_seeded_not_training_dependent():
    assert torch.equal(IdeaEnv(peak_seed=3).peak_centres, IdeaEnv(peak_seed=3).peak_centres)
    assert not torch.equal(IdeaEnv(peak_seed=3).peak_centres, IdeaEnv(peak_seed=4).peak_centres)
    radii = IdeaEnv(radius_min=1.0, radius_max=8.0).peak_centres.norm(dim=1)
    assert torch.allclose(radii, torch.linspace(1.0, 8.0, 8), atol=1e-5)


def test_p_exec_formula_and_clip():
    env = IdeaEnv(exec_lambda=0.5)
    x = torch.zeros(4, 16)
    x[:, 0] = torch.tensor([0.0, 1.0, 4.0, 1000.0])
    assert env.p_exec(x).tolist() == pytest.approx([0.95, 1 / 1.5, 1 / 3.0, 0.05])


def test_expected_reward_falls_with_peak_while_ceiling_rises():
    env = IdeaEnv()
    expected = env.quality(env.peak_centres) * env.p_exec(env.peak_centres)
    assert expected[0] > expected[-1]
    assert env.peak_quality[-1] > env.peak_quality[0]


def test_reward_is_quality_plus_noise_on_success_only():
    env = IdeaEnv(noise_std=0.3)
    x = env.peak_centres[:1].repeat(20000, 1)
    r = env.reward(x, torch.Generator().manual_seed(0))
    zero = r == 0
    p = float(env.p_exec(x[:1]))
    assert zero.float().mean().item() == pytest.approx(1 - p, abs=0.02)
    executed = r[~zero]
    assert executed.mean().item() == pytest.approx(float(env.quality(x[:1])), abs=0.02)
    assert executed.std().item() == pytest.approx(0.3, abs=0.02)
    again = env.reward(x, torch.Generator().manual_seed(0))
    assert torch.equal(r, again)


def test_behaviour_and_complexity():
    env = IdeaEnv()
    x = torch.zeros(3, 16)
    x[0, 0] = 3.0  # norm 3 → sigmoid(0) = 0.5; angle 0 → 0.5
    x[1, 1] = 3.0  # angle π/2 → 0.75
    x[2, 0] = -3.0  # angle π → 1.0
    b = env.behaviour(x)
    assert b[:, 0].tolist() == pytest.approx([0.5, 0.5, 0.5])
    assert b[:, 1].tolist() == pytest.approx([0.5, 0.75, 1.0])
    assert env.complexity(x).tolist() == pytest.approx([3.0, 3.0, 3.0])
    y = torch.zeros(1, 16)
    y[0, :2] = torch.tensor([0.0, -1.0])
    assert env.behaviour(y)[0].tolist() == pytest.approx([1 / (1 + math.exp(2.0)), 0.25])


def test_execute_draws_as_reward_does_and_returns_the_expectation():
    env = IdeaEnv()
    ideas = torch.randn(64, env.idea_dim, generator=torch.Generator().manual_seed(1)) * 4
    alone = env.reward(ideas, torch.Generator().manual_seed(7))
    values, expected, success = env.execute(ideas, torch.Generator().manual_seed(7))
    assert torch.equal(values, alone)  # same draws, same order: runs do not change
    assert success.dtype == torch.bool and 0 < int(success.sum()) < len(success)
    assert bool((values[~success] == 0).all()) and bool((values[success] != 0).all())
    assert torch.allclose(expected, env.quality(ideas) * env.p_exec(ideas))
    assert torch.equal(expected, env.expected_reward(ideas))


def test_peak_names_the_bump_that_gives_the_quality():
    env = IdeaEnv()
    ideas = torch.randn(200, 16, generator=torch.Generator().manual_seed(0)) * 4.0
    peak = env.peak(ideas)
    assert peak.dtype == torch.int64 and peak.shape == (200,)
    by_hand = torch.stack(
        [
            float(q) * torch.exp(-((ideas - c) ** 2).sum(1) / (2 * float(w) ** 2))
            for q, c, w in zip(env.peak_quality, env.peak_centres, env.peak_width, strict=True)
        ],
        dim=1,
    )  # [N, peaks]
    assert torch.equal(peak, by_hand.argmax(dim=1))
    assert torch.allclose(env.quality(ideas), by_hand[torch.arange(200), peak], rtol=1e-5, atol=1e-7)
    assert isinstance(env, Landscape)
    assert len(set(peak.tolist())) > 1  # the test sees more than one basin
