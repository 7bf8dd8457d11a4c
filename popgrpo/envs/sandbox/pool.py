"""A warm pool of one-shot sandboxes: the interpreter's start paid ahead of need, never shared.

Starting bubblewrap and a Python interpreter costs far more than the few milliseconds a typical
generated program runs (``python -m benchmarks.sandbox_cost``). :class:`SandboxPool` keeps
``size`` sandboxes started ahead of need, each exactly as :class:`popgrpo.envs.sandbox.Sandbox`
starts one: bubblewrap's namespaces and seccomp filter in place, the interpreter up with its
rlimits set and its signals blocked, blocked reading its program from a pipe
(:mod:`popgrpo.envs.sandbox.child`). A background thread refills the pool while the trainer does
other work: when no program runs, or as soon as one waits for a sandbox. What the pool never
does:

* **share**: each sandbox runs exactly one program and is then killed with its process group and
  its directory removed. No fork server, no second program in a process, namespace, interpreter
  or directory: one program of a batch cannot leave anything for the next.
* **start the clock early**: the wall-clock limit runs from the moment the program is written to
  its sandbox, not from the sandbox's start; the CPU limit counts the interpreter's start as the
  one-shot path does.
* **hand out the dead**: a sandbox that died while waiting (it said it was warm on its ready
  pipe; a pool thread and the hand-out check its pid) is replaced, not given a program. One that
  dies in the instant between that check and the write is found by the write (a broken pipe) and
  the program goes to another.
* **leak**: :meth:`SandboxPool.close` (also at interpreter exit) kills every sandbox it started,
  by process group. If the trainer dies without closing, bubblewrap's ``--die-with-parent``
  kills each sandbox, and the child exits when its control pipe closes (also without
  bubblewrap).

A program gives the same :class:`~popgrpo.envs.sandbox.ExecutionResult` pooled or not: the same
child code, limits, files and classification, only started earlier (``tests/envs/
test_sandbox_pool.py`` checks a set of outcomes side by side). If sandboxes keep dying while
they start, programs run on the one-shot path, which reports why.

Use it like :class:`~popgrpo.envs.sandbox.Sandbox` (``run``, ``run_many``, ``submit``), or hand
over each program as soon as it is known with :meth:`~popgrpo.envs.sandbox.Sandbox.submit_one`.
:func:`shared_pool` gives the process's one pool per configuration, for reward functions called
once per step (:func:`popgrpo.envs.rewards.execution_score`, :class:`popgrpo.envs.rewards.SandboxReward`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import select
import sys
import threading
import time
import weakref
from collections import deque
from typing import TypeVar

from popgrpo.envs.sandbox.limits import ExecutionResult, SandboxLimits
from popgrpo.envs.sandbox.runner import Sandbox
from popgrpo.envs.sandbox.spawn import SandboxChild, spawn_child
from popgrpo.envs.sandbox.status import Interpret

__all__ = ["SandboxPool", "default_pool_size", "shared_pool"]

R = TypeVar("R")

_HANDOUT_TRIES = 3  # sandboxes found dead at the write before a program falls back to a cold start
_BOOT_FAILURES = 3  # sandboxes in a row that died starting before programs run cold meanwhile
_SWEEP_S = 1.0  # how often the pool thread looks for warm sandboxes that died while waiting


_DEFAULT_LIMITS = SandboxLimits()  # frozen, so sharing the default is safe


def default_pool_size() -> int:
    """Warm sandboxes kept by default: two per core (one running, one starting)."""
    return 2 * (os.cpu_count() or 1)


class SandboxPool(Sandbox):
    """A :class:`~popgrpo.envs.sandbox.Sandbox` whose programs run in sandboxes started ahead of need.

    Args:
        limits, python, score_range, site_packages, isolation, temp_dir: as for ``Sandbox``; every warm
            sandbox is started with them.
        size: sandboxes kept warm (default :func:`default_pool_size`). A batch larger than the
            pool waits for the refill, so the start cost is hidden entirely when the pool holds
            a step's programs and the trainer has other work while it refills.
        max_workers: programs running at once (default ``os.cpu_count()``, as for ``Sandbox``:
            more programs than cores at once would share the cores and reach their wall-clock
            limits sooner than the same programs one-shot).
    """

    def __init__(
        self,
        limits: SandboxLimits = _DEFAULT_LIMITS,
        size: int | None = None,
        max_workers: int | None = None,
        python: str = sys.executable,
        score_range: tuple[float, float] = (0.0, 1.0),
        *,
        site_packages: bool = True,
        isolation: str = "bwrap",
        temp_dir: str | None = None,
        _audit_hook: bool = True,
    ) -> None:
        size = default_pool_size() if size is None else size
        if size < 1:
            raise ValueError(f"a sandbox pool holds at least one sandbox, got size={size}")
        super().__init__(
            limits,
            max_workers=max_workers,
            python=python,
            score_range=score_range,
            site_packages=site_packages,
            isolation=isolation,
            temp_dir=temp_dir,
            _audit_hook=_audit_hook,
        )
        self.size = size
        self._ready: deque[SandboxChild] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._shut = False
        self._broken = False  # sandboxes keep dying while they start: programs run cold meanwhile
        self._running = 0  # programs being run now
        self._waiting = 0  # programs waiting for a warm sandbox
        self.started = 0  # sandboxes started by the pool thread
        self.discarded = 0  # sandboxes that died or were killed without running a program
        self._owner = os.getpid()  # a forked copy of this process must not touch the sandboxes
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._refill, name="popgrpo-sandbox-pool", daemon=True)
        self._thread.start()
        _LIVE_POOLS.add(self)

    # ---- the pool's thread ----------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _refill(self) -> None:
        """Keep ``size`` sandboxes warm or starting; move each to the ready queue once it says so.

        It refills while no program runs, or as soon as one waits for a sandbox: starting
        interpreters beside running programs would slow them on a machine with few cores.

        This thread starts every pooled sandbox and lives as long as the pool: bubblewrap's
        ``--die-with-parent`` follows the *thread* that started it.
        """
        booting: dict[int, SandboxChild] = {}  # ready_fd → child still starting
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        failures = 0
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    wanted = self.size - len(self._ready) - len(booting)
                    if self._running and not self._waiting:
                        # Starting interpreters takes CPU from the programs running now; wait
                        # until they are done (or one waits for a sandbox) to refill.
                        wanted = 0
                for _ in range(wanted):
                    try:
                        child = spawn_child(
                            self.limits,
                            self.python,
                            self.site_packages,
                            self.isolation,
                            self._audit_hook,
                            self.temp_dir,
                        )
                    except Exception:  # out of descriptors, processes, disk: retried after a pause
                        failures += 1
                        break
                    with self._cond:
                        self.started += 1
                    assert child.ready_fd is not None
                    booting[child.ready_fd] = child
                    poller.register(child.ready_fd, select.POLLIN)
                for fd, _ in poller.poll(_SWEEP_S * 1000):
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                        continue
                    child = booting.pop(fd)
                    poller.unregister(fd)
                    if child.read_ready():
                        failures = 0
                        with self._cond:
                            self._broken = False
                            self._ready.append(child)
                            self._cond.notify_all()
                    else:
                        failures += 1
                        self._discard(child)
                self._sweep()
                if failures:
                    with self._cond:
                        self._broken = failures >= _BOOT_FAILURES
                        self._cond.notify_all()
                    time.sleep(min(0.05 * 2**failures, 2.0))  # a broken setup is not retried in a tight loop
        except BaseException:
            with self._cond:
                self._broken = True  # without its thread the pool runs every program cold
                self._cond.notify_all()
            raise
        finally:
            for child in booting.values():
                self._discard(child)

    def _sweep(self) -> None:
        """Replace warm sandboxes that died while waiting."""
        with self._cond:
            dead = [child for child in self._ready if child.exited()]
            for child in dead:
                self._ready.remove(child)
        for child in dead:
            self._discard(child)

    def _discard(self, child: SandboxChild) -> None:
        with self._cond:
            self.discarded += 1
        child.discard()

    # ---- handing out --------------------------------------------------------------------------
    def _take(self) -> SandboxChild | None:
        """A warm, live sandbox (waiting for one if need be); None when programs must run cold."""
        while True:
            dead: SandboxChild | None = None
            with self._cond:
                if not self._ready and not self._closed and not self._broken:
                    self._waiting += 1
                    self._wake()
                    try:
                        while not self._ready and not self._closed and not self._broken:
                            self._cond.wait()
                    finally:
                        self._waiting -= 1
                if self._ready:
                    child = self._ready.popleft()
                    self._wake()
                    if not child.exited():
                        return child
                    dead = child
                elif self._closed:
                    raise RuntimeError("the sandbox pool is closed")
                else:
                    return None
            self._discard(dead)

    def _run_one(self, code: str, interpret: Interpret[R] | None = None) -> ExecutionResult | R:
        """Run one program in a warm sandbox; the wall clock starts as the program is written."""
        with self._cond:
            self._running += 1
        try:
            return self._run_in_pool(code, interpret)
        finally:
            with self._cond:
                self._running -= 1
                idle = self._running == 0
            if idle:
                self._wake()  # the pool thread refills now

    def _run_in_pool(self, code: str, interpret: Interpret[R] | None = None) -> ExecutionResult | R:
        for _ in range(_HANDOUT_TRIES):
            child = self._take()
            if child is None:
                break
            nonce = secrets.token_hex(16)
            deadline = time.monotonic() + self.limits.timeout_s
            try:
                sent = child.send(nonce, code, deadline)
            except BaseException:
                self._discard(child)
                raise
            if sent:
                return child.finish(nonce, self.limits, self.score_range, deadline, interpret)
            self._discard(child)  # it died after the check: the program never reached it
        return super()._run_one(code, interpret)

    @property
    def warm(self) -> int:
        """Sandboxes warm and waiting now."""
        with self._cond:
            return len(self._ready)

    def wait_warm(self, count: int | None = None, timeout: float = 30.0) -> bool:
        """Block until ``count`` (default: ``size``) sandboxes are warm; False on ``timeout``."""
        want = self.size if count is None else count
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < want:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._cond.wait(min(remaining, 0.05))
        return True

    def pids(self) -> list[int]:
        """The bubblewrap (or, without it, interpreter) pids of the warm sandboxes."""
        with self._cond:
            return [child.pid for child in self._ready]

    # ---- shutting down ------------------------------------------------------------------------
    @staticmethod
    def close_all() -> None:
        """Close every pool of this process (a later :func:`shared_pool` call starts a new one)."""
        for pool in list(_LIVE_POOLS):
            pool.close()

    def close(self) -> None:
        """Wait for running programs, cancel queued ones, kill every warm sandbox. Idempotent.

        In a process forked from the pool's (which has none of its threads), it does nothing:
        the sandboxes are the parent's.
        """
        if os.getpid() != self._owner:
            return
        super().close()
        with self._cond:
            if self._shut:
                return
            self._shut = self._closed = True
            self._cond.notify_all()
        self._wake()
        self._thread.join(timeout=30)
        with self._cond:
            idle = list(self._ready)
            self._ready.clear()
        for child in idle:
            self._discard(child)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        _LIVE_POOLS.discard(self)


_LIVE_POOLS: weakref.WeakSet[SandboxPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    """At interpreter exit, kill every sandbox a pool still holds (nothing outlives the trainer)."""
    for pool in list(_LIVE_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


_SHARED: dict[tuple[object, ...], SandboxPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(
    limits: SandboxLimits,
    size: int | None = None,
    max_workers: int | None = None,
    score_range: tuple[float, float] = (0.0, 1.0),
    *,
    site_packages: bool = True,
    isolation: str = "bwrap",
    python: str = sys.executable,
) -> SandboxPool:
    """The process's pool for this configuration, started on first use and kept until exit.

    A reward function called once per step uses it so the pool stays warm between steps; the
    members of one process that share a configuration share its pool.
    """
    key = (limits, size, max_workers, tuple(float(v) for v in score_range), site_packages, isolation, python)
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None or pool._closed:  # pyright: ignore[reportPrivateUsage]  # same module
            pool = _SHARED[key] = SandboxPool(
                limits,
                size=size,
                max_workers=max_workers,
                python=python,
                score_range=(float(score_range[0]), float(score_range[1])),
                site_packages=site_packages,
                isolation=isolation,
            )
        return pool
