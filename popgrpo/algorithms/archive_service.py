"""What a member asks of the archive and novelty memory, and the in-process implementation.

A member talks to an :class:`ArchiveService`. In one process it is a :class:`LocalArchive`
(one per member, or one shared by all); on Ray the archive actor wraps the very same class,
so the semantics cannot drift between executors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeAlias, TypedDict

import numpy as np
import torch

from popgrpo.core.archive import STATUS_IMPROVED, STATUS_NEW, ArchiveState, MapElitesArchive
from popgrpo.core.exploration import OutcomeCounts
from popgrpo.core.novelty import NoveltyMemory, NoveltyState

__all__ = ["ArchiveHandle", "ArchiveService", "EpochInserts", "LocalArchive", "LocalArchiveState", "StepResult"]

StepResult: TypeAlias = "tuple[np.ndarray, np.ndarray | None]"
"""What :meth:`ArchiveService.step` returns: ``[N]`` statuses and, with novelty, ``[N]`` novelty scores."""

ArchiveHandle: TypeAlias = Any
"""What :meth:`ArchiveService.submit` returns, opaque to the caller: the :data:`StepResult` itself
in-process, a Ray ``ObjectRef`` of it for a remote archive."""


class ArchiveService(Protocol):
    def step(
        self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray, keep: np.ndarray, novelty: bool
    ) -> StepResult:
        """One GRPO step's archive work, in one call (one round trip when remote).

        Inserts the ideas where ``keep`` is true (finite rewards) in order and returns ``[N]``
        statuses (2 new, 1 improved, 0 not stored or not kept). With ``novelty`` it also scores
        all ``[N, d]`` ideas against the memory and then adds them, returning ``[N]`` scores;
        otherwise ``None``.
        """
        ...

    def submit(
        self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray, keep: np.ndarray, novelty: bool
    ) -> ArchiveHandle:
        """Start :meth:`step` and return a handle for :meth:`result`: a remote archive sends the
        request now and lets the caller start the next one before waiting (packed members)."""
        ...

    def result(self, handle: ArchiveHandle) -> StepResult:
        """The ``step`` result of a :meth:`submit` handle."""
        ...

    def stats(self) -> dict[str, float]:
        """``coverage``, ``qd_score``, ``best_reward``, ``elites``."""
        ...

    def count(self, behaviours: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """Count the outcomes (archive cells) of the ideas where ``keep`` is true and return ``[N]``
        counts of each idea's cell, this batch included (0 where not kept): the outcome-count
        bonus's ``N(o)`` (:mod:`popgrpo.core.exploration`). A shared archive pools the counts of
        every member that calls it."""
        ...


class _GridAndMemory(TypedDict):
    archive: ArchiveState
    memory: NoveltyState


class LocalArchiveState(_GridAndMemory, total=False):
    """:meth:`LocalArchive.state_dict`: the grid's and the novelty memory's states, and the outcome counts."""

    outcomes: np.ndarray  # [cells] int64; absent (all zero) until something was counted


class LocalArchive:
    """A MAP-Elites grid (``grid``), a novelty memory (``memory``) and outcome counts per cell (``outcomes``), in this process."""

    def __init__(self, cells_per_dim: int = 10, novelty_capacity: int = 512, novelty_k: int = 5) -> None:
        self.grid = MapElitesArchive(cells_per_dim)
        self.memory = NoveltyMemory(novelty_capacity, novelty_k)
        self.outcomes = OutcomeCounts(self.grid.n_cells)

    def submit(
        self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray, keep: np.ndarray, novelty: bool
    ) -> StepResult:
        return self.step(behaviours, rewards, ideas, keep, novelty)  # in-process: done at once

    def result(self, handle: StepResult) -> StepResult:
        return handle

    def step(
        self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray, keep: np.ndarray, novelty: bool
    ) -> StepResult:
        statuses = np.zeros(len(keep), dtype=np.int64)
        if keep.any():
            statuses[keep] = self.grid.add(behaviours[keep], rewards[keep], ideas[keep])
        scores = None
        if novelty:
            ideas_t = torch.tensor(np.asarray(ideas), dtype=torch.float32)  # a copy: Ray's arrays are read-only
            scores = self.memory.score(ideas_t).numpy()
            self.memory.add(ideas_t)
        return statuses, scores

    def count(self, behaviours: np.ndarray, keep: np.ndarray) -> np.ndarray:
        counts = np.zeros(len(keep), dtype=np.int64)
        if keep.any():
            counts[keep] = self.outcomes.add(self.grid.cell_of(np.asarray(behaviours)[keep]))
        return counts

    def stats(self) -> dict[str, float]:
        return {
            "coverage": self.grid.coverage,
            "qd_score": self.grid.qd_score,
            "best_reward": self.grid.best_reward,
            "elites": float(len(self.grid)),
        }

    def state_dict(self) -> LocalArchiveState:
        state: LocalArchiveState = {"archive": self.grid.state_dict(), "memory": self.memory.state_dict()}
        if self.outcomes.total:  # only once something was counted: states without the bonus stay as they were
            state["outcomes"] = self.outcomes.state_dict()
        return state

    def load_state_dict(self, state: LocalArchiveState) -> None:
        self.grid = MapElitesArchive.from_state_dict(state["archive"])
        self.memory = NoveltyMemory.from_state_dict(state["memory"])
        self.outcomes = OutcomeCounts(self.grid.n_cells)
        if "outcomes" in state:
            self.outcomes.load_state_dict(state["outcomes"])


class EpochInserts:
    """A member's view of its archive: each step's insert sent at once, or held for the epoch's end.

    With ``deferred`` (no QD bonus and no novelty: no update needs the archive's answer) the
    archive only feeds the epoch's metrics, so :meth:`submit` keeps the step's ideas and
    :meth:`end_epoch` inserts the epoch's batches together, in step order. In-order statuses
    make that the same archive and the same new/improved counts as step by step (tested), for
    one insert, and one round trip to a remote archive, per epoch instead of one per step.

    ``behaviour`` maps ``[N, e]`` stored ideas to ``[N, 2]`` descriptors (the environment's).
    """

    def __init__(
        self, archive: ArchiveService, behaviour: Callable[[torch.Tensor], torch.Tensor], deferred: bool
    ) -> None:
        self.archive = archive
        self.behaviour = behaviour
        self.deferred = deferred
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @property
    def pending(self) -> int:
        """Batches waiting for the epoch's end."""
        return len(self._pending)

    def submit(
        self, features: torch.Tensor, rewards: torch.Tensor, finite: torch.Tensor, novelty: bool
    ) -> ArchiveHandle:
        """Send (or, deferred, keep) one step's ideas ``features [N, e]``, rewards and finite mask;
        returns the request's handle, or None when deferred."""
        if self.deferred:
            self._pending.append((features, rewards, finite))
            return None
        return self.archive.submit(
            self.behaviour(features).numpy(),
            rewards.reshape(-1).numpy(),
            features.numpy(),
            finite.reshape(-1).numpy(),
            novelty,
        )

    def result(self, handle: ArchiveHandle) -> StepResult | None:
        """``(statuses, novelty)`` for :meth:`submit`'s handle; None when the insert was deferred."""
        return None if handle is None else self.archive.result(handle)

    def end_epoch(self) -> tuple[int, int] | None:
        """Insert the epoch's held batches in one call: ``(new, improved)``; None when not deferred."""
        if not self.deferred:
            return None
        if not self._pending:
            return 0, 0
        features = torch.cat([f for f, _, _ in self._pending])
        statuses, _ = self.archive.step(
            self.behaviour(features).numpy(),
            torch.cat([r.reshape(-1) for _, r, _ in self._pending]).numpy(),
            features.numpy(),
            torch.cat([k.reshape(-1) for _, _, k in self._pending]).numpy(),
            False,
        )
        self._pending = []
        return int((statuses == STATUS_NEW).sum()), int((statuses == STATUS_IMPROVED).sum())

    def discard(self) -> None:
        """Forget held batches (an interrupted epoch, when the member's state is replaced)."""
        self._pending = []

    def stats(self) -> dict[str, float]:
        return self.archive.stats()
