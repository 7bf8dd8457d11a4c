"""Ending a run on SIGTERM or SIGINT (Ctrl-C): the first signal stops cleanly, a second at once.

The first signal abandons the round in progress: :class:`RunInterrupted` is raised where the
run is, the run's ``finally`` blocks shut the actors and an embedded Ray down, and the run
directory keeps every round already checkpointed (a resumed run recomputes the abandoned
round from the last checkpoint, with the same numbers). One exception: while a round's
results are being written (:func:`deferred`, around the metrics, lineage, loggers and
checkpoint of a round that has trained and merged), the signal waits until they are all
written, so a round whose writing has begun ends checkpointed. A second signal, while the first stop is under
way, ends the process at once (``os._exit``) after one line on stderr; checkpoints are
written atomically, so even then the last one is intact.

Signal handlers belong to the process, so the installed :class:`StopOnSignal` is a module
global: the round loop asks :func:`deferred` without being handed anything, and does nothing
special when no handler is installed (a library caller, a test).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from types import FrameType
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["SIGNALS", "RunInterrupted", "StopOnSignal", "deferred", "deferring", "exit_status", "reinstall"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number (SIGTERM 143, SIGINT 130)."""
    return 128 + int(signum)


class RunInterrupted(KeyboardInterrupt):
    """A signal asked the run to stop.

    A KeyboardInterrupt, for two reasons: an ``except Exception`` on the way up (a retry, a
    fault handler) must not swallow it, and Ray's blocking calls (``ray.get``, ``ray.wait``)
    run Python's signal handlers while they wait and turn a KeyboardInterrupt raised there
    into their own plain ``KeyboardInterrupt`` (any other exception would be lost inside
    Ray). So the signal's number is kept in :attr:`StopOnSignal.received` as well.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class StopOnSignal:
    """A context manager that turns SIGTERM and SIGINT into :class:`RunInterrupted` (first)
    and an immediate exit (second), and restores the previous handlers on exit.

    ``last_words(signum)``: the line printed before the immediate exit. ``hard_exit`` is
    ``os._exit`` (a test may pass another). Off the main thread, where Python cannot set
    handlers, it does nothing.
    """

    def __init__(
        self,
        last_words: Callable[[int], str] = lambda signum: "",
        hard_exit: Callable[[int], Any] = os._exit,
    ) -> None:
        self.last_words = last_words
        self.hard_exit = hard_exit
        self.received: int | None = None  # the first signal, once one came
        self._depth = 0  # nesting of deferred() blocks
        self._pending = False  # a first signal came inside a deferred() block
        self._previous: dict[int, Any] = {}

    # ---- installing -----------------------------------------------------------------------
    def install(self) -> None:
        """Set the handlers (again: ``ray.init`` sets a SIGTERM handler of its own, so the
        driver calls this once Ray is up)."""
        global _active
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)
        _active = self

    def restore(self) -> None:
        global _active
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if _active is self:
            _active = None

    def __enter__(self) -> StopOnSignal:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        # After a stop the handlers stay: the process is ending, and a second signal during
        # its last steps (Ray's exit handlers) must still end it at once, with its line.
        if self.received is None:
            self.restore()

    # ---- the handler ------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # the second signal: no more waiting
            line = self.last_words(signum)
            if line:
                os.write(2, (line + "\n").encode())
            self.hard_exit(exit_status(signum))
            return
        self.received = signum
        if self._depth:
            self._pending = True  # raised when the block ends
            return
        raise RunInterrupted(signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside the block a first signal waits; it is raised when the block ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._pending and not self._depth:
                self._pending = False
                assert self.received is not None
                raise RunInterrupted(self.received)


_active: StopOnSignal | None = None


def reinstall() -> None:
    """Give SIGTERM and SIGINT back to the installed handler, if any: ``ray.init`` sets its own
    SIGTERM handler (exit 1 without a word), and :func:`popgrpo.runtime.cluster.connect`
    calls this right after it."""
    if _active is not None:
        _active.install()


@contextmanager
def deferred() -> Iterator[None]:
    """:meth:`StopOnSignal.deferred` of the installed handler; a plain block without one."""
    stop = _active
    if stop is None:
        yield
        return
    with stop.deferred():
        yield


def deferring(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` run inside :func:`deferred` (``popgrpo.train.RoundEnd``, called at each round end)."""

    @wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with deferred():
            return func(*args, **kwargs)

    return run
