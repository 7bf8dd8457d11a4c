"""A member whose state object is the one saved last is hard-linked into the new round, not serialised again."""

from __future__ import annotations

import json

import numpy as np
import torch

from popgrpo.telemetry.checkpoint import Checkpointer


def _member(k: int, value: float) -> dict:
    return {"member_id": k, "policy": {"w": torch.full((4,), value)}, "alpha": 0.1, "epochs_done": 1}


ARCHIVES = [
    {
        "archive": {
            "cells_per_dim": 2,
            "ranges": ((0.0, 1.0),),
            "cell": np.array([1], dtype=np.int64),
            "behaviour": np.array([[0.7]]),
            "reward": np.array([0.5]),
            "idea": np.zeros((1, 3)),
        },
        "memory": {"capacity": 2, "k": 1, "ideas": np.ones((1, 3), dtype=np.float32)},
    }
]


def test_an_unchanged_state_is_linked_and_a_new_one_written(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=3)
    kept, moved = _member(0, 1.0), _member(1, 2.0)
    ckpt.save(0, 2, [kept, moved], ARCHIVES)
    ckpt.save(1, 4, [kept, _member(1, 3.0)], ARCHIVES)  # member 1 adopted a merge, member 0 did not
    old, new = ckpt.root / "round_0000", ckpt.root / "round_0001"
    assert (new / "member_0000.pt").stat().st_ino == (old / "member_0000.pt").stat().st_ino
    assert (new / "member_0001.pt").stat().st_ino != (old / "member_0001.pt").stat().st_ino
    assert ckpt.linked == 1
    info = ckpt.latest()
    assert ckpt.fallback is None and info["round"] == 1
    members, _ = ckpt.load(info)
    assert torch.equal(members[0]["policy"]["w"], torch.full((4,), 1.0))
    assert torch.equal(members[1]["policy"]["w"], torch.full((4,), 3.0))
    manifests = [json.loads((folder / "manifest.json").read_text()) for folder in (old, new)]
    assert manifests[0]["sha256"]["member_0000.pt"] == manifests[1]["sha256"]["member_0000.pt"]


def test_an_equal_but_new_state_object_is_written_again(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(0, 2, [_member(0, 1.0)], ARCHIVES)
    ckpt.save(1, 4, [_member(0, 1.0)], ARCHIVES)
    assert ckpt.linked == 0
    assert (ckpt.root / "round_0001" / "member_0000.pt").stat().st_nlink == 1


def test_a_linked_file_outlives_the_pruned_round_it_came_from(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=1)
    state = _member(0, 5.0)
    ckpt.save(0, 2, [state], ARCHIVES)
    ckpt.save(1, 4, [state], ARCHIVES)
    assert not (ckpt.root / "round_0000").exists() and ckpt.linked == 1
    members, _ = ckpt.load(ckpt.latest())
    assert ckpt.fallback is None and torch.equal(members[0]["policy"]["w"], torch.full((4,), 5.0))


def test_a_source_file_gone_before_the_next_save_is_written_anew(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=3)
    state = _member(0, 5.0)
    ckpt.save(0, 2, [state], ARCHIVES)
    (ckpt.root / "round_0000" / "member_0000.pt").unlink()
    ckpt.save(1, 4, [state], ARCHIVES)
    assert ckpt.linked == 0
    members, _ = ckpt.load(ckpt.latest())
    assert torch.equal(members[0]["policy"]["w"], torch.full((4,), 5.0))


def test_changing_a_linked_file_in_place_is_caught_by_its_hash(tmp_path):
    """The link shares the older round's bytes: tampering with those reaches the new round too,
    and the new round's manifest (the hash carried over) refuses it."""
    ckpt = Checkpointer(tmp_path, keep=3)
    state = _member(0, 5.0)
    ckpt.save(0, 2, [state], ARCHIVES)
    ckpt.save(1, 4, [state], ARCHIVES)
    with open(ckpt.root / "round_0000" / "member_0000.pt", "r+b") as f:  # the same inode as round 1's
        f.seek(-8, 2)
        f.write(b"\0" * 8)
    info = ckpt.latest()
    assert info is None and "member_0000.pt" in (ckpt.fallback or "")


def test_a_source_replaced_by_a_symlink_is_not_followed(tmp_path):
    """Someone who can write the run directory swaps the last round's file for a link to a file
    elsewhere: the next checkpoint writes the member's state anew instead of linking that file."""
    ckpt = Checkpointer(tmp_path / "run", keep=3)
    state = _member(0, 5.0)
    ckpt.save(0, 2, [state], ARCHIVES)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not a checkpoint")
    source = ckpt.root / "round_0000" / "member_0000.pt"
    source.unlink()
    source.symlink_to(outside)
    ckpt.save(1, 4, [state], ARCHIVES)
    written = ckpt.root / "round_0001" / "member_0000.pt"
    assert ckpt.linked == 0 and not written.is_symlink()
    assert written.stat().st_ino != outside.stat().st_ino
    members, _ = ckpt.load(ckpt.latest())
    assert ckpt.fallback is None and torch.equal(members[0]["policy"]["w"], torch.full((4,), 5.0))
