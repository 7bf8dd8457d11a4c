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
    def step(
        self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray, keep: np.ndarray, novelty: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One GRPO step's archive work, in one call (one round trip when remote).

        Inserts the ideas where ``keep`` is true (finite rewards) in order and returns ``[N]``
        statuses (2 new, 1 improved, 0 not stored or not kept). With ``novelty`` it also scores
        all ``[N, d]`` ideas against the memory and then adds them, returning ``[N]`` scores;
        otherwise ``None``.
        """

    def submit(self, behaviours, rewards, ideas, keep, novelty: bool):
        """Start :meth:`step` and return a handle for :meth:`result`: a remote archive sends the
        request now and lets the caller start the next one before waiting (packed members)."""

    def result(self, handle) -> tuple[np.ndarray, np.ndarray | None]:
        """The ``step`` result of a :meth:`submit` handle."""

    def stats(self) -> dict[str, float]:
        """``coverage``, ``qd_score``, ``best_reward``, ``elites``."""


class LocalArchive:
    """A MAP-Elites archive plus a novelty memory, in this process."""

    def __init__(self, cells_per_dim: int = 10, novelty_capacity: int = 512, novelty_k: int = 5) -> None:
        self.archive = MapElitesArchive(cells_per_dim)
        self.memory = NoveltyMemory(novelty_capacity, novelty_k)

    def submit(self, behaviours, rewards, ideas, keep, novelty: bool):
        return self.step(behaviours, rewards, ideas, keep, novelty)  # in-process: done at once

    def result(self, handle):
        return handle

    def step(self, behaviours, rewards, ideas, keep, novelty: bool):
        statuses = np.zeros(len(keep), dtype=np.int64)
        if keep.any():
            statuses[keep] = self.archive.add(behaviours[keep], rewards[keep], ideas[keep])
        scores = None
        if novelty:
            ideas_t = torch.tensor(np.asarray(ideas), dtype=torch.float32)  # a copy: Ray's arrays are read-only
            scores = self.memory.score(ideas_t).numpy()
            self.memory.add(ideas_t)
        return statuses, scores

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
