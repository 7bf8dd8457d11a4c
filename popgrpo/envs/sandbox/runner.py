"""The public run API: :class:`Sandbox` runs programs, each in a fresh sandbox, on a thread pool."""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from typing import TypeVar

from popgrpo.envs.sandbox.bwrap import ISOLATIONS, bwrap_problem, warn_unisolated
from popgrpo.envs.sandbox.limits import NO_CODE, ExecutionResult, SandboxLimits, SandboxUnavailable
from popgrpo.envs.sandbox.spawn import execute
from popgrpo.envs.sandbox.status import Interpret

__all__ = ["Sandbox"]

R = TypeVar("R")
_SandboxT = TypeVar("_SandboxT", bound="Sandbox")

_DEFAULT_LIMITS = SandboxLimits()  # frozen, so sharing the default is safe


class Sandbox:
    """Runs programs, each in its own isolated, limited process, on a thread pool.

    Threads are enough for parallelism: each worker only waits on its child (no GIL held). The
    pool bounds how many programs run at once (``max_workers``, default ``os.cpu_count()``);
    every method may be called from several threads. ``site_packages=False`` adds ``-S``: the
    program then sees only the standard library, and the interpreter starts several times faster.

    ``isolation="bwrap"`` (the default) runs every program under bubblewrap and seccomp and
    raises :class:`SandboxUnavailable` here, before anything runs, when that is impossible on
    this machine. ``isolation="none"`` is the explicit opt-out: the audit hook alone, with a
    warning on stderr. ``score_range`` (default ``(0, 1)``) bounds the scores a program may
    report; anything outside scores 0 with reason ``out_of_range``. Each program's directory is
    made under ``temp_dir`` (default: the system's temp dir; a size-limited filesystem there
    bounds what programs can write to the disk).
    """

    def __init__(
        self,
        limits: SandboxLimits = _DEFAULT_LIMITS,
        max_workers: int | None = None,
        python: str = sys.executable,
        score_range: tuple[float, float] = (0.0, 1.0),
        *,
        site_packages: bool = True,
        isolation: str = "bwrap",
        temp_dir: str | None = None,
        _audit_hook: bool = True,
    ) -> None:
        if score_range is None or len(score_range) != 2:
            raise ValueError(f"score_range must be (low, high), got {score_range!r}")
        low, high = (float(v) for v in score_range)
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"score_range must be finite (low, high) with low <= high, got {score_range!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if isolation == "bwrap":
            problem = bwrap_problem(python)
            if problem is not None:
                raise SandboxUnavailable(
                    f"refusing to run untrusted code: {problem}. Install bubblewrap where user namespaces "
                    "are allowed, or opt out explicitly with isolation='none' (audit hook only; not a "
                    "security boundary)"
                )
        else:
            warn_unisolated()
        self.limits = limits
        self.python = python
        self.score_range = (low, high)
        self.site_packages = site_packages
        self.isolation = isolation
        self.temp_dir = temp_dir
        self._audit_hook = _audit_hook  # False only in tests of the kernel layer alone
        self._pool = ThreadPoolExecutor(max_workers or os.cpu_count() or 1, thread_name_prefix="popgrpo-sandbox")

    def run(self, code: str) -> ExecutionResult:
        """Run one program and wait for its result."""
        return self.run_many([code])[0]

    def run_many(self, codes: Sequence[str | None]) -> list[ExecutionResult]:
        """Run programs in parallel and wait; results in input order, ``None`` → ``no_code``."""
        return self.submit(codes).result()

    def submit(self, codes: Sequence[str | None]) -> Future[list[ExecutionResult]]:
        """Start programs and return at once with a Future of their results (input order).

        Lets a trainer overlap execution with other work. Cancelling the returned Future cancels
        the programs not yet started; :meth:`close` cancels queued ones too (the Future is then
        cancelled).
        """
        codes = list(codes)
        for code in codes:
            if code is not None and not isinstance(code, str):
                raise TypeError(f"codes must be str or None, got {type(code).__name__}")
        batch: Future[list[ExecutionResult]] = Future()
        results: list[ExecutionResult | None] = [None if c is not None else NO_CODE for c in codes]
        pending = [(i, c) for i, c in enumerate(codes) if c is not None]
        if not pending:
            batch.set_result([r for r in results if r is not None])  # every entry is NO_CODE
            return batch
        # Re-entrant: cancelling ``batch`` cancels queued items, whose callbacks run right here.
        lock = threading.RLock()
        remaining = [len(pending)]

        def item_done(index: int, fut: Future[ExecutionResult]) -> None:
            with lock:
                try:
                    if fut.cancelled():
                        batch.cancel()
                    elif fut.exception() is not None:
                        batch.set_exception(fut.exception())
                    else:
                        results[index] = fut.result()
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            batch.set_result([r for r in results if r is not None])  # every entry is NO_CODE
                except (InvalidStateError, CancelledError):
                    pass  # the batch already failed or was cancelled by the caller

        items = [self._pool.submit(self._run_program, code) for _, code in pending]
        batch.add_done_callback(lambda b: [f.cancel() for f in items] if b.cancelled() else None)
        for (index, _), fut in zip(pending, items, strict=True):
            fut.add_done_callback(functools.partial(item_done, index))
        return batch

    def submit_one(self, code: str | None) -> Future[ExecutionResult]:
        """Start one program and return at once with a Future of its result (``None`` → ``no_code``).

        For a trainer that hands each program over as soon as its completion is generated.
        """
        if code is None:
            done: Future[ExecutionResult] = Future()
            done.set_result(NO_CODE)
            return done
        if not isinstance(code, str):
            raise TypeError(f"code must be str or None, got {type(code).__name__}")
        return self._pool.submit(self._run_program, code)

    def submit_run(self, payload: str, interpret: Interpret[R]) -> Future[R]:
        """Start one run whose outcome ``interpret`` reads (a test run of :mod:`popgrpo.envs.harness`).

        ``payload`` is what the child reads after the nonce (a program, or a test run's spec); the
        run has this sandbox's limits, isolation and pool, exactly as a program has.
        """
        return self._pool.submit(self._run_one, payload, interpret)  # pyright: ignore[reportReturnType]

    def _run_program(self, code: str) -> ExecutionResult:
        """Run one scored program on the calling (worker) thread."""
        result = self._run_one(code)
        assert isinstance(result, ExecutionResult)  # without ``interpret``, the classified result
        return result

    def _run_one(self, code: str, interpret: Interpret[R] | None = None) -> ExecutionResult | R:
        """Run one program on the calling (worker) thread: a fresh sandbox started for it."""
        return execute(
            code,
            limits=self.limits,
            python=self.python,
            site_packages=self.site_packages,
            score_range=self.score_range,
            isolation=self.isolation,
            audit_hook=self._audit_hook,
            temp_dir=self.temp_dir,
            interpret=interpret,
        )

    def close(self) -> None:
        """Wait for running programs, cancel queued ones, stop the pool. Idempotent."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self: _SandboxT) -> _SandboxT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
