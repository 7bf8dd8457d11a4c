"""The bowl: the idea environment's behaviour and complexity with a smooth, noiseless reward.

``R(x) = 10 + exp(-‖x‖² / d)``: every reward lies in (10, 11], far from anything the idea
environment pays, so a run's metrics show at a glance which environment it trained in.
"""

from __future__ import annotations

import torch

from popgrpo.envs.idea import IdeaEnv

OFFSET = 10.0


class BowlEnv:
    """An :class:`popgrpo.envs.Environment`: ``[N, d]`` ideas → ``[N]`` rewards, behaviours, complexities."""

    def __init__(self, config) -> None:
        self.landscape = IdeaEnv(config)  # behaviour and complexity come from the idea environment
        self.idea_dim = self.landscape.idea_dim
        self.behaviour_dim = self.landscape.behaviour_dim

    def reward(self, ideas: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        del generator  # noiseless
        return OFFSET + torch.exp(-ideas.pow(2).sum(-1) / self.idea_dim)

    def behaviour(self, ideas: torch.Tensor) -> torch.Tensor:
        return self.landscape.behaviour(ideas)

    def complexity(self, ideas: torch.Tensor) -> torch.Tensor:
        return self.landscape.complexity(ideas)


def bowl_env(config, device="cpu") -> BowlEnv:
    """The factory popgrpo calls for ``env.kind=bowl``: ``(EnvConfig, device) → environment``."""
    del device
    return BowlEnv(config)
