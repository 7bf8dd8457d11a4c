"""Asynchronous rounds: seeded straggler delays, logical report order, the merge event log and
the checkpoint's async state.

What is guaranteed (docs/guides/async.md): a run is a function of its seed and of the merges'
decisions (which actors each merge takes), with private archives. ``scheduler.order=logical``
makes the decisions a function of the seed too (reports are taken by their seeded logical
finish time, not by arrival), so two runs, a run with restarted members and a resumed run equal
the in-process run bit for bit. With ``order=arrival`` the decisions follow timing;
``merges.jsonl`` records each before it is carried out, and a resumed run replays the ones its
checkpoint does not hold.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from popgrpo.algorithms.async_rounds import logical_finish, next_logical, straggler_delay
from popgrpo.config import ConfigError, load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.telemetry.checkpoint import Checkpointer
from popgrpo.train import ResumeError, resume, train
from tests.configs import SEEDED, pop_grpo

pytestmark = pytest.mark.heavy

BASE = [*SEEDED, "run.epochs=30", "scheduler.interval_epochs=10", "scheduler.mode=async", "grpo.steps_per_epoch=4"]
STRAGGLERS = ["population.straggler.scale_s=0.05", "population.straggler.sigma=1.0"]
BOUNDED = ["scheduler.buffer=2", "scheduler.max_staleness=1"]


def _metrics(run_dir):
    """The run's metrics without its wall-clock column."""
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns=["seconds"], errors="ignore")


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _final_weights(run_dir) -> list[dict[str, torch.Tensor]]:
    checkpointer = Checkpointer(run_dir)
    info = checkpointer.latest()
    assert info is not None
    return [state["policy"] for state in checkpointer.load(info)[0]]


def _assert_same_run(a, b) -> None:
    """Metrics, lineage, the event log and every member's final weights, bit for bit."""
    pd.testing.assert_frame_equal(_metrics(a), _metrics(b))
    assert _lines(a / "lineage.jsonl") == _lines(b / "lineage.jsonl")
    assert _lines(a / "merges.jsonl") == _lines(b / "merges.jsonl")
    for wa, wb in zip(_final_weights(a), _final_weights(b), strict=True):
        assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)


# ---- the straggler delay -------------------------------------------------------------------


def test_straggler_delay_is_seeded_log_normal_and_off_at_zero():
    assert straggler_delay(42, 3, 1, scale_s=0.0, sigma=1.0) == 0.0
    draws = np.array([straggler_delay(42, k, r, 2.0, 1.0) for k in range(50) for r in range(20)])
    assert draws.tolist() == [straggler_delay(42, k, r, 2.0, 1.0) for k in range(50) for r in range(20)]
    assert len(set(draws.tolist())) == len(draws)  # every (member, round) its own draw
    assert abs(np.median(draws) / 2.0 - 1) < 0.15  # median scale_s
    assert abs(np.log(draws).std() - 1.0) < 0.08  # log-normal σ
    assert draws.max() > 15 * np.median(draws)  # heavy tail: a few rounds far slower
    assert straggler_delay(7, 0, 0, 2.0, 1.0) != straggler_delay(42, 0, 0, 2.0, 1.0)
    assert straggler_delay(42, 0, 0, 2.0, 0.0) == 2.0


def test_logical_order_is_finish_time_then_call_number():
    delays = {0: 0.5, 1: 0.2, 2: 0.1}
    assert logical_finish(1.0, [0, 1], delays) == pytest.approx(1.7)
    assert next_logical({4: (2.0, 0), 1: (1.5, 3), 2: (1.5, 1)}) == 2


def test_straggler_and_order_config_errors():
    with pytest.raises(ConfigError, match=r"population\.straggler\.scale_s"):
        pop_grpo(*BASE, "population.straggler.scale_s=-1")
    with pytest.raises(ConfigError, match=r"population\.straggler\.sigma"):
        pop_grpo(*BASE, "population.straggler.sigma=nan")
    with pytest.raises(ConfigError, match=r"scheduler\.order"):
        pop_grpo(*BASE, "scheduler.order=fastest")
    with pytest.raises(ConfigError, match=r"scheduler\.order=logical needs scheduler\.mode=async"):
        load_config(preset_path("pop_grpo"), ["scheduler.order=logical"])
    cli = [sys.executable, "-m", "popgrpo", "train", "--config", "pop_grpo", "--set", "population.straggler.sigma=-1"]
    res = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "straggler.sigma" in res.stderr


