"""Round checkpoints under ``RUN_DIR/checkpoints/`` and the elites table ``RUN_DIR/archive.parquet``.

Layout per round ``r``: ``checkpoints/round_<r>/member_<k>.pt`` (one per member: weights,
Adam, α, RNG state, counters) and ``checkpoints/round_<r>/archive.pt`` (every archive's elites
and novelty memory). ``checkpoints/latest.json`` is replaced last, atomically, so it always
names a complete round; a run killed while writing round ``r`` resumes from round ``r − 1``.
The driver writes every file, so members on other nodes need no shared filesystem.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

__all__ = ["Checkpointer", "elites_table"]


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _to_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def elites_table(archive_states: Sequence[dict]) -> pa.Table:
    """One row per elite: ``archive, cell, behaviour, reward, idea`` (lists for vectors)."""
    rows = {"archive": [], "cell": [], "behaviour": [], "reward": [], "idea": []}
    for index, state in enumerate(archive_states):
        elites = state["archive"]
        n = len(elites["reward"])
        rows["archive"] += [index] * n
        rows["cell"] += np.asarray(elites["cell"]).tolist()
        rows["behaviour"] += np.asarray(elites["behaviour"]).tolist()
        rows["reward"] += np.asarray(elites["reward"]).tolist()
        rows["idea"] += np.asarray(elites["idea"]).tolist()
    return pa.table(rows)


class Checkpointer:
    def __init__(self, run_dir: str | Path, keep: int = 2) -> None:
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "checkpoints"
        self.keep = keep

    def save(
        self, round_index: int, epoch_end: int, member_states: Sequence[dict], archive_states: Sequence[dict]
    ) -> Path:
        folder = self.root / f"round_{round_index:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        for state in member_states:
            _atomic_write(folder / f"member_{state['member_id']:04d}.pt", _to_bytes(state))
        _atomic_write(folder / "archive.pt", _to_bytes(list(archive_states)))
        table = elites_table(archive_states)
        tmp = self.run_dir / ".archive.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.run_dir / "archive.parquet")
        latest = {"round": round_index, "epoch_end": epoch_end, "members": len(member_states), "path": folder.name}
        _atomic_write(self.root / "latest.json", json.dumps(latest).encode())
        self._prune(round_index)
        return folder

    def _prune(self, newest: int) -> None:
        for folder in sorted(self.root.glob("round_*")):
            if int(folder.name.split("_")[1]) <= newest - self.keep:
                shutil.rmtree(folder, ignore_errors=True)

    def latest(self) -> dict | None:
        path = self.root / "latest.json"
        return json.loads(path.read_text()) if path.exists() else None

    def load(self, info: dict) -> tuple[list[dict], list[dict]]:
        folder = self.root / info["path"]
        members = [torch.load(folder / f"member_{k:04d}.pt", weights_only=False) for k in range(int(info["members"]))]
        return members, self.load_archives(info)

    def load_archives(self, info: dict) -> list[dict]:
        return torch.load(self.root / info["path"] / "archive.pt", weights_only=False)
