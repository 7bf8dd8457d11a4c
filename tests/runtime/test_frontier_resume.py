"""The frontier store (scheduler.population=frontier) is part of the round checkpoint.

A run that dies and is resumed must return to the snapshots the uninterrupted run stored
before the crash, so it ends with the same numbers; a tampered store stops the resume with
exit 2 and one line.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from popgrpo.cli import main
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.telemetry.checkpoint import DRIVER_FILE
from popgrpo.train import resume, train
from tests.configs import SEEDED, pop_grpo

pytestmark = pytest.mark.heavy

BASE = [
    *SEEDED,
    "run.epochs=12",  # 6 rounds of 2 epochs
    "population.size=4",
    "scheduler.interval_epochs=2",
    "grpo.steps_per_epoch=1",
    "scheduler.population=frontier",
    "scheduler.frontier_capacity=3",
]


class _Crash(RuntimeError):
    pass


def _metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns=["seconds"], errors="ignore")


def _lineage(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines()]


def _crashing(method: str, after: int):
    """An in-process executor factory whose ``method`` raises on its call number ``after + 1``."""

    def factory(config, _run_dir):
        executor = LocalExecutor(config)
        original = getattr(executor, method)
        calls = {"n": 0}

        def crash_later(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] > after:
                raise _Crash("driver lost")
            return original(*args, **kwargs)

        setattr(executor, method, crash_later)
        return executor

    return factory


def _crashed_run(tmp_path: Path, *extra: str, method: str = "train", after: int = 3) -> tuple[Path, int]:
    """A frontier run killed mid-way (in-process); its directory and the round it resumes after."""
    run = tmp_path / "resumed"
    with pytest.raises(_Crash):
        train(pop_grpo(*BASE, *extra), run, executor_factory=_crashing(method, after), progress=False)
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())
    return run, latest["round"]


def _stored_before(lineage: list[dict], crash_round: int) -> set[str]:
    """Snapshot keys that rounds after ``crash_round`` returned to, stored at or before it."""
    return {
        key
        for rec in lineage
        if rec["round"] > crash_round
        for key in rec["returns"].values()
        if int(key.split(".")[0]) <= crash_round
    }


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resumed_frontier_run_equals_the_uninterrupted_one(tmp_path, mode):
    extra = () if mode == "sync" else ("scheduler.mode=async", "scheduler.buffer=2", "scheduler.max_staleness=1")
    train(pop_grpo(*BASE, *extra), tmp_path / "whole", progress=False)
    run, crash_round = _crashed_run(tmp_path, *extra, method="train" if mode == "sync" else "wait_train")
    checkpoint = run / "checkpoints" / f"round_{crash_round:04d}"
    assert (checkpoint / DRIVER_FILE).is_file()  # the store was not empty when the run died
    # The uninterrupted run later returns to a snapshot stored before the crash: a resumed run
    # that had lost its store could not.
    whole = _lineage(tmp_path / "whole")
    assert _stored_before(whole, crash_round)
    resume(run, progress=False)
    pd.testing.assert_frame_equal(_metrics(tmp_path / "whole"), _metrics(run))
    assert _lineage(run) == whole


def test_without_its_store_a_resumed_frontier_run_differs(tmp_path):
    """The check above can fail: the same resume from a checkpoint stripped of its store diverges."""
    train(pop_grpo(*BASE), tmp_path / "whole", progress=False)
    run, crash_round = _crashed_run(tmp_path)
    folder = run / "checkpoints" / f"round_{crash_round:04d}"
    (folder / DRIVER_FILE).unlink()
    for path in (run / "checkpoints" / "latest.json", folder / "manifest.json"):
        info = json.loads(path.read_text())
        del info["sha256"][DRIVER_FILE]
        path.write_text(json.dumps(info))
    resume(run, progress=False)
    assert _lineage(run) != _lineage(tmp_path / "whole")


def _tamper(run: Path, crash_round: int, change) -> None:
    """Rewrite the newest round's store with ``change(store)`` and make its hashes agree, as
    anyone who can write the run directory can."""
    folder = run / "checkpoints" / f"round_{crash_round:04d}"
    store = torch.load(folder / DRIVER_FILE, weights_only=True)
    change(store)
    torch.save(store, folder / DRIVER_FILE)
    digest = hashlib.sha256((folder / DRIVER_FILE).read_bytes()).hexdigest()
    for path in (run / "checkpoints" / "latest.json", folder / "manifest.json"):
        info = json.loads(path.read_text())
        info["sha256"][DRIVER_FILE] = digest
        path.write_text(json.dumps(info))


def _first_snapshot(store: dict) -> dict:
    return store["snapshots"][store["frontier"][0]["key"]]


TAMPERINGS = {
    "a snapshot of another shape": lambda s: _first_snapshot(s).update(
        {name: torch.zeros(3) for name in list(_first_snapshot(s))[:1]}
    ),
    "a snapshot with a NaN": lambda s: next(iter(_first_snapshot(s).values())).view(-1).__setitem__(0, float("nan")),
    "a parameter missing": lambda s: _first_snapshot(s).pop(next(iter(_first_snapshot(s)))),
    "a member outside the population": lambda s: s["frontier"][0].update(
        member=9, key=f"{s['frontier'][0]['round']}.9"
    ),
    "a round after the checkpoint's": lambda s: s["frontier"][0].update(
        round=99, key=f"99.{s['frontier'][0]['member']}"
    ),
    "a key that is not round.member": lambda s: s["frontier"][0].update(key="x"),
    "a snapshot without an entry": lambda s: s["snapshots"].update(extra=_first_snapshot(s)),
    "an entry with a field more": lambda s: s["frontier"][0].update(extra=1),
    "a count that is not an int": lambda s: s["frontier"][0].update(cells=1.5),
    "more entries than the capacity": lambda s: s["frontier"].extend([dict(s["frontier"][0])] * 3),
    "not a store at all": lambda s: s.clear(),
}


@pytest.mark.parametrize("what", list(TAMPERINGS))
def test_a_tampered_store_stops_the_resume_with_exit_2_and_one_line(tmp_path, capsys, what):
    run, crash_round = _crashed_run(tmp_path)
    _tamper(run, crash_round, TAMPERINGS[what])
    before = sorted(p.name for p in run.iterdir())
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--executor", "local", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("popgrpo: ") and "\n" not in err and "frontier store" in err, err
    assert f"checkpoint round {crash_round}" in err
    assert sorted(p.name for p in run.iterdir()) == before and not (run / "summary.json").exists()


def test_a_store_in_a_run_that_is_not_frontier_is_refused(tmp_path, capsys):
    run, _ = _crashed_run(tmp_path)
    config = (run / "config.yaml").read_text()
    assert "population: frontier" in config
    (run / "config.yaml").write_text(config.replace("population: frontier", "population: truncation"))
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--executor", "local", "--quiet"]) == 2
    assert "not 'frontier'" in capsys.readouterr().err


def test_the_store_is_copied_out_with_the_run(tmp_path):
    """The checkpoint holds the store's weights themselves: a copy of the run directory resumes alone."""
    train(pop_grpo(*BASE), tmp_path / "whole", progress=False)
    run, _ = _crashed_run(tmp_path)
    moved = tmp_path / "elsewhere"
    shutil.move(run, moved)
    resume(moved, progress=False)
    assert _lineage(moved) == _lineage(tmp_path / "whole")


