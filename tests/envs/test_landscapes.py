"""Landscape families (popgrpo.envs.landscapes), chosen by env.landscape through the registry."""

import math

import numpy as np
import pytest
import torch

from popgrpo.config import ConfigError, EnvConfig, load_config
from popgrpo.envs.idea import IdeaEnv
from popgrpo.envs.landscapes import gaussian_peaks, stepping_stones
from popgrpo.registry import LANDSCAPES

CALIBRATED = {"radius_min": 3.517504390359858, "radius_max": 12.142626744509286, "exec_lambda": 1.1772163498437014}


def _paper_formula(cfg: EnvConfig):
    """The paper landscape as IdeaEnv built it before landscape families existed."""
    i = torch.arange(cfg.n_peaks, dtype=torch.float32)
    rng = np.random.default_rng(cfg.peak_seed)
    directions = rng.standard_normal((cfg.n_peaks, cfg.dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    radii = np.linspace(cfg.radius_min, cfg.radius_max, cfg.n_peaks)
    centres = torch.as_tensor(directions * radii[:, None], dtype=torch.float32)
    return centres, cfg.quality_base + cfg.quality_step * i, cfg.width_base + cfg.width_step * i


@pytest.mark.parametrize("fields", [{}, {"peak_seed": 2}, {"peak_seed": 1000, **CALIBRATED}, {"dim": 4, "n_peaks": 5}])
def test_the_paper_landscape_is_bit_for_bit_the_formula(fields):
    env = IdeaEnv(**fields)
    centres, quality, width = _paper_formula(EnvConfig(**fields))
    assert torch.equal(env.peak_centres, centres) and env.peak_centres.dtype == torch.float32
    assert torch.equal(env.peak_quality, quality) and torch.equal(env.peak_width, width)
    assert env.far_peaks == frozenset(range(env.peak_quality.numel() // 2, env.peak_quality.numel()))


def test_families_are_chosen_by_config_through_the_registry():
    assert LANDSCAPES.get("peaks") is gaussian_peaks and LANDSCAPES.get("stepping_stones") is stepping_stones
    assert IdeaEnv(landscape="stepping_stones").peak_quality.numel() == 4 * (3 + 1)
    with pytest.raises(ConfigError, match="stepping_stones"):
        load_config(None, ["env.landscape=stepping_stone"])


def test_stepping_stones_are_bent_chains_of_rising_stones_ending_in_a_narrow_far_peak():
    spec = {"chains": 3, "stones": 4, "spacing": 1.5, "bend": 0.5, "far_width": 1.5, "far_quality": 2.0}
    cfg = EnvConfig(landscape="stepping_stones", peak_seed=5, stones=spec)
    peaks = stepping_stones(cfg)
    per_chain = spec["stones"] + 1
    assert peaks.far == tuple(c * per_chain + spec["stones"] for c in range(spec["chains"]))
    heights = torch.linspace(cfg.stones.stone_quality_first, cfg.stones.stone_quality_last, spec["stones"])
    for c in range(spec["chains"]):
        chain = peaks.centres[c * per_chain : (c + 1) * per_chain].double()
        steps = torch.diff(torch.cat([torch.zeros(1, cfg.dim, dtype=torch.float64), chain]), dim=0)
        assert steps.norm(dim=1).tolist() == pytest.approx([1.5] * per_chain, abs=1e-5)
        turns = (steps[1:] * steps[:-1]).sum(dim=1) / 1.5**2  # cos of each turn
        assert turns.tolist() == pytest.approx([math.cos(0.5)] * spec["stones"], abs=1e-5)
        assert torch.allclose(peaks.quality[c * per_chain : c * per_chain + spec["stones"]], heights)
        assert peaks.width[c * per_chain + spec["stones"]] == 1.5 and peaks.quality[peaks.far[c]] == 2.0
    env = IdeaEnv(cfg)
    assert env.far_peaks == frozenset(peaks.far)
    # every far peak is a maximum of Q (its centre lies in its own basin); a stone may lie in
    # the next, higher stone's basin: the chain is a rising ridge
    centre_peaks = env.peak(env.peak_centres)
    assert all(int(centre_peaks[p]) == p for p in peaks.far)
    assert torch.equal(stepping_stones(cfg).centres, peaks.centres)
    assert not torch.equal(stepping_stones(cfg.model_copy(update={"peak_seed": 6})).centres, peaks.centres)


def test_quality_and_peak_is_one_evaluation_of_both():
    env = IdeaEnv(landscape="stepping_stones")
    ideas = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)) * 2
    quality, peak = env.quality_and_peak(ideas)
    assert torch.equal(quality, env.quality(ideas)) and torch.equal(peak, env.peak(ideas))
