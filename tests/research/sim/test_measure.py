"""The round timer that calibration and validation read, on a real in-process run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from popgrpo.config import load_config, preset_path
from popgrpo.research.sim.measure import TIMED_CALLS, Sharing, run_timed
from popgrpo.runtime.executor import LocalExecutor

ROOT = Path(__file__).resolve().parents[3]


def test_round_timer_splits_each_round_into_executor_calls_and_driver_work():
    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=2", "scheduler.top_m=2", "run.epochs=6", "scheduler.interval_epochs=2", "run.loggers=[]"],
    )
    timer = run_timed(cfg, lambda c, _d: LocalExecutor(c))
    rounds = timer.round_seconds()
    train_s, inside = timer.per_round(("train",)), timer.per_round()
    assert len(rounds) == 3 == len(train_s) == len(inside) == timer.rounds
    assert all(r > 0 for r in rounds)
    # Inside executor calls: at least the training; the rest is the driver's, never negative.
    assert all(i >= t > 0 for i, t in zip(inside, train_s, strict=True))
    assert {c.name for c in timer.calls} <= set(TIMED_CALLS) and min(c.round for c in timer.calls) >= 0
    assert all(d >= 0 for d in timer.driver_seconds())
    # The driver's CPU outside executor calls, with its background writer's for the round:
    # one value per round, each at least the writer's part (every round is written).
    assert len(timer.writer_cpu) == 3 and all(w > 0 for w in timer.writer_cpu)
    driver = timer.driver_cpu_seconds()
    assert len(driver) == 3 and all(d >= w for d, w in zip(driver, timer.writer_cpu, strict=True))
    # Each round's last report to the next's: one period fewer than rounds, none negative.
    assert len(timer.report_periods()) == 2 and all(p > 0 for p in timer.report_periods())
    adopt_s = timer.per_round(("adopt",))
    assert adopt_s[0] > 0 and adopt_s[-1] == 0  # the last round merges nothing
    assert timer.epoch_cpu == [] and timer.worker_pids() == []  # in-process: no worker processes


def test_sharing_splits_the_cpu_between_epochs_calls_ray_and_the_rest_of_the_machine():
    """4 actors × 2 calls × 10 epochs on 2 cores over 5 s: 0.8 s of epoch CPU in 80 epochs (10 ms
    each), 1.0 s of actor CPU (0.2 s outside epochs over 8 calls), 0.5 s Ray, 6.5 s busy in all."""
    m = Sharing(actors=4, cores=2, calls=8, epochs=80, wall=5.0, epoch_cpu_s=0.8, actor_cpu_s=1.0,
                ray_cpu_s=0.5, busy_cpu_s=6.5)  # fmt: skip
    assert m.contention(0.008) == pytest.approx(1.25)  # 10 ms here, 8 ms alone
    assert m.call_cpu_s() == pytest.approx(0.025)
    assert m.ray_share() == pytest.approx(0.05)  # 0.5 of 10 core-seconds
    assert m.background_share() == pytest.approx(0.5)  # 6.5 - 1.0 - 0.5 of 10
    idle = Sharing(actors=1, cores=2, calls=1, epochs=1, wall=1.0, epoch_cpu_s=0.5, actor_cpu_s=0.4,
                   ray_cpu_s=0.1, busy_cpu_s=0.3)  # fmt: skip
    assert idle.call_cpu_s() == 0.0 and idle.background_share() == 0.0  # clock noise never goes negative
    # With real rounds measured too, their epochs set the contention: 80 epochs in 1.2 s, 15 ms each.
    rounds = Sharing(actors=4, cores=2, calls=8, epochs=80, wall=5.0, epoch_cpu_s=0.8, actor_cpu_s=1.0,
                     ray_cpu_s=0.5, busy_cpu_s=6.5, round_epoch_cpu_s=1.2, round_epochs=80)  # fmt: skip
    assert rounds.contention(0.008) == pytest.approx(1.875)
    assert rounds.call_cpu_s() == m.call_cpu_s() and rounds.ray_share() == m.ray_share()  # from the calls


@pytest.mark.slow
@pytest.mark.benchmark_run
@pytest.mark.ray
def test_validation_benchmark_runs_end_to_end_quick(tmp_path):
    """Calibration on Ray, the real-vs-simulated table and the curves, at the smallest sizes."""
    out = tmp_path / "B.md"
    out.write_text("# Benchmarks\n\nkept\n")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.sim_validation", "--quick", "--out", str(out),
         "--data", str(tmp_path / "data"), "--figure", str(tmp_path / "sim.png")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n")
    assert (
        "| K | actors × members | repeats × rounds | real s/round: median (min–max) "
        "| simulated s/round: median (min–max) | error of the medians | error in each repeat |"
    ) in text
    assert (tmp_path / "sim.png").stat().st_size > 10_000
    data = json.loads((tmp_path / "data" / "sim_validation.json").read_text())
    assert len(data["repeats"]) == len(data["calibrations"]) == 1  # --quick: one repeat
    for row, only in zip(data["validation"], data["repeats"][0], strict=True):
        assert row["errors"] == [only["error"]] and row["real_round_s"] == only["real_round_s"]


def test_repeats_are_summarised_by_their_medians():
    """Three repeats at one size: the medians of the real and simulated round times, the error of
    those medians (not the median of the errors), every repeat's error, the real means' range."""
    from benchmarks.sim_validation import median_costs, summarise

    def row(real, sim, load):
        return {"k": 5, "actors": 5, "real_round_s": real, "sim_round_s": sim, "error": sim / real - 1,
                "load_average_1min": [load, load + 1], "rounds_measured": 4}  # fmt: skip

    (summary,) = summarise([[row(1.0, 1.2, 2.0)], [row(2.0, 1.8, 3.0)], [row(1.5, 1.4, 1.0)]])
    assert summary["repeats"] == 3
    assert summary["real_round_s"] == 1.5 and summary["sim_round_s"] == 1.4
    assert summary["error"] == pytest.approx(1.4 / 1.5 - 1)
    assert summary["errors"] == pytest.approx([0.2, -0.1, 1.4 / 1.5 - 1])
    assert summary["real_round_spread"] == [1.0, 2.0] and summary["load_average_1min"] == [1.0, 4.0]
    costs = median_costs([{"epoch_s": 1.0, "merge_s": {"a": 1.0, "b": 5.0}, "machine": "x"},
                          {"epoch_s": 3.0, "merge_s": {"a": 2.0, "b": 4.0}, "machine": "y"},
                          {"epoch_s": 2.0, "merge_s": {"a": 3.0, "b": 6.0}, "machine": "z"}])  # fmt: skip
    assert costs == {"epoch_s": 2.0, "merge_s": {"a": 2.0, "b": 5.0}, "machine": "x"}


def test_link_cost_is_measured_on_saves_that_link_every_member(monkeypatch):
    """``checkpoint_link_s``: every member of the timed saves is linked, none serialised again."""
    from popgrpo.research.sim.measure import checkpoint_link_cost
    from popgrpo.telemetry import checkpoint

    serialised: list[int] = []
    to_bytes = checkpoint._to_bytes
    monkeypatch.setattr(checkpoint, "_to_bytes", lambda obj: serialised.append(isinstance(obj, dict)) or to_bytes(obj))
    linked = []
    reuse = checkpoint.Checkpointer._reuse
    monkeypatch.setattr(checkpoint.Checkpointer, "_reuse", staticmethod(lambda s, t: linked.append(t) or reuse(s, t)))
    cost = checkpoint_link_cost(load_config(preset_path("pop_grpo")), repeats=3)
    assert cost >= 0.0
    assert sum(serialised) == 2 + 8  # the members, once each in the first save of each size
    assert len(linked) == 3 * (2 + 8)
