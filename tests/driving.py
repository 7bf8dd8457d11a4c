"""Drive an executor through every round the way ``popgrpo.train`` does, for tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from popgrpo.runtime.scheduler import run_rounds


def drive(
    cfg,
    executor,
    after_first_round: Callable[[object], None] | None = None,
    after_round: Callable[[int, object], None] | None = None,
) -> tuple[list[dict], list]:
    """Run all rounds, snapshotting after each (as the driver's checkpoint does).

    ``after_first_round(executor)`` runs when round 0 has ended and round 1 is about to
    start: the place to inject a failure into round 1; ``after_round(i, executor)`` runs
    after every round ``i``. Returns the metrics rows and the lineage records (``None`` for
    rounds that merged nothing). The caller closes the executor.
    """
    rows, lineage = [], []

    def on_round(i, epoch_end, member_rows, record):
        rows.extend(r for per in member_rows for r in per)
        lineage.append(record)
        executor.snapshot()
        if after_first_round is not None and i == 0:
            after_first_round(executor)
        if after_round is not None:
            after_round(i, executor)

    run_rounds(cfg, executor, on_round)
    return rows, lineage


def kill_when_busy(actor, kill, timeout=60.0):
    """Call ``kill()`` as soon as ``actor`` is busy: a probe call is not answered at once.

    A member actor runs one call at a time, so a probe that waits means a call (the next
    round's ``train``) is in progress: the kill lands mid-call whatever a round's length.
    Returns an event set once ``kill`` has run.
    """
    import ray

    done = threading.Event()

    def probe():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _ = ray.wait([actor.pid.remote()], timeout=0.02)
            if not ready:
                kill()
                done.set()
                return

    threading.Thread(target=probe, daemon=True).start()
    return done


def member_group_processes() -> dict[int, str]:
    """``{pid: process title}`` of this process's descendants that run a ``MemberGroup`` actor.

    Ray titles an actor's worker process ``ray::MemberGroup`` (``ray::MemberGroup.<method>``
    while it runs a call); while it is being constructed, ``ray::<actor name>:MemberGroup.__init__``
    for a named actor (every member actor is: ``popgrpo.runtime.naming``), which is given here
    without the name, as ``ray::MemberGroup.__init__``. Only descendants are looked at, so a
    test can never touch another run's actors on this machine.
    """
    import os

    from benchmarks.common import _children, _cmdline

    children, found, todo = _children(), {}, [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            title = _cmdline(child).strip()
            if not title.startswith("ray::"):
                continue
            task = title.removeprefix("ray::").rpartition(":")[2]  # "<name>:" of a named actor's constructor
            if task.startswith("MemberGroup"):
                found[child] = f"ray::{task}"
    return found


def sigkill(pid: int) -> bool:
    """SIGKILL ``pid``; False if it was already gone."""
    import os
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def kill_during_construction(count: int = 1, timeout: float = 300.0):
    """SIGKILL the first ``count`` member-actor processes seen inside ``MemberGroup.__init__``.

    Start it before the executor: the kill lands while the actor is being built, as a node lost
    during start-up or an OOM while loading a model would. Returns ``(thread, killed pids)``.
    """
    killed: list[int] = []

    def watch():
        deadline = time.monotonic() + timeout
        while len(killed) < count and time.monotonic() < deadline:
            for pid, title in member_group_processes().items():
                if title.startswith("ray::MemberGroup.__init__") and pid not in killed and sigkill(pid):
                    killed.append(pid)
                    break
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, killed


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Metrics rows equal bit for bit, a NaN equal to a NaN (columns a run does not measure are NaN,
    and a NaN that crossed Ray's object store is no longer the same float object)."""
    import math

    def same(x: object, y: object) -> bool:
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        return x == y

    return len(a) == len(b) and all(
        r.keys() == q.keys() and all(same(r[k], q[k]) for k in r) for r, q in zip(a, b, strict=True)
    )