@pytest.mark.ray
def test_on_ray_a_resumed_frontier_run_equals_the_uninterrupted_one(tmp_path, ray_local):
    """The same through RayExecutor (snapshots fetched from member actors, on the cluster the test started)."""
    from popgrpo.runtime.ray_executor import RayExecutor

    def crashing(config, run_dir):
        executor = RayExecutor(config, run_dir=run_dir)
        train_round, calls = executor.train, {"n": 0}

        def crash_later(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] > 3:
                raise _Crash("driver lost")
            return train_round(*args, **kwargs)

        executor.train = crash_later  # type: ignore[method-assign]
        return executor

    packed = "population.members_per_actor=2"  # 2 actors on the test's 2 CPUs; same numbers as unpacked
    train(pop_grpo(*BASE, packed), tmp_path / "whole", progress=False)
    run = tmp_path / "resumed"
    with pytest.raises(_Crash):
        train(pop_grpo(*BASE, packed), run, executor_factory=crashing, progress=False)
    crash_round = json.loads((run / "checkpoints" / "latest.json").read_text())["round"]
    assert (run / "checkpoints" / f"round_{crash_round:04d}" / DRIVER_FILE).is_file()
    resume(run, executor_factory=lambda c, d: RayExecutor(c, run_dir=d), progress=False)
    pd.testing.assert_frame_equal(_metrics(tmp_path / "whole"), _metrics(run))
    assert _lineage(run) == _lineage(tmp_path / "whole")
