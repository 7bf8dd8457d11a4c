"""Chaos: member-actor processes SIGKILLed at random moments of a run; the numbers do not change.

A seeded monkey picks when (a random gap) and whom (a random live ``MemberGroup`` process of
this test's own Ray) to kill, several times in one run. Whatever the kill hits — an actor
being constructed, one mid-``train``, one idle between calls, one being rebuilt after an
earlier kill — the executor rebuilds it from the last restore point and replays, so the run
equals an undisturbed one bit for bit. The schedule is reproducible from the seed; the moment
of the run a kill lands in depends on the machine's speed, which is the point: any moment must do.
"""

import random
import threading
import time

import pytest

from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.ray_executor import RayExecutor
from tests.configs import pop_grpo
from tests.driving import drive, member_group_processes, same_rows, sigkill
from tests.runtime.test_faults import SHAPE, _assert_same_archives

pytestmark = [pytest.mark.ray, pytest.mark.heavy]


class ChaosMonkey:
    """SIGKILLs a random member-actor process after each random gap, ``kills`` times, until stopped."""

    def __init__(self, seed: int, kills: int, gap_s: tuple[float, float] = (0.2, 1.5)) -> None:
        self.rng, self.kills, self.gap_s = random.Random(seed), kills, gap_s
        self.killed: list[tuple[float, int, str]] = []  # (seconds since start, pid, process title)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._start = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while len(self.killed) < self.kills:
            if self._stop.wait(self.rng.uniform(*self.gap_s)):
                return
            live = sorted(member_group_processes().items())
            if not live:  # nothing built yet (workers still idle): draw another gap
                continue
            pid, title = self.rng.choice(live)
            if sigkill(pid):
                self.killed.append((round(time.monotonic() - self._start, 2), pid, title))


@pytest.mark.timeout(1200)  # up to 4 rebuilds: 94 s on a busy 2-core machine, over 600 s with two CPU hogs too
def test_random_member_kills_during_a_run_leave_its_numbers_unchanged(ray_local):
    cfg = pop_grpo(*SHAPE, "population.max_restarts=10")  # a call may see one actor lost several times
    local = LocalExecutor(cfg)
    reference_rows, reference_lineage = drive(cfg, local)
    monkey, executor = ChaosMonkey(seed=16, kills=4), None
    monkey.start()  # before the executor: construction is a moment like any other
    try:
        executor = RayExecutor(cfg)
        rows, lineage = drive(cfg, executor)
        archives = executor.archives()
    finally:
        monkey.stop()  # before close: its kills are the run's, not its teardown's
        if executor is not None:
            executor.close()
    kills = "; ".join(f"{t}s {title}" for t, _, title in monkey.killed)
    print(f"chaos: {executor.restarts} restarts after kills at {kills}")  # shown with pytest -s
    assert len(monkey.killed) == 4, f"the run ended before every kill landed: {kills}"
    # Each kill loses at most one actor; a kill of an actor being rebuilt is retried within that rebuild.
    assert 1 <= executor.restarts <= len(monkey.killed), kills
    assert same_rows(rows, reference_rows), kills
    assert lineage == reference_lineage, kills
    _assert_same_archives(archives, local.archives())
