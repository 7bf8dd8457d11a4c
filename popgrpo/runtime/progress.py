"""Member epochs counted as they finish, mid-round: what moves the progress bar per epoch.

A member actor answers once per round with its rows (one actor call per round), so a bar fed
by the rows moves once per round, and a long language-model round sits at 0 %. So each
finished member epoch is also counted: in this process by :class:`~popgrpo.runtime.executor.LocalExecutor`
itself, on Ray by :class:`EpochCounter`, a small actor that reserves no CPU. Member actors tell
it through an :class:`EpochReporter`, at most once a second and once at the end of each train
call, so a round of short epochs costs one call per actor and a long round one a second.
The driver reads the count from a thread of its own (``popgrpo.train``'s bar follower).
"""

from __future__ import annotations

import time
from typing import Any

import ray

__all__ = ["READ_TIMEOUT_S", "REPORT_EVERY_S", "EpochCounter", "EpochReporter", "read_counter"]

# The least time between two reports of one member actor, and between two reads by the driver.
REPORT_EVERY_S = 1.0
# How long the driver waits for the counter's answer before it tries again on the next read.
READ_TIMEOUT_S = 10.0


@ray.remote(num_cpus=0)
class EpochCounter:
    """Member epochs finished so far in this run, as the member actors report them."""

    def __init__(self) -> None:
        self.epochs = 0

    def add(self, n: int) -> None:
        self.epochs += n

    def count(self) -> int:
        return self.epochs


class EpochReporter:
    """A member actor's side: counts its finished member epochs and tells the counter at most
    every ``every_s`` seconds, and at :meth:`flush` (the end of its train call)."""

    def __init__(self, counter: Any, every_s: float = REPORT_EVERY_S) -> None:
        self.counter, self.every_s = counter, every_s
        self.pending = 0
        self.last = time.monotonic()

    def add(self, n: int) -> None:
        self.pending += n
        if time.monotonic() - self.last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.counter.add.remote(self.pending)  # fire and forget: the bar may lag, training never waits
            self.pending = 0
        self.last = time.monotonic()


def read_counter(counter: Any) -> int | None:
    """The counter's count; None when it does not answer in time (the bar then waits for the rows)."""
    try:
        return int(ray.get(counter.count.remote(), timeout=READ_TIMEOUT_S))
    except Exception:  # a lost or slow counter costs the bar its mid-round moves, not the run
        return None
