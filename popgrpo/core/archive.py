"""MAP-Elites archive over behaviour space (QD-GRPO, main paper §4.1).

The grid (:class:`Grid`) follows pyribs' :class:`ribs.archives.GridArchive` conventions
exactly: the same cell of a behaviour (``int32`` of ``(cells · (b − low) + 1e-6) / (high −
low)``, clipped to the edge cells), one elite per cell, the highest objective of a batch per
cell (the first on ties) stored where it beats the cell's elite. ``tests/core/test_archive.py``
checks it against pyribs' own grid on random batches. It is a few numpy arrays rather than
pyribs itself because importing ``ribs`` imports every archive type it has (sklearn, scipy,
pandas, numpy_groupies): about 1.9 s of CPU in every member actor's start, for a grid popgrpo
uses three methods of (docs/reference/dependencies.md).

One thing a grid's batch ``add`` does differently from what QD-GRPO needs: it computes every
status against the archive as it was *before* the batch (two ideas opening the same cell both
get "new"). QD-GRPO rewards ideas one by one (Algorithm 1), so a later idea in a batch must
see the earlier ones. We compute those in-order statuses here, exactly and vectorised, and
hand the grid only the ideas that were stored; its per-cell argmax (first one on ties) then
leaves the same elites a one-by-one insertion would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["STATUS_IMPROVED", "STATUS_NEW", "STATUS_NOT_ADDED", "ArchiveState", "Grid", "MapElitesArchive"]

STATUS_NOT_ADDED = 0
STATUS_IMPROVED = 1
STATUS_NEW = 2


class ArchiveState(TypedDict):
    """:meth:`MapElitesArchive.state_dict`: the grid's shape and its elites (see :meth:`~MapElitesArchive.elites`)."""

    cells_per_dim: int
    ranges: tuple[tuple[float, float], ...]
    cell: np.ndarray
    behaviour: np.ndarray
    reward: np.ndarray
    idea: np.ndarray


# What pyribs' GridArchive adds before truncating a scaled behaviour to its cell (its
# ``epsilon``), so that a value on a cell boundary lands in the cell above despite rounding.
GRID_EPSILON = 1e-6


class Grid:
    """One elite per cell of a regular grid over behaviour space: pyribs' ``GridArchive``
    conventions (see the module docstring), in float64.

    Args:
        dims: cells along each behaviour axis.
        ranges: ``(low, high)`` per axis.
        solution_dim: dimension of the stored ideas.
    """

    def __init__(self, dims: Sequence[int], ranges: Sequence[tuple[float, float]], solution_dim: int) -> None:
        self.dims = np.asarray(dims, dtype=np.int32)
        self.lower = np.asarray([lo for lo, _ in ranges], dtype=np.float64)
        self.interval = np.asarray([hi for _, hi in ranges], dtype=np.float64) - self.lower
        n_cells = int(np.prod(self.dims))
        self.occupied = np.zeros(n_cells, dtype=bool)
        self.objective = np.zeros(n_cells, dtype=np.float64)
        self.measures = np.zeros((n_cells, len(self.dims)), dtype=np.float64)
        self.solution = np.zeros((n_cells, int(solution_dim)), dtype=np.float64)

    def index_of(self, measures: ArrayLike) -> np.ndarray:
        """``[N, B]`` behaviours → ``[N]`` flat cell indices (``int32``; edge cells for outside values)."""
        measures = np.asarray(measures, dtype=np.float64)
        if measures.ndim != 2 or measures.shape[1] != len(self.dims):
            raise ValueError(f"behaviours must have shape [N, {len(self.dims)}], got {measures.shape}")
        if not np.all(np.isfinite(measures)):
            raise ValueError("behaviours must be finite")
        scaled: NDArray[np.int32] = ((self.dims * (measures - self.lower) + GRID_EPSILON) / self.interval).astype(
            np.int32
        )
        cells: NDArray[np.int32] = np.minimum(np.maximum(scaled, 0), self.dims - 1)
        flat = np.ravel_multi_index(tuple(cells[:, axis] for axis in range(cells.shape[1])), tuple(self.dims.tolist()))
        return np.asarray(flat, dtype=np.int32)

    def add(self, solutions: np.ndarray, objectives: np.ndarray, measures: np.ndarray) -> None:
        """Store, per cell, the batch's highest objective (the first on ties) where the cell is
        empty or it beats the cell's elite."""
        cells = self.index_of(measures).astype(np.int64)
        objectives = np.asarray(objectives, dtype=np.float64)
        # Per cell, the first index of the batch's maximum: sort by (cell, -objective, position).
        order = np.lexsort((np.arange(len(cells)), -objectives, cells))
        first = np.ones(len(order), dtype=bool)
        first[1:] = cells[order][1:] != cells[order][:-1]
        best = order[first]
        cell = cells[best]
        wins = ~self.occupied[cell] | (objectives[best] > self.objective[cell])
        best, cell = best[wins], cell[wins]
        self.occupied[cell] = True
        self.objective[cell] = objectives[best]
        self.measures[cell] = np.asarray(measures, dtype=np.float64)[best]
        self.solution[cell] = np.asarray(solutions, dtype=np.float64)[best]

    def __len__(self) -> int:
        return int(np.count_nonzero(self.occupied))

    @property
    def empty(self) -> bool:
        return not self.occupied.any()

    @property
    def coverage(self) -> float:
        return len(self) / len(self.occupied)

    def cells(self) -> np.ndarray:
        """The occupied cells, in increasing order (``int64``)."""
        return np.flatnonzero(self.occupied).astype(np.int64)


