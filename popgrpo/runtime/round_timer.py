"""A wrapper around an executor that times what the driver does with it, round by round.

The simulator's calibration (:mod:`popgrpo.research.sim.measure`), the round-overhead benchmark and the
simulator's probe (``benchmarks/round_overhead.py``, ``benchmarks/sim_probe.py``) all wrap the
executor a run trains through in a :class:`RoundTimer` (``popgrpo.train.train``'s
``executor_factory``): every call to a timed method is recorded with its wall-clock interval and
the calling thread's CPU seconds inside it, a round starts at each ``train`` call, and at
``close`` the executor's own process accounting is read (:meth:`worker_pids`,
``epoch_cpu_seconds``: the public methods of both executors). Nothing here touches an
executor's private state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["Call", "RoundTimer"]


@dataclass(frozen=True)
class Call:
    """One executor call: its method, wall-clock interval (``time.perf_counter``) and the
    calling thread's CPU seconds inside it; ``round``: the round it was made in (-1: before the
    first ``train`` call)."""

    name: str
    start: float
    end: float
    cpu: float
    round: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


class RoundTimer:
    """Wraps ``inner`` (an executor); records its calls and where each round starts.

    ``timed``: the methods timed (None: every public method). A round starts at each call of a
    method in ``round_start`` (``train``: one synchronous round each); :attr:`starts` and
    :attr:`cpu_starts` hold each round's start (wall clock; the driver thread's CPU time) and,
    last, those of ``close``. ``mark(round)`` runs at each round's start, before its clock
    starts, and at close with ``None`` (after the close's clock reading): for a CPU sample that
    is not to count inside any call. :attr:`epoch_cpu` holds the executor's
    ``epoch_cpu_seconds()`` read at close, before the executor closes; :attr:`writer_cpu` the
    background writer's CPU seconds per round, where the caller records them.
    """

    def __init__(
        self,
        inner: Any,
        timed: Collection[str] | None = None,
        round_start: Collection[str] = ("train",),
        mark: Callable[[int | None], None] | None = None,
    ) -> None:
        self.inner = inner
        self.timed = None if timed is None else frozenset(timed)
        self.round_start = frozenset(round_start)
        self.mark = mark
        self.calls: list[Call] = []
        self.starts: list[float] = []
        self.cpu_starts: list[float] = []
        self.ends: list[float] = []  # when each round-starting call returned (a sync round's last report)
        self.epoch_cpu: list[list[float]] = []
        self.writer_cpu: list[float] = []
        self._pids: list[int] | None = None

    def worker_pids(self) -> list[int]:
        """The executor's :meth:`worker_pids` (member actors' pids; none in-process), asked once."""
        if self._pids is None:
            self._pids = list(self.inner.worker_pids())
        return self._pids

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or not callable(attr):
            return attr
        if self.timed is not None and name not in self.timed and name not in self.round_start:
            return attr
        return self.time(name, attr)

    def time(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped to record each call as a :class:`Call` named ``name`` (a round starts
        first when ``name`` is in ``round_start``)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            if name in self.round_start:
                if self.mark is not None:
                    self.mark(len(self.starts))
                self.starts.append(time.perf_counter())
                self.cpu_starts.append(time.thread_time())
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.calls.append(Call(name, start, end, time.thread_time() - cpu, len(self.starts) - 1))
                if name in self.round_start:
                    self.ends.append(end)

        return timed

    def close(self) -> None:
        self.starts.append(time.perf_counter())
        self.cpu_starts.append(time.thread_time())
        if self.mark is not None:
            self.mark(None)
        self.epoch_cpu = [list(per_call) for per_call in self.inner.epoch_cpu_seconds()]
        self.inner.close()

    # ---- what the calls add up to --------------------------------------------------------------
    @property
    def rounds(self) -> int:
        """Rounds started (``close`` not counted)."""
        return len(self.ends)

    def total(self, name: str, lo: float = float("-inf"), hi: float = float("inf")) -> float:
        """Seconds spent in calls ``name``, counting only what falls between ``lo`` and ``hi``."""
        return sum(max(0.0, min(c.end, hi) - max(c.start, lo)) for c in self.calls if c.name == name)

    def per_round(self, names: Collection[str] | None = None, cpu: bool = False) -> list[float]:
        """Per round started: the seconds inside calls (of ``names``; None: every timed call), or
        the calling thread's CPU seconds inside them (``cpu``)."""
        out = [0.0] * self.rounds
        for c in self.calls:
            if c.round >= 0 and (names is None or c.name in names):
                out[c.round] += c.cpu if cpu else c.seconds
        return out

    def round_calls(self) -> list[dict[str, float]]:
        """Per round started: seconds inside calls, by method."""
        out: list[dict[str, float]] = [{} for _ in range(self.rounds)]
        for c in self.calls:
            if c.round >= 0:
                out[c.round][c.name] = out[c.round].get(c.name, 0.0) + c.seconds
        return out

    def round_seconds(self) -> list[float]:
        """Wall time of each round, from its ``train`` call to the next (the last: to ``close``)."""
        return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]

    def report_periods(self) -> list[float]:
        """Wall time from each round's last report to the next round's: round 1's and on (each
        holds a merge, the adopt and the round's training).

        Unlike :meth:`round_seconds`, this does not depend on when the driver gets round to its
        ``train`` call: an actor's next train call is sent right behind its adopt
        (:func:`~popgrpo.runtime.scheduler.train_after_adopt`), so its members have been
        training for a while by then, for longer in some rounds than in others."""
        return [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]

    def driver_seconds(self) -> list[float]:
        """Per round: its wall time less the time inside executor calls."""
        return [r - i for r, i in zip(self.round_seconds(), self.per_round(), strict=False)]

    def driver_cpu_seconds(self) -> list[float]:
        """Per round: the driver thread's CPU seconds outside executor calls plus the background
        writer thread's for that round (:attr:`writer_cpu`; the driver's work in core-seconds,
        which waiting for a core on a busy machine does not inflate). The writer writes a round
        while the next one trains, inside an executor call: its CPU is read in its own thread."""
        rounds = [b - a for a, b in zip(self.cpu_starts, self.cpu_starts[1:], strict=False)]
        writer = self.writer_cpu + [0.0] * (len(rounds) - len(self.writer_cpu))
        inside = self.per_round(cpu=True)
        return [max(0.0, r - i) + w for r, i, w in zip(rounds, inside, writer, strict=False)]
