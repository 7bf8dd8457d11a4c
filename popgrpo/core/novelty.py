"""k-NN novelty over a rolling memory of ideas (MaxEnt-GRPO, main paper eq. 5)."""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import torch

__all__ = ["NoveltyMemory", "NoveltyState"]


class NoveltyState(TypedDict):
    """:meth:`NoveltyMemory.state_dict`: its size parameters and its ideas ``[n, d]`` oldest first."""

    capacity: int
    k: int
    ideas: np.ndarray


class NoveltyMemory:
    """A FIFO memory of past ideas that scores new ones by k-NN distance.

    ``score(x) = mean of the Euclidean distances from x to its k nearest ideas in memory``
    (eq. 5 without γ; the caller multiplies by the novelty coefficient). With fewer than
    ``k`` ideas stored the mean runs over those stored; an empty memory scores 0. Score a
    batch *before* adding it, so an idea is never its own neighbour.

    Args:
        capacity: ideas kept; the oldest are evicted first (512 in the paper).
        k: neighbours averaged (5 in the paper).
        dim: idea dimension; inferred from the first ``add`` when ``None``.
    """

    def __init__(self, capacity: int = 512, k: int = 5, dim: int | None = None) -> None:
        if capacity < 1 or k < 1:
            raise ValueError(f"capacity and k must be >= 1, got capacity={capacity}, k={k}")
        self.capacity = capacity
        self.k = k
        self._buffer: torch.Tensor | None = None if dim is None else torch.empty(capacity, dim)
        self._next = 0  # ring-buffer write position
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def ideas(self) -> torch.Tensor:
        """``[len, d]`` stored ideas, oldest first."""
        if self._buffer is None or self._size == 0:
            return torch.empty(0, 0 if self._buffer is None else self._buffer.shape[1])
        if self._size < self.capacity:
            return self._buffer[: self._size].clone()
        return torch.cat([self._buffer[self._next :], self._buffer[: self._next]]).clone()

    def score(self, ideas: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` ideas → ``[N]`` mean distance to their k nearest stored ideas."""
        ideas = ideas.detach().float()
        if self._size == 0 or self._buffer is None:
            return torch.zeros(ideas.shape[0])
        stored = self._buffer[: self._size] if self._size < self.capacity else self._buffer
        dist = torch.cdist(ideas, stored)
        k = min(self.k, self._size)
        return dist.topk(k, dim=1, largest=False).values.mean(dim=1)

    def add(self, ideas: torch.Tensor) -> None:
        """Append ``[N, d]`` ideas in order, evicting the oldest beyond capacity."""
        ideas = ideas.detach().float()
        if self._buffer is None:
            self._buffer = torch.empty(self.capacity, ideas.shape[1])
        if ideas.shape[0] >= self.capacity:  # only the newest `capacity` survive
            ideas = ideas[-self.capacity :]
        n = ideas.shape[0]
        first = min(n, self.capacity - self._next)
        self._buffer[self._next : self._next + first] = ideas[:first]
        self._buffer[: n - first] = ideas[first:]
        self._next = (self._next + n) % self.capacity
        self._size = min(self.capacity, self._size + n)

    def state_dict(self) -> NoveltyState:
        """Plain arrays, for checkpoints and for moving the memory between processes."""
        return {"capacity": self.capacity, "k": self.k, "ideas": self.ideas.numpy()}

    @classmethod
    def from_state_dict(cls, state: NoveltyState) -> NoveltyMemory:
        ideas = np.array(state["ideas"], dtype=np.float32)  # a copy: arrays from Ray are read-only
        memory = cls(int(state["capacity"]), int(state["k"]))
        if ideas.size:
            memory.add(torch.from_numpy(ideas))  # pyright: ignore[reportUnknownMemberType]  # torch: from_numpy is unannotated
        return memory
