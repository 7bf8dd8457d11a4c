"""The simulated idea-generation environment of the main paper (§3, §5)."""

from __future__ import annotations

import math
from typing import Any

import torch

from popgrpo.config import EnvConfig
from popgrpo.envs.landscapes import Peaks
from popgrpo.registry import LANDSCAPES

__all__ = ["IdeaEnv"]


class IdeaEnv:
    """Ideas are vectors in R^d; executing one succeeds with a probability that falls with
    its complexity, and pays its quality plus noise when it does.

    What the paper fixes (§3, §5):
        * ``d = 16``; 8 quality peaks, peak ``i`` with maximum quality ``0.5 + 0.3·i`` and
          width ``2.0 + 0.5·i``.
        * ``p_exec(x) = clip(1 / (1 + λ‖x‖), 0.05, 0.95)`` (eq. 2).
        * ``R(x) = Q(x)·B + ε·B`` with ``B ~ Bernoulli(p_exec(x))`` and ``ε ~ N(0, 0.3²)``.
        * behaviour ``b(x) = (sigmoid(‖x‖ − 3), atan2(x[1], x[0]) / 2π + 0.5)``.
        * complexity ``‖x‖``.

    Where the peaks are is the landscape family's (``env.landscape``,
    :mod:`popgrpo.envs.landscapes`); the paper's, described below, is the default ``peaks``.
    ``far_peaks`` names the peaks a discovery study asks about (the family says which).

    What the paper leaves open, and what we chose (fixed before comparing methods, the
    same for every method; all are fields of ``env`` in the config):
        * **Peak shape**: Gaussian bumps, ``Q(x) = max_i q_i · exp(−‖x − c_i‖² / (2 w_i²))``
          (``max``, not a sum, so each region has one identifiable best peak).
        * **Peak centres**: ``c_i = r_i · u_i`` with ``u_i`` uniform random unit vectors drawn
          from ``peak_seed`` (independent of the training seed, so every run and method
          faces the same landscape) and radii ``r_i`` evenly spaced from ``radius_min`` to
          ``radius_max``. Better peaks lie farther out: higher ceilings need more complex
          ideas, which is the paper's premise.
        * **λ = exec_lambda**: set so that the *expected* reward ``q_i · p_exec(c_i)`` falls
          with ``i`` while the *maximum* reward ``q_i`` rises. Expected-reward maximisation
          (GRPO) therefore drifts to the simple, reliable peaks and shrinks its spread —
          diversity and complexity fall — while discovery needs the far peaks.
    """

    behaviour_dim = 2

    # The paper's execution-probability clip (eq. 2); not a config field.
    P_EXEC_MIN, P_EXEC_MAX = 0.05, 0.95

    def __init__(self, config: EnvConfig | None = None, /, **fields: Any) -> None:
        """The landscape of ``config`` (an :class:`~popgrpo.config.EnvConfig`; its defaults when
        None), with any field overridden by keyword, e.g. ``IdeaEnv(exec_lambda=0.5)``. Every
        constant of the landscape is set once, in the config's field defaults."""
        base = config.model_dump(exclude={"kind", "text"}) if config is not None else {}
        cfg = EnvConfig(**{**base, **fields})
        self.idea_dim = cfg.dim
        self.exec_lambda = cfg.exec_lambda
        self.p_exec_min, self.p_exec_max = self.P_EXEC_MIN, self.P_EXEC_MAX
        self.noise_std = cfg.noise_std
        peaks: Peaks = LANDSCAPES.get(cfg.landscape)(cfg)
        self.peak_quality, self.peak_width, self.peak_centres = peaks.quality, peaks.width, peaks.centres
        self.far_peaks = frozenset(peaks.far)

    def quality(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` noiseless quality ``Q(x)``."""
        return self._bumps(ideas).max(dim=1).values

    def peak(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` int64: the peak whose bump gives ``Q(x)`` (the basin ``x`` lies in).

        Its height is ``peak_quality[peak(x)]``, and ``Q(x) = q_p·exp(−‖x − c_p‖² / (2 w_p²))``
        for ``p = peak(x)``: how close ``x`` is to the top of its own peak (the discovery
        metrics of :mod:`popgrpo.core.discovery`)."""
        return self._bumps(ideas.detach()).argmax(dim=1)

    def quality_and_peak(self, ideas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`quality` and :meth:`peak` of ``ideas [N, d]`` from one evaluation of the bumps."""
        best = self._bumps(ideas.detach()).max(dim=1)
        return best.values, best.indices

    def _bumps(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N, peaks]``: each peak's Gaussian bump at each idea."""
        sq_dist = torch.cdist(ideas, self.peak_centres).pow(2)
        return self.peak_quality * torch.exp(-sq_dist / (2.0 * self.peak_width.pow(2)))

    def p_exec(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` execution success probability (eq. 2)."""
        p = 1.0 / (1.0 + self.exec_lambda * ideas.norm(dim=1))
        return p.clamp(self.p_exec_min, self.p_exec_max)

    def expected_reward(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` noise-free expected reward ``E[R(x)] = Q(x)·p_exec(x)`` (the
        control reward of a run trained on a learned proxy, without the execution noise)."""
        ideas = ideas.detach()
        return self.quality(ideas) * self.p_exec(ideas)

    def reward(self, ideas: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` stochastic execution reward ``Q·B + ε·B``."""
        return self.execute(ideas, generator)[0]

    def execute(
        self, ideas: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[N, d]`` → ``([N] reward Q·B + ε·B, [N] its expectation Q·p_exec, [N] bool B)``
        from one evaluation of ``Q`` and ``p_exec`` (a step logs all three; the draws are
        :meth:`reward`'s)."""
        ideas = ideas.detach()
        quality, p_exec = self.quality(ideas), self.p_exec(ideas)
        success = torch.bernoulli(p_exec, generator=generator)
        noise = self.noise_std * torch.randn(ideas.shape[0], generator=generator)
        return (quality + noise) * success, quality * p_exec, success.bool()

    def behaviour(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N, 2]``: (complexity squashed to (0, 1), direction in [0, 1])."""
        ideas = ideas.detach()
        squashed_norm = torch.sigmoid(ideas.norm(dim=1) - 3.0)
        angle = torch.atan2(ideas[:, 1], ideas[:, 0]) / (2.0 * math.pi) + 0.5
        return torch.stack([squashed_norm, angle], dim=1)

    def complexity(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N]`` L2 norm."""
        return ideas.detach().norm(dim=1)
