"""What a member asks of the archive and novelty memory, and the in-process implementation.

A member talks to an :class:`ArchiveService`. In one process it is a :class:`LocalArchive`
(one per member, or one shared by all); on Ray the archive actor wraps the very same class,
so the semantics cannot drift between executors.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from popgrpo.core.archive import MapElitesArchive
from popgrpo.core.novelty import NoveltyMemory

__all__ = ["ArchiveService", "LocalArchive"]


class ArchiveService(Protocol):
    def update(self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray) -> np.ndarray:
        """Insert a batch in order; ``[N]`` statuses (2 new, 1 improved, 0 not stored)."""

    def novelty(self, ideas: np.ndarray) -> np.ndarray:
        """Score ``[N, d]`` ideas against the memory, then add them; ``[N]`` scores."""

    def stats(self) -> dict[str, float]:
        """``coverage``, ``qd_score``, ``best_reward``, ``elites``."""


class LocalArchive:
    """A MAP-Elites archive plus a novelty memory, in this process."""

    def __init__(self, cells_per_dim: int = 10, novelty_capacity: int = 512, novelty_k: int = 5) -> None:
        self.archive = MapElitesArchive(cells_per_dim)
        self.memory = NoveltyMemory(novelty_capacity, novelty_k)

    def update(self, behaviours, rewards, ideas) -> np.ndarray:
        return self.archive.add(behaviours, rewards, ideas)

    def novelty(self, ideas) -> np.ndarray:
        ideas_t = torch.as_tensor(np.asarray(ideas), dtype=torch.float32)
        scores = self.memory.score(ideas_t)
        self.memory.add(ideas_t)
        return scores.numpy()

    def stats(self) -> dict[str, float]:
        return {
            "coverage": self.archive.coverage,
            "qd_score": self.archive.qd_score,
            "best_reward": self.archive.best_reward,
            "elites": float(len(self.archive)),
        }

    def state_dict(self) -> dict:
        return {"archive": self.archive.state_dict(), "memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.archive = MapElitesArchive.from_state_dict(state["archive"])
        self.memory = NoveltyMemory.from_state_dict(state["memory"])
