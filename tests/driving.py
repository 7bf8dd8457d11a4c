"""Drive an executor through every round the way ``popgrpo.train`` does, for tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from popgrpo.runtime.scheduler import run_rounds


def drive(cfg, executor, after_first_round: Callable[[object], None] | None = None) -> tuple[list[dict], list]:
    """Run all rounds, snapshotting after each (as the driver's checkpoint does).

    ``after_first_round(executor)`` runs when round 0 has ended and round 1 is about to
    start: the place to inject a failure into round 1. Returns the metrics rows and the
    lineage records (``None`` for rounds that merged nothing). The caller closes the executor.
    """
    rows, lineage = [], []

    def on_round(i, epoch_end, member_rows, record):
        rows.extend(r for per in member_rows for r in per)
        lineage.append(record)
        executor.snapshot()
        if after_first_round is not None and i == 0:
            after_first_round(executor)

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
