"""What each part of a round costs, as measured on a machine: the simulator's inputs.

Every cost is a line ``a + b·x`` in seconds (:class:`Linear`), with ``x`` the quantity the
part scales with: bytes moved, members merged, members in the population. The numbers come
from :mod:`popgrpo.research.sim.measure`, which times the real calls (a member's epoch, a Ray actor
round trip, moving a state dict through the object store, the merge, the driver's per-round
writes) on the machine it runs on, and are saved as JSON so that a simulation can be re-run
anywhere. Nothing here imports Ray or torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["CostModel", "Linear"]


@dataclass(frozen=True)
class Linear:
    """``a + b·x`` seconds."""

    a: float = 0.0
    b: float = 0.0

    def __call__(self, x: float) -> float:
        return self.a + self.b * x

    @classmethod
    def through(cls, x0: float, y0: float, x1: float, y1: float, rising: bool = True) -> Linear:
        """The line through two measurements. ``rising`` (costs): the slope is clipped at 0, so noise
        cannot make a cost fall, and the intercept at 0; without it (shares, which may fall) neither is."""
        b = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        if not rising:
            return cls(a=y0 - b * x0, b=b)
        b = max(0.0, b)
        return cls(a=max(0.0, y0 - b * x0), b=b)


@dataclass(frozen=True)
class CostModel:
    """Seconds per part of a round; see the module docstring for where each comes from.

    ``epoch_s`` is one member's epoch on one core with nothing else running. ``call_s`` is a
    Ray actor call's round trip with no payload. ``fetch_s(bytes)`` moves one state dict from
    an actor to the driver (``get_weights``), ``adopt_s(bytes)`` sends the merged state dict to
    an actor and has it adopt it (object-store fetch plus the member's mutation), ``merge_s(M)``
    is the merge of ``M`` state dicts of ``weight_bytes`` each on the driver, ``driver_s(K)``
    the driver's other per-round work for ``K`` members (selection, snapshot, metrics, lineage,
    checkpoint, the loggers' population series), ``logged_member_s`` the loggers' extra work
    per round for each member with series of its own (``run.logged_members`` of them,
    ``logged_members``; None: every member), ``start_s`` an actor's start-up (a restart after
    a loss). :meth:`driver_cost` adds the two. ``driver_s`` is measured with a checkpoint every
    round; ``checkpoint_s + checkpoint_member_s · K`` is the part of it the checkpoint takes
    (every member's state, the archives), which a round without one (``run.checkpoint_every``)
    does not spend; ``checkpoint_link_s`` is the checkpoint's work for a member whose state
    is the one it saved last (a hard link instead of a new file).

    What sharing a node's cores costs, each a function of ``x``, the member actors per core
    on the node, measured with ``x`` actors training at once (:mod:`popgrpo.research.sim.measure`):
    ``contention(x)`` multiplies ``epoch_s`` (an epoch's CPU time inside an actor among
    others over its CPU time alone: time-slicing, caches); ``actor_call_cpu_s`` is an actor's
    CPU per ``train`` call outside its epochs (Ray's worker threads, live metrics);
    ``ray_share(x)`` is the share of the node's cores taken by Ray's own processes and the
    driver while the actors train (raylet, GCS, agents, idle workers, the driver's polling);
    ``background_share(x)`` the share taken by everything else on the machine (other users).
    A core's work then takes ``1 / (1 - ray_share - background_share)`` times as long, the
    driver's alone between rounds as much as a round's actors': on Linux with autogroup
    scheduling (``/proc/sys/kernel/sched_autogroup_enabled`` = 1) the cores' time is shared
    between sessions, not between tasks, so the run's share hardly depends on how many of
    its tasks are runnable.
    """

    epoch_s: float
    weight_bytes: int
    call_s: float = 0.0
    fetch_s: Linear = field(default_factory=Linear)
    adopt_s: Linear = field(default_factory=Linear)
    merge_s: Linear = field(default_factory=Linear)
    driver_s: Linear = field(default_factory=Linear)
    logged_member_s: float = 0.0
    logged_members: int | None = None
    checkpoint_s: float = 0.0
    checkpoint_member_s: float = 0.0
    checkpoint_link_s: float = 0.0
    start_s: float = 0.0
    contention: Linear = field(default_factory=lambda: Linear(1.0, 0.0))
    actor_call_cpu_s: float = 0.0
    ray_share: Linear = field(default_factory=Linear)
    background_share: Linear = field(default_factory=Linear)
    machine: str = ""  # where it was measured, free text

    def driver_cost(
        self, members: int, checkpoint: bool = True, checkpointed: int | None = None, linked: int = 0
    ) -> float:
        """The driver's per-round work (CPU seconds, on its writer thread) for the rows of ``members``
        members and, with ``checkpoint``, a checkpoint serialising ``checkpointed`` members' states
        (default: the same members) and linking ``linked`` more from the checkpoint before (an
        async merge's checkpoint holds every member's restore point; those not renewed since the
        last one are linked); without it (``run.checkpoint_every`` skips this round's), the
        checkpoint's part is not spent."""
        logged = members if self.logged_members is None else min(members, self.logged_members)
        cost = self.driver_s(members) + self.logged_member_s * logged
        own = self.checkpoint_s + self.checkpoint_member_s * members  # in driver_s: measured with one
        if not checkpoint:
            cost -= own
        else:
            if checkpointed is not None:
                cost += self.checkpoint_member_s * (checkpointed - members)
            cost += self.checkpoint_link_s * linked
        return max(0.0, cost)

    def core_speed(self, actors_per_core: float) -> float:
        """The share of a node's cores left to the run with ``actors_per_core`` actors (at least 5%)."""
        taken = max(0.0, self.ray_share(actors_per_core)) + max(0.0, self.background_share(actors_per_core))
        return max(0.05, 1.0 - taken)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostModel:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown cost fields: {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            kwargs[name] = Linear(**value) if isinstance(value, dict) else value
        return cls(**kwargs)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls.from_json(json.loads(Path(path).read_text()))
