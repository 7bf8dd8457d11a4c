"""When a member actor that has not answered is taken as hung, from the times of the calls answered.

A stopped process (SIGSTOP, a frozen VM, a node swapping to a halt) does not die, so Ray
never reports it lost and a driver that waits for it waits forever. :class:`CallDeadlines`
derives a deadline from the measured round time instead: a ``train`` call of ``n`` epochs
is hung once it has taken more than ``factor × median seconds per epoch × n`` of the calls
answered so far (and never sooner than ``min_s``); any other call once it has taken ``min_s``,
except an actor's first call (:data:`UNTIMED`), which waits for its construction. Until some
``train`` call has been answered there is nothing to measure and no deadline.
"""

from __future__ import annotations

import statistics

__all__ = ["UNTIMED", "CallDeadlines"]

# An actor's first call waits for its construction (a language model loading, a node being
# provisioned): how long that takes says nothing about a hang.
UNTIMED = frozenset({"placement"})


class CallDeadlines:
    def __init__(self, factor: float, min_s: float) -> None:
        self.factor = factor
        self.min_s = min_s
        self.per_epoch: list[float] = []

    def answered(self, method: str, seconds: float, n_epochs: int = 1) -> None:
        """A call answered after ``seconds``; ``train`` calls set the measured time per epoch."""
        if method == "train" and n_epochs > 0:
            self.per_epoch.append(seconds / n_epochs)

    def limit(self, method: str, n_epochs: int = 1) -> float | None:
        """Seconds after which a call of ``method`` is hung; None: no deadline (yet)."""
        if method in UNTIMED:
            return None
        if method != "train":
            return self.min_s
        if not self.per_epoch:
            return None
        return max(self.min_s, self.factor * statistics.median(self.per_epoch) * n_epochs)
