"""Round checkpoints under ``RUN_DIR/checkpoints/`` and the elites table ``RUN_DIR/archive.parquet``.

Layout per round ``r``: ``checkpoints/round_<r>/member_<k>.pt`` (one per member: weights,
Adam, α, RNG state, counters), ``checkpoints/round_<r>/archive.pt`` (every archive's elites
and novelty memory), ``checkpoints/round_<r>/driver.pt`` (the round loop's frontier store,
only while it holds snapshots) and ``checkpoints/round_<r>/manifest.json`` (the SHA-256 of
each file).
``checkpoints/latest.json`` is replaced last, atomically, so it always names a complete round;
a run killed while writing round ``r`` resumes from round ``r − 1``. The driver writes every
file, so members on other nodes need no shared filesystem. A member whose state is the same
object as in the previous save (asynchronous rounds: a member that has not adopted a merge
since keeps its restore point) is not serialised again: its file is hard-linked from the
previous round's folder (copied where links are refused) and its hash carried over. States
handed to :meth:`Checkpointer.save` are never changed in place (the background writer
relies on that already), so the same object means the same bytes.

Loading treats a run directory as untrusted input (it may sit on shared storage others can
write): files are read with ``torch.load(weights_only=True)`` (tensors and plain containers,
no code; numpy arrays are stored as tensors for that reason), only from
``checkpoints/round_NNNN/`` (``latest.json``'s ``path`` cannot point elsewhere, symlinks out
are refused) and only when their bytes match the hashes. :meth:`Checkpointer.latest` falls
back to the newest intact round when the one ``latest.json`` names is not, and says why in
:attr:`Checkpointer.fallback`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from popgrpo.core.trees import map_leaves
from popgrpo.telemetry.atomic import atomic_path, atomic_write

__all__ = ["CheckpointError", "Checkpointer", "elites_table"]

_ROUND_DIR = re.compile(r"round_(\d{4,})")
_NDARRAY = "__ndarray__"  # marks a numpy array stored as a tensor
DRIVER_FILE = "driver.pt"  # the round loop's own state (the frontier store), when it has one


class CheckpointError(ValueError):
    """A checkpoint is missing, outside its run directory, or not what its hashes say."""


def _tensorise(obj: Any) -> Any:
    """numpy arrays → ``{"__ndarray__": tensor}`` (``weights_only`` loads refuse numpy pickles).

    Each array is copied: arrays that arrive from Ray share one read-only buffer, and
    ``torch.save`` refuses tensors that view the same memory as different dtypes.
    """
    return map_leaves(obj, np.ndarray, lambda a: {_NDARRAY: torch.from_numpy(np.array(a, order="C", copy=True))})


def _is_array(obj: object) -> TypeGuard[dict[str, torch.Tensor]]:
    """``obj`` is what :func:`_tensorise` made of a numpy array."""
    return isinstance(obj, dict) and len(obj) == 1 and _NDARRAY in obj


def _untensorise(obj: Any) -> Any:
    """:func:`_tensorise` undone: each ``{"__ndarray__": tensor}`` back to a numpy array."""
    return map_leaves(obj, _is_array, lambda marked: marked[_NDARRAY].numpy())


def _to_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(_tensorise(obj), buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes, name: str = "checkpoint") -> Any:
    """The object :func:`_to_bytes` saved (dicts, lists, arrays, tensors); CheckpointError if it is not one."""
    try:
        return _untensorise(torch.load(io.BytesIO(data), weights_only=True))
    except Exception as exc:  # the unpickler's refusals and a damaged file's errors alike
        raise CheckpointError(f"{name}: not a weights-only checkpoint: {str(exc).splitlines()[0][:300]}") from exc


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def elites_table(archive_states: Sequence[Mapping[str, Any]]) -> pa.Table:
    """One row per elite: ``archive, cell, behaviour, reward, idea`` (lists for vectors)."""
    rows: dict[str, list[Any]] = {"archive": [], "cell": [], "behaviour": [], "reward": [], "idea": []}
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
        self.fallback: str | None = None  # set by latest() when it could not use latest.json's round
        # member id → (the state object last saved, its file, its SHA-256): see the module docstring
        self._saved: dict[int, tuple[Mapping[str, Any], Path, str]] = {}
        self.linked = 0  # member files hard-linked or copied rather than serialised, over the saves

    def save(
        self,
        round_index: int,
        epoch_end: int,
        member_states: Sequence[Mapping[str, Any]],
        archive_states: Sequence[Mapping[str, Any]],
        extra: Mapping[str, Any] | None = None,
        driver: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write round ``round_index``'s checkpoint; ``extra`` (JSON-able) is kept in its manifest
        (asynchronous rounds keep where each member actor is there); ``driver`` (tensors and
        plain containers: the round loop's frontier store) goes to ``driver.pt``, hashed like
        the other files, and :meth:`load_driver` reads it back."""
        folder = self.root / f"round_{round_index:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        hashes: dict[str, str] = {}
        saved: dict[int, tuple[Mapping[str, Any], Path, str]] = {}
        for state in member_states:
            member_id = int(state["member_id"])
            name = f"member_{member_id:04d}.pt"
            path = folder / name
            before = self._saved.get(member_id)
            if before is not None and before[0] is state and self._reuse(before[1], path):
                hashes[name] = before[2]
                self.linked += 1
            else:
                data = _to_bytes(state)
                atomic_write(path, data)
                hashes[name] = _sha256(data)
            saved[member_id] = (state, path, hashes[name])
        data = _to_bytes(list(archive_states))
        atomic_write(folder / "archive.pt", data)
        hashes["archive.pt"] = _sha256(data)
        if driver is not None:
            data = _to_bytes(dict(driver))
            atomic_write(folder / DRIVER_FILE, data)
            hashes[DRIVER_FILE] = _sha256(data)
        table = elites_table(archive_states)
        with atomic_path(self.run_dir / "archive.parquet") as tmp:
            pq.write_table(table, tmp)
        latest = {
            "round": round_index,
            "epoch_end": epoch_end,
            "members": len(member_states),
            "path": folder.name,
            "sha256": hashes,
        }
        if extra is not None:
            latest["extra"] = dict(extra)
        atomic_write(folder / "manifest.json", json.dumps(latest).encode())
        atomic_write(self.root / "latest.json", json.dumps(latest).encode())
        self._saved = saved
        self._prune(round_index)
        return folder

    @staticmethod
    def _reuse(source: Path, target: Path) -> bool:
        """Put ``source``'s file at ``target`` (a hard link, or a copy where the filesystem refuses
        links), atomically; False when ``source`` is gone or is no longer a plain file (replaced by a
        symlink: never followed), and then the state is written anew."""
        if source.is_symlink() or not source.is_file():
            return False
        if source == target:
            return True
        try:
            with atomic_path(target) as tmp:
                tmp.unlink(missing_ok=True)
                try:
                    os.link(source, tmp)
                except OSError as exc:
                    if not source.is_file():
                        raise FileNotFoundError(source) from exc
                    shutil.copyfile(source, tmp)
        except FileNotFoundError:
            return False
        return True

    def _prune(self, newest: int) -> None:
        """Keep the newest ``keep`` checkpoints up to round ``newest`` (by count, not by round
        number: with ``run.checkpoint_every`` the rounds between them have none)."""
        rounds = sorted(
            (int(m.group(1)), folder)
            for folder in self.root.glob("round_*")
            if (m := _ROUND_DIR.fullmatch(folder.name)) and int(m.group(1)) <= newest
        )
        for _, folder in rounds[: -self.keep]:
            shutil.rmtree(folder, ignore_errors=True)

    # ---- loading ------------------------------------------------------------------------
    def _folder(self, info: dict) -> Path:
        """``checkpoints/round_NNNN`` named by ``info``, refused unless it is exactly that."""
        path, round_index = info.get("path"), info.get("round")
        if not isinstance(round_index, int) or not isinstance(path, str) or path != f"round_{round_index:04d}":
            raise CheckpointError(f"checkpoint path {path!r} is not checkpoints/round_NNNN of round {round_index!r}")
        folder = self.root / path
        if folder.is_symlink() or folder.resolve().parent != self.root.resolve():
            raise CheckpointError(f"{folder} leads outside {self.root}")
        return folder

    def _read(self, info: dict, name: str) -> bytes:
        """The bytes of one file of a round, checked against the round's hashes."""
        expected = (info.get("sha256") or {}).get(name)
        if not isinstance(expected, str):
            raise CheckpointError(f"no hash for {name} in round {info.get('round')!r}")
        path = self._folder(info) / name
        if path.is_symlink():
            raise CheckpointError(f"{path} is a symlink")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        if _sha256(data) != expected:
            raise CheckpointError(f"{path} does not match its SHA-256 (modified or damaged)")
        return data

    def _names(self, info: dict) -> list[str]:
        members = info.get("members")
        if not isinstance(members, int) or members < 0:
            raise CheckpointError(f"round {info.get('round')!r}: bad member count {members!r}")
        return [f"member_{k:04d}.pt" for k in range(members)] + ["archive.pt"]

    def _check(self, info: dict) -> dict:
        """``info`` if every file of its round is there, matches its hash and loads without code."""
        for name in self._names(info) + ([DRIVER_FILE] if self._has_driver(info) else []):
            _from_bytes(self._read(info, name), name)
        return info

    @staticmethod
    def _has_driver(info: dict) -> bool:
        hashes = info.get("sha256")
        return isinstance(hashes, dict) and DRIVER_FILE in hashes

    def latest(self) -> dict | None:
        """The newest intact round's info (``round, epoch_end, members, path, sha256``), or None.

        Normally the round ``latest.json`` names; when that round is damaged, tampered with or
        points outside ``checkpoints/``, the newest round whose manifest and files agree, with
        the reason in :attr:`fallback`. None when no round is intact (``fallback`` says why if
        there were checkpoints at all).
        """
        self.fallback = None
        path = self.root / "latest.json"
        problem = None
        if path.exists():
            try:
                info = json.loads(path.read_text())
                if not isinstance(info, dict):
                    raise CheckpointError("latest.json is not an object")
                return self._check(info)
            except (CheckpointError, ValueError, OSError) as exc:
                problem = f"latest.json: {exc}"
        rounds = sorted(
            (int(m.group(1)), folder)
            for folder in (self.root.glob("round_*") if self.root.is_dir() else [])
            if (m := _ROUND_DIR.fullmatch(folder.name))
        )
        if problem is None:
            if not rounds:
                return None
            problem = "latest.json is missing"
        for round_index, folder in reversed(rounds):
            try:
                info = json.loads((folder / "manifest.json").read_text())
                if not isinstance(info, dict) or info.get("round") != round_index:
                    raise CheckpointError(f"{folder.name}/manifest.json names another round")
                self._check(info)
            except (CheckpointError, ValueError, OSError) as exc:
                problem = f"{problem}; {folder.name}: {exc}" if problem else f"{folder.name}: {exc}"
                continue
            if problem is not None:
                self.fallback = f"{problem}; using round {round_index}, the newest intact one"
            return info
        self.fallback = f"{problem or 'latest.json is missing'}; no intact round, starting from the beginning"
        return None

    def load(self, info: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        """The members' states and :meth:`load_archives` of the round ``info`` names."""
        members = [_from_bytes(self._read(info, name), name) for name in self._names(info)[:-1]]
        return members, self.load_archives(info)

    def load_driver(self, info: dict[str, Any]) -> Any:
        """The round loop's state saved with the round ``info`` names (``driver``), or None if none was.

        Loaded like every other file (hash checked, no code run); what it holds is for the
        round loop to check (:func:`popgrpo.runtime.scheduler.frontier_store`).
        """
        return _from_bytes(self._read(info, DRIVER_FILE), DRIVER_FILE) if self._has_driver(info) else None

    def load_archives(self, info: dict[str, Any]) -> list[Any]:
        """The archive services' ``state_dict()``s as saved, one per archive."""
        return _from_bytes(self._read(info, "archive.pt"), "archive.pt")
