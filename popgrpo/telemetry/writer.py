"""A background writer: a run's files and logger events written by one thread, in order.

The round loop hands each round's writing (its metrics part, lineage line, logger events,
events, checkpoint) to :meth:`BackgroundWriter.submit` and goes on to the next round while a
thread writes it. What this keeps:

* **Order.** Tasks run one at a time, in the order submitted. A round's checkpoint is
  submitted after its metrics and lineage, so ``checkpoints/latest.json`` never names a round
  whose rows are not on disk; a run killed with SIGKILL loses at most the rounds its
  checkpoint does not claim, which a resumed run recomputes.
* **Backpressure.** At most ``max_pending`` tasks wait; :meth:`submit` blocks while the queue
  is full, so a slow disk slows the run instead of filling its memory.
* **Nothing lost at exit.** :meth:`close` runs what is queued and joins the thread; the run
  calls it in its ``finally`` (the end, an exception, a SIGTERM or SIGINT, which arrive as
  exceptions), and an :mod:`atexit` hook calls it for a writer left open.
* **No silent failure.** The first exception a task raises stops the writing (later tasks
  are dropped: a checkpoint must not follow rows that were not written) and is raised in the
  submitting thread, as :class:`WriterError` from it, by the next :meth:`submit`,
  :meth:`flush` or :meth:`close`.
"""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["BackgroundWriter", "WriterError"]

_STOP = object()


class WriterError(RuntimeError):
    """A task of the background writer raised; ``__cause__`` is its exception."""


class BackgroundWriter:
    """One thread running submitted tasks in order; see the module docstring."""

    def __init__(self, max_pending: int = 8, name: str = "popgrpo-writer") -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._failed_task = ""
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    # ---- the thread ---------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:  # after a failure, what is queued is dropped
                    fn, args, kwargs = item
                    try:
                        fn(*args, **kwargs)
                    except BaseException as exc:  # handed to the submitting thread
                        self._failed_task = getattr(fn, "__qualname__", repr(fn))
                        self._error = exc
            finally:
                self._queue.task_done()

    # ---- the submitting thread ------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriterError(f"background writer: {self._failed_task} failed: {self._error!r}") from self._error

    @property
    def failed(self) -> bool:
        """Whether a task has raised (its exception is raised by the next call)."""
        return self._error is not None

    def submit(self, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
        """Queue ``fn(*args, **kwargs)``; blocks while ``max_pending`` tasks wait.

        Raises :class:`WriterError` if an earlier task failed, RuntimeError once closed.
        """
        self._raise_if_failed()
        if self._closed:
            raise RuntimeError("background writer: submit after close")
        while True:  # put in slices: a thread that failed meanwhile still drains the queue
            try:
                self._queue.put((fn, args, kwargs), timeout=0.1)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    raise RuntimeError("background writer: the thread is gone") from None

    def flush(self) -> None:
        """Wait until every submitted task has run; raise :class:`WriterError` if one failed."""
        if self._thread.is_alive():
            self._queue.join()
        self._raise_if_failed()

    def close(self, raise_error: bool = True) -> None:
        """Run what is queued, stop the thread and join it (again: nothing happens).

        ``raise_error``: raise :class:`WriterError` for a failed task (a caller already
        unwinding from another exception passes False and keeps its own).
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._thread.is_alive():
                    self._queue.put(_STOP)
                    self._thread.join()
                atexit.unregister(self._at_exit)
        if raise_error:
            self._raise_if_failed()

    def _at_exit(self) -> None:
        self.close(raise_error=False)
        if self._error is not None:  # the interpreter is ending: say it, at least
            import sys

            print(
                f"popgrpo: background writer: {self._failed_task} failed: {self._error!r}",
                file=sys.stderr,
                flush=True,
            )