class MapElitesArchive:
    """A grid of ``cells_per_dim ** len(ranges)`` cells, each holding its best idea.

    Args:
        cells_per_dim: cells along each behaviour axis (K = 10 in the paper).
        ranges: ``(low, high)`` per behaviour axis; values outside go to the edge cell.
        idea_dim: dimension of stored ideas; inferred from the first ``add`` when ``None``.
    """

    def __init__(
        self,
        cells_per_dim: int = 10,
        ranges: Sequence[tuple[float, float]] = ((0.0, 1.0), (0.0, 1.0)),
        idea_dim: int | None = None,
    ) -> None:
        if cells_per_dim < 1:
            raise ValueError(f"cells_per_dim must be >= 1, got {cells_per_dim}")
        self.cells_per_dim = int(cells_per_dim)
        self.ranges = tuple((float(lo), float(hi)) for lo, hi in ranges)
        for lo, hi in self.ranges:
            if not hi > lo:
                raise ValueError(f"each range needs high > low, got {self.ranges}")
        self._grid: Grid | None = None
        if idea_dim is not None:
            self._grid = self._make_grid(idea_dim)

    def _make_grid(self, idea_dim: int) -> Grid:
        return Grid([self.cells_per_dim] * len(self.ranges), self.ranges, int(idea_dim))

    @property
    def n_cells(self) -> int:
        return self.cells_per_dim ** len(self.ranges)

    def cell_of(self, behaviours: np.ndarray) -> np.ndarray:
        """``[N, B]`` behaviours → ``[N]`` flat cell indices (edge cells for outside values)."""
        grid = self._grid or self._make_grid(1)
        return grid.index_of(np.asarray(behaviours, dtype=np.float64))

    def add(self, behaviours: ArrayLike, rewards: ArrayLike, ideas: ArrayLike) -> np.ndarray:
        """Insert a batch in order; return one status per idea.

        Args:
            behaviours: ``[N, B]`` behaviour descriptors (numpy arrays, torch tensors or lists).
            rewards: ``[N]`` finite rewards (the caller drops NaN/inf first).
            ideas: ``[N, d]`` the ideas themselves.

        Returns:
            ``int`` array ``[N]``: 2 = opened an empty cell, 1 = beat the cell's elite
            (strictly), 0 = not stored. Idea ``i`` is judged against the archive plus ideas
            ``0..i-1`` of this batch.
        """
        behaviours = _as_numpy(behaviours)
        rewards = np.reshape(_as_numpy(rewards), -1)
        ideas = _as_numpy(ideas)
        n = rewards.shape[0]
        if behaviours.shape[0] != n or ideas.shape[0] != n:
            raise ValueError(
                f"batch sizes differ: behaviours {behaviours.shape}, rewards {rewards.shape}, ideas {ideas.shape}"
            )
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if not np.all(np.isfinite(rewards)):
            raise ValueError("archive rewards must be finite; filter NaN/inf before adding")
        if self._grid is None:
            self._grid = self._make_grid(ideas.shape[1])

        cells = self._grid.index_of(behaviours)
        occupied, elite_reward = _elite_rewards(self._grid, cells)
        status = _in_order_status(cells, rewards, occupied, elite_reward)

        stored = status > STATUS_NOT_ADDED
        if stored.any():
            self._grid.add(ideas[stored], rewards[stored], behaviours[stored])
        return status

    # ---- statistics -------------------------------------------------------------------
    @property
    def coverage(self) -> float:
        """Fraction of cells holding an elite, in [0, 1]."""
        return 0.0 if self._grid is None else self._grid.coverage

    @property
    def qd_score(self) -> float:
        """Sum of the elites' rewards, summed in cell order.

        Not a running total: that would depend on the insertion history in its last bits, and
        an archive restored from a checkpoint must report exactly the same number.
        """
        return float(np.sum(self.elites()["reward"]))

    @property
    def best_reward(self) -> float:
        """Highest elite reward; ``-inf`` when empty."""
        if self._grid is None or self._grid.empty:
            return float("-inf")
        return float(self._grid.objective[self._grid.occupied].max())

    def __len__(self) -> int:
        return 0 if self._grid is None else len(self._grid)

    def elites(self) -> dict[str, np.ndarray]:
        """The elites as arrays: ``cell [E]``, ``behaviour [E, B]``, ``reward [E]``, ``idea [E, d]``.

        Sorted by cell index, so two archives with the same elites export identically.
        """
        if self._grid is None or self._grid.empty:
            b = len(self.ranges)
            return {
                "cell": np.zeros(0, dtype=np.int64),
                "behaviour": np.zeros((0, b)),
                "reward": np.zeros(0),
                "idea": np.zeros((0, 0)),
            }
        cells = self._grid.cells()
        return {
            "cell": cells,
            "behaviour": self._grid.measures[cells],
            "reward": self._grid.objective[cells],
            "idea": self._grid.solution[cells],
        }

    def heatmap(self) -> np.ndarray:
        """``[cells_per_dim, cells_per_dim]`` elite rewards (NaN where empty); 2-D archives only."""
        return state_heatmap(self.state_dict())

    # ---- persistence ------------------------------------------------------------------
    def state_dict(self) -> ArchiveState:
        e = self.elites()
        return {
            "cells_per_dim": self.cells_per_dim,
            "ranges": self.ranges,
            "cell": e["cell"],
            "behaviour": e["behaviour"],
            "reward": e["reward"],
            "idea": e["idea"],
        }

    @classmethod
    def from_state_dict(cls, state: ArchiveState) -> MapElitesArchive:
        archive = cls(state["cells_per_dim"], state["ranges"])
        if len(state["reward"]):
            archive.add(state["behaviour"], state["reward"], state["idea"])
        return archive


