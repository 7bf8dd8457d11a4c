"""Landscape families: where the idea environment's quality peaks are, how high and how wide.

A family is a function ``(env: EnvConfig) -> Peaks`` registered in
:data:`popgrpo.registry.LANDSCAPES` and named by ``env.landscape``; an *instance* of a family is
its draw at ``env.peak_seed`` (the instance index of a study). :class:`~popgrpo.envs.idea.IdeaEnv`
builds its quality ``Q(x) = max_i q_i·exp(−‖x − c_i‖² / (2 w_i²))`` from the peaks, whatever the
family; execution, noise, behaviour and complexity do not depend on it.

* ``peaks`` (:func:`gaussian_peaks`, the default): the main paper's landscape, 8 peaks on rays
  from the origin, higher ones farther out and wider.
* ``stepping_stones`` (:func:`stepping_stones`): narrow far peaks, each at the end of a chain of
  lower, overlapping stones that bends as it leaves the origin. In 16 dimensions an isotropic
  sampler centred at the origin lands within a peak's width of a centre ``r`` away with a
  probability that falls like ``exp(−r²/2σ²)`` times the ball's tiny volume, at every width ``σ``;
  a learner that climbs from stone to stone gets there.

``Peaks.far`` names the peaks a discovery question is about (the far, high ones; per-family).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from popgrpo.config import EnvConfig

__all__ = ["Peaks", "gaussian_peaks", "stepping_stones"]


@dataclass(frozen=True)
class Peaks:
    """A landscape's peaks: ``centres [n, d]``, heights ``quality [n]``, widths ``width [n]``
    (float32), and ``far``: the indices of the peaks a discovery study asks about."""

    centres: torch.Tensor
    quality: torch.Tensor
    width: torch.Tensor
    far: tuple[int, ...]


def _unit_directions(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """``[n, dim]`` uniform random unit vectors."""
    directions = rng.standard_normal((n, dim))
    return directions / np.linalg.norm(directions, axis=1, keepdims=True)


def gaussian_peaks(cfg: EnvConfig) -> Peaks:
    """``env.landscape=peaks``: the main paper's landscape (§5).

    Peak ``i`` of ``n_peaks`` has height ``quality_base + quality_step·i`` and width
    ``width_base + width_step·i``; its centre is ``r_i·u_i``, ``u_i`` a uniform random unit vector
    drawn from ``peak_seed`` and ``r_i`` evenly spaced from ``radius_min`` to ``radius_max``.
    ``far``: the upper half of the peaks (the higher, farther ones)."""
    dim, n_peaks = cfg.dim, cfg.n_peaks
    i = torch.arange(n_peaks, dtype=torch.float32)
    quality = cfg.quality_base + cfg.quality_step * i
    width = cfg.width_base + cfg.width_step * i
    rng = np.random.default_rng(cfg.peak_seed)
    directions = _unit_directions(rng, n_peaks, dim)
    radii = np.linspace(cfg.radius_min, cfg.radius_max, n_peaks)
    centres = torch.as_tensor(directions * radii[:, None], dtype=torch.float32)
    return Peaks(centres, quality, width, tuple(range(n_peaks // 2, n_peaks)))


def stepping_stones(cfg: EnvConfig) -> Peaks:
    """``env.landscape=stepping_stones``: ``chains`` chains of stones out of the origin, each ending
    in a narrow far peak (``env.stones`` holds the shape).

    Chain ``c`` starts at the origin and takes ``stones + 1`` steps of length ``spacing``; a stone
    sits at the end of each of the first ``stones`` steps and the chain's far peak at the end of
    the last. The first step goes along a random unit direction ``u_c``; each later step turns
    from the one before by the angle ``bend`` (radians) towards a random direction orthogonal to
    it, so a chain is a bent path, not a ray. Stone ``j`` (0-based) has height rising linearly
    from ``stone_quality_first`` to ``stone_quality_last`` and width ``stone_width``; the far
    peak has height ``far_quality`` and width ``far_width``. Peaks are numbered chain by chain,
    stones first, the far peak last; ``far`` lists the far peaks. Directions come from
    ``peak_seed`` alone."""
    spec, dim = cfg.stones, cfg.dim
    rng = np.random.default_rng(cfg.peak_seed)
    centres: list[np.ndarray] = []
    quality: list[float] = []
    width: list[float] = []
    far: list[int] = []
    rise = np.linspace(spec.stone_quality_first, spec.stone_quality_last, spec.stones) if spec.stones else []
    for _ in range(spec.chains):
        heading = _unit_directions(rng, 1, dim)[0]
        point = np.zeros(dim)
        for step in range(spec.stones + 1):
            if step:
                turn = rng.standard_normal(dim)
                turn -= turn.dot(heading) * heading
                turn /= np.linalg.norm(turn)
                heading = np.cos(spec.bend) * heading + np.sin(spec.bend) * turn
            point = point + spec.spacing * heading
            centres.append(point)
            if step < spec.stones:
                quality.append(float(rise[step]))
                width.append(spec.stone_width)
            else:
                far.append(len(centres) - 1)
                quality.append(spec.far_quality)
                width.append(spec.far_width)
    return Peaks(
        torch.as_tensor(np.stack(centres), dtype=torch.float32),
        torch.tensor(quality, dtype=torch.float32),
        torch.tensor(width, dtype=torch.float32),
        tuple(far),
    )
