"""popgrpo.telemetry.cpu: two samples of the machine's CPU turned into shares of the cores."""

from __future__ import annotations

import pytest

from popgrpo.telemetry.cpu import CpuSample, split


def test_split_shares_the_cores_between_roles_threads_and_idle():
    """2 cores over 10 s (20 core-seconds): the actors used 12 s (10 in epochs), the driver 3 s
    (its writer 1, main 0.5, a Ray thread started in the span 0.5, a thread that ended 1),
    the raylet 1 s, a process that started in the span 0.7 s (not counted: unaccounted), idle 3 s."""
    a = CpuSample(
        t=0.0,
        processes={1: (2.0, "driver"), 2: (5.0, "member actors"), 3: (1.0, "raylet")},
        threads={10: ("main", 1.0), 11: ("writer", 0.2), 12: ("other python", 0.3)},
        idle=100.0,
    )
    b = CpuSample(
        t=10.0,
        processes={1: (5.0, "driver"), 2: (17.0, "member actors"), 3: (2.0, "raylet"), 4: (0.7, "raylet")},
        threads={10: ("main", 1.5), 11: ("writer", 1.2), 13: ("ray (native)", 0.5)},
        idle=103.0,
    )
    shares = split(a, b, epochs_cpu=10.0, cores=2)
    assert shares["members' epochs"] == pytest.approx(0.5)
    assert shares["member actors, outside epochs"] == pytest.approx(0.1)
    assert shares["driver: writer"] == pytest.approx(0.05)
    assert shares["driver: main"] == pytest.approx(0.025)
    assert shares["driver: ray (native)"] == pytest.approx(0.025)  # started in the span: all of it
    assert shares["driver: other python"] == 0.0  # ended in the span: not seen by b
    assert shares["driver: threads that ended"] == pytest.approx(0.05)  # 3 s less 2 s seen by thread
    assert shares["raylet"] == pytest.approx(0.05)  # pid 4 started in the span: left out
    assert shares["idle cores"] == pytest.approx(0.15)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["unaccounted"] == pytest.approx(1 - 0.5 - 0.1 - 0.05 - 0.025 - 0.025 - 0.05 - 0.05 - 0.15)