def test_stragglers_off_by_default_leave_the_config_as_it_was():
    cfg = load_config(preset_path("pop_grpo"))
    assert cfg.population.straggler.scale_s == 0.0 and cfg.scheduler.order == "arrival"


# ---- order: what a merge takes ------------------------------------------------------------


class _Reversed(LocalExecutor):
    """In-process members whose reports arrive newest call first (LIFO), not in call order."""

    def wait_train(self, handles):
        handles.insert(0, handles.pop())
        return super().wait_train(handles)


def test_the_order_reports_arrive_in_does_not_change_a_merge(tmp_path):
    """With S = 0 every merge takes every member's report: in reverse arrival order, the merges
    (ordered by score, then member id) and so the run are the same."""
    train(pop_grpo(*BASE), tmp_path / "fifo", progress=False)
    train(pop_grpo(*BASE), tmp_path / "lifo", executor_factory=lambda c, _d: _Reversed(c), progress=False)
    _assert_same_run(tmp_path / "fifo", tmp_path / "lifo")


def test_logical_order_takes_reports_by_their_seeded_delays_whatever_the_arrival(tmp_path):
    cfg = pop_grpo(*BASE, *STRAGGLERS, *BOUNDED, "scheduler.order=logical", "run.epochs=40")
    train(cfg, tmp_path / "fifo", progress=False)
    train(cfg, tmp_path / "lifo", executor_factory=lambda c, _d: _Reversed(c), progress=False)
    _assert_same_run(tmp_path / "fifo", tmp_path / "lifo")
    delays = [straggler_delay(42, k, 0, 0.05, 1.0) for k in range(5)]
    first = _lines(tmp_path / "fifo" / "merges.jsonl")[0]
    assert first == {"merge": 0, "actors": sorted(np.argsort(delays)[:2].tolist()), "members": first["actors"]}
    arrival = pop_grpo(*BASE, *STRAGGLERS, *BOUNDED, "run.epochs=40")  # in-process arrival: call order
    train(arrival, tmp_path / "arrival", progress=False)
    assert _lines(tmp_path / "arrival" / "merges.jsonl")[0]["actors"] == [0, 1]
    assert first["actors"] != [0, 1]  # seed 42's delays make the orders differ, so the test can tell


# ---- the event log and resume --------------------------------------------------------------


class _Crash(RuntimeError):
    pass


def _crash_in_adopt(merge: int, base=LocalExecutor):
    """An executor whose driver dies while carrying out merge ``merge`` (after it was logged)."""

    def factory(c, _run_dir):
        executor = base(c)
        adopt, seen = executor.adopt, []

        def adopt_then_crash(bases, adoptions, round_index):
            seen.append(round_index)
            if len(seen) == merge + 1:
                raise _Crash("driver lost mid-merge")
            return adopt(bases, adoptions, round_index)

        executor.adopt = adopt_then_crash  # type: ignore[method-assign]
        return executor

    return factory


def test_a_logged_merge_is_replayed_on_resume_whatever_arrives_first(tmp_path):
    """The driver dies carrying out merge 2: merges.jsonl holds it, the checkpoint does not.
    The resumed run's reports arrive in another order (which would make another merge), yet
    merge 2 takes the logged actors, with the same decision as the uninterrupted run."""
    import shutil

    cfg = pop_grpo(*BASE, *BOUNDED, "run.epochs=40")
    train(cfg, tmp_path / "whole", progress=False)
    with pytest.raises(_Crash):
        train(cfg, tmp_path / "run", executor_factory=_crash_in_adopt(2), progress=False)
    shutil.copytree(tmp_path / "run", tmp_path / "unlogged")
    logged = _lines(tmp_path / "run" / "merges.jsonl")
    assert [e["merge"] for e in logged] == [0, 1, 2]
    assert json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())["extra"]["async"]["merges"] == 2
    resume(tmp_path / "run", executor_factory=lambda c, _d: _Reversed(c), progress=False)
    resumed, whole = _lines(tmp_path / "run" / "lineage.jsonl"), _lines(tmp_path / "whole" / "lineage.jsonl")
    assert resumed[2]["async"]["members"] == logged[2]["members"] == whole[2]["async"]["members"]
    strip = lambda r: {k: v for k, v in r.items() if k != "async"}  # noqa: E731  (still_training follows arrival)
    assert [strip(r) for r in resumed[:3]] == [strip(r) for r in whole[:3]]
    assert _lines(tmp_path / "run" / "merges.jsonl")[:3] == logged  # rewritten once, not twice
    # Without the log, the same resume decides merge 2 live, from the reversed arrivals: another merge.
    (tmp_path / "unlogged" / "merges.jsonl").unlink()
    resume(tmp_path / "unlogged", executor_factory=lambda c, _d: _Reversed(c), progress=False)
    assert _lines(tmp_path / "unlogged" / "lineage.jsonl")[2]["async"]["members"] != logged[2]["members"]