def _elite_rewards(grid: Grid, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[N]`` cell indices → whether each cell holds an elite, and its reward (−inf where not)."""
    occupied = grid.occupied[cells]
    return occupied, np.where(occupied, grid.objective[cells], -np.inf)


def state_heatmap(state: ArchiveState) -> np.ndarray:
    """:meth:`MapElitesArchive.heatmap` of a ``state_dict()``, read from its cells and rewards
    without rebuilding the archive. Raises ValueError unless the behaviour space is 2-D."""
    if len(state["ranges"]) != 2:
        raise ValueError("heatmap needs a 2-D behaviour space")
    cells = int(state["cells_per_dim"])
    grid = np.full(cells * cells, np.nan)
    grid[np.asarray(state["cell"], dtype=np.int64)] = state["reward"]
    return np.reshape(grid, (cells, cells))


def _in_order_status(
    cells: np.ndarray, rewards: np.ndarray, occupied: np.ndarray, elite_reward: np.ndarray
) -> np.ndarray:
    """Statuses of a one-by-one insertion, computed without a Python loop.

    Ideas are grouped by cell (stable, so batch order is kept inside a cell). Within a
    cell, idea i is stored iff its reward beats both the pre-batch elite and every earlier
    batch idea of that cell. The running maximum over earlier ideas is taken on integer
    dense ranks offset by the cell's segment number, so it is exact (no float tricks) and
    restarts at each cell.
    """
    n = int(rewards.shape[0])
    order = np.lexsort((np.arange(n), cells))
    sorted_cells = cells[order]
    first = np.ones(n, dtype=bool)
    first[1:] = sorted_cells[1:] != sorted_cells[:-1]
    segment = np.cumsum(first) - 1
    _, rank = np.unique(rewards[order], return_inverse=True)  # equal rewards, equal rank
    key = segment * (n + 1) + rank + 1
    running = np.maximum.accumulate(key)
    previous = np.empty(n, dtype=key.dtype)
    previous[0] = 0
    previous[1:] = running[:-1]
    prev_rank = np.where(first, -1, previous - segment * (n + 1) - 1)

    r = rewards[order]
    beats_batch = rank > prev_rank
    beats_elite = r > elite_reward[order]
    status_sorted = np.zeros(n, dtype=np.int64)
    opens = first & ~occupied[order]
    status_sorted[opens] = STATUS_NEW
    improves = ~opens & beats_batch & beats_elite
    status_sorted[improves] = STATUS_IMPROVED
    status = np.empty(n, dtype=np.int64)
    status[order] = status_sorted
    return status


def _as_numpy(x: Any) -> NDArray[np.float64]:
    """A numpy array, a torch tensor or nested lists as a float64 array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)
