"""A run directory is untrusted input: checkpoints load no code, stay inside it, and are checked.

The attacks are the issue's: a crafted pickle in ``member_0000.pt`` (with ``latest.json``'s hash
rewritten to match, as anyone who can write the folder can), and ``latest.json``'s ``path``
pointing out of the run directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from popgrpo.config import load_config, preset_path
from popgrpo.telemetry.checkpoint import Checkpointer, CheckpointError
from popgrpo.train import resume, train


class _Payload:
    """Unpickling this creates ``self.path``: proof that the pickle ran code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _states(n: int = 2):
    members = [
        {"member_id": k, "policy": {"w": torch.full((3,), float(k))}, "alpha": 0.1, "epochs_done": 2} for k in range(n)
    ]
    archives = [
        {
            "archive": {
                "cells_per_dim": 4,
                "ranges": ((0.0, 1.0), (0.0, 1.0)),
                "cell": np.array([1, 5], dtype=np.int64),
                "behaviour": np.array([[0.1, 0.2], [0.3, 0.6]]),
                "reward": np.array([0.5, 0.7]),
                "idea": np.zeros((2, 3)),
            },
            "memory": {"capacity": 8, "k": 2, "ideas": np.ones((2, 3), dtype=np.float32)},
        }
    ]
    return members, archives


def _saved(tmp_path, rounds: int = 2) -> Checkpointer:
    ckpt = Checkpointer(tmp_path / "run", keep=3)
    (tmp_path / "run").mkdir()
    for r in range(rounds):
        ckpt.save(r, 2 * (r + 1), *_states())
    return ckpt


def _rewrite_hash(ckpt: Checkpointer, round_index: int, name: str) -> None:
    """What an attacker with write access does after replacing a file: make the hashes agree."""
    digest = hashlib.sha256((ckpt.root / f"round_{round_index:04d}" / name).read_bytes()).hexdigest()
    for path in (ckpt.root / "latest.json", ckpt.root / f"round_{round_index:04d}" / "manifest.json"):
        info = json.loads(path.read_text())
        if info["round"] == round_index:
            info["sha256"][name] = digest
            path.write_text(json.dumps(info))


def test_round_trip_keeps_numpy_arrays_and_tensors(tmp_path):
    ckpt = _saved(tmp_path, rounds=1)
    info = ckpt.latest()
    assert ckpt.fallback is None and info["path"] == "round_0000" and set(info["sha256"]) >= {"archive.pt"}
    members, archives = ckpt.load(info)
    expected_members, expected_archives = _states()
    assert torch.equal(members[1]["policy"]["w"], expected_members[1]["policy"]["w"])
    got, want = archives[0]["archive"], expected_archives[0]["archive"]
    assert isinstance(got["behaviour"], np.ndarray) and np.array_equal(got["behaviour"], want["behaviour"])
    assert got["cell"].dtype == np.int64 and got["ranges"] == want["ranges"]


def test_a_crafted_pickle_runs_no_code(tmp_path):
    ckpt = _saved(tmp_path)
    proof = tmp_path / "pickle-ran"
    member = ckpt.root / "round_0001" / "member_0000.pt"
    member.write_bytes(pickle.dumps(_Payload(str(proof))))
    _rewrite_hash(ckpt, 1, "member_0000.pt")
    with pytest.raises(CheckpointError, match="not a weights-only checkpoint"):
        ckpt.load(json.loads((ckpt.root / "latest.json").read_text()))
    info = ckpt.latest()  # falls back to the round before
    assert info["round"] == 0 and "member_0000.pt" in ckpt.fallback
    assert not proof.exists()
    # torch's own format with a code-running object inside is refused too
    torch.save({"member_id": 0, "x": _Payload(str(proof))}, member)
    _rewrite_hash(ckpt, 1, "member_0000.pt")
    assert ckpt.latest()["round"] == 0
    assert not proof.exists()


def test_latest_json_cannot_point_out_of_the_run(tmp_path):
    ckpt = _saved(tmp_path)
    evil = tmp_path / "evil_ckpt"
    shutil.copytree(ckpt.root / "round_0001", evil)
    info = json.loads((ckpt.root / "latest.json").read_text())
    for path in ["../../evil_ckpt", str(evil), "round_0001/../../../evil_ckpt", "round_0000"]:
        (ckpt.root / "latest.json").write_text(json.dumps({**info, "path": path}))
        with pytest.raises(CheckpointError):
            ckpt.load({**info, "path": path})
        assert ckpt.latest()["path"] == "round_0001"  # the newest intact round of its own manifest
        assert "latest.json" in ckpt.fallback
    # a round folder that is a symlink out of checkpoints/
    shutil.rmtree(ckpt.root / "round_0001")
    os.symlink(evil, ckpt.root / "round_0001")
    assert ckpt.latest()["round"] == 0
    assert "leads outside" in ckpt.fallback


def test_a_damaged_newest_round_resumes_from_the_one_before_with_an_event(tmp_path):
    config = load_config(
        preset_path("pop_grpo"),
        [
            "run.epochs=6",
            "scheduler.interval_epochs=2",
            "grpo.steps_per_epoch=2",
            "population.size=3",
            "run.checkpoint_keep=3",
        ],
    )
    full = train(config, tmp_path / "full", progress=False)
    run = tmp_path / "run"
    shutil.copytree(tmp_path / "full", run)
    (run / "summary.json").unlink()  # as if killed after its last checkpoint
    newest = run / "checkpoints" / "round_0002" / "archive.pt"
    newest.write_bytes(newest.read_bytes()[:-10])  # truncated: its hash no longer matches
    summary = resume(run, progress=False)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["checkpoint_fallback"]
    assert events[0]["round"] == 1 and "archive.pt" in events[0]["reason"]
    assert summary == full  # round 2 was trained again, to the same numbers
    pd.testing.assert_frame_equal(
        pd.read_parquet(run / "metrics.parquet"), pd.read_parquet(tmp_path / "full" / "metrics.parquet")
    )