def test_resume_with_logical_order_is_the_uninterrupted_run(tmp_path):
    cfg = pop_grpo(*BASE, *STRAGGLERS, *BOUNDED, "scheduler.order=logical", "run.epochs=40")
    train(cfg, tmp_path / "whole", progress=False)
    with pytest.raises(_Crash):
        train(cfg, tmp_path / "run", executor_factory=_crash_in_adopt(3), progress=False)
    resume(tmp_path / "run", executor_factory=lambda c, _d: _Reversed(c), progress=False)
    _assert_same_run(tmp_path / "whole", tmp_path / "run")


# ---- a tampered checkpoint -----------------------------------------------------------------


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """An async run whose driver died carrying out merge 2 (checkpoint at merge 1)."""
    run_dir = tmp_path_factory.mktemp("tamper") / "run"
    cfg = pop_grpo(*BASE, *BOUNDED, "run.epochs=40", "grpo.steps_per_epoch=4")
    with pytest.raises(_Crash):
        train(cfg, run_dir, executor_factory=_crash_in_adopt(2), progress=False)
    return run_dir


def _tampered(interrupted, tmp_path, change):
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(interrupted, run_dir)
    path = run_dir / "checkpoints" / "latest.json"
    latest = json.loads(path.read_text())
    change(latest["extra"]["async"], latest)
    path.write_text(json.dumps(latest))
    return run_dir


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a, _l: a.update(round_of=[0, 1]), r"extra\.async\.round_of: 2 entries for 5 member actors"),
        (lambda a, _l: a.update(merges="two"), r"extra\.async\.merges: "),
        (lambda a, _l: a.update(merges=7), r"extra\.async\.merges: 7 does not follow the checkpoint's round 1"),
        (lambda a, _l: a.update(base_of=[9] * 5), r"extra\.async\.base_of: a base past the last merge"),
        (lambda a, _l: a.update(in_flight=[0, 0]), r"extra\.async: finished and in_flight must hold each"),
        (lambda a, _l: a.update(keys=[[0.0, 1]]), r"extra\.async\.keys: one \(finish, call\) pair"),
        (lambda a, _l: a.update(keys=[["x", 1]] * len(a["in_flight"])), r"extra\.async\.keys\.0\.0: "),
        (lambda a, _l: a.update(rows=10**6), r"extra\.async\.rows: 1000000 rows, but metrics\.parquet holds"),
        (lambda a, _l: a.update(surprise=1), r"extra\.async\.surprise: "),
        (lambda a, latest: latest.pop("extra"), r"extra\.async: "),
        (lambda a, _l: a.update(round_of=[7] * 5), r"extra\.async\.round_of: a round past the run's last \(3\)"),
    ],
)
def test_a_tampered_async_state_is_refused_with_one_line(interrupted, tmp_path, change, message):
    run_dir = _tampered(interrupted, tmp_path, change)
    with pytest.raises(ResumeError, match=message) as err:
        resume(run_dir, progress=False)
    assert "\n" not in str(err.value)


def test_a_tampered_event_log_is_refused_and_the_cli_exits_2_with_one_line(interrupted, tmp_path):
    run_dir = _tampered(interrupted, tmp_path, lambda a, _l: None)
    with open(run_dir / "merges.jsonl", "a") as fh:
        fh.write('{"merge": 5, "actors": "all"}\n')
    with pytest.raises(ResumeError, match=r"merges\.jsonl line 4: not a merge decision"):
        resume(run_dir, progress=False)
    run_dir = _tampered(interrupted, tmp_path / "b", lambda a, _l: a.update(clock=-1.0))
    cli = [sys.executable, "-m", "popgrpo", "train", "--resume", str(run_dir), "--executor", "local", "--quiet"]
    res = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "extra.async.clock" in res.stderr
