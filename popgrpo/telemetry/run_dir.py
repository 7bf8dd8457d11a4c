"""Everything a run writes lives under its run directory.

``config.yaml`` (resolved), ``metrics.parquet`` (one row per member per epoch),
``metrics.parts/`` (while a run trains: one Parquet part per round, appended; the run's end
compacts them into ``metrics.parquet``), ``lineage.jsonl`` (one line per scheduler round), ``merges.jsonl`` (asynchronous rounds: each
merge's decision, written before it is carried out), ``summary.json`` (Table-1 numbers),
``training_dynamics.png``. Files are replaced atomically (write, then rename), so a run
that dies mid-write leaves the previous complete version, never half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from popgrpo.columns import metrics_schema
from popgrpo.config import Config, ConfigError
from popgrpo.telemetry.atomic import atomic_path, atomic_write

__all__ = ["RunDirectory", "default_run_dir", "metrics_schema", "writable_directory"]

PARTS_DIR = "metrics.parts"
_PART = re.compile(r"part-(\d{6,})\.parquet")
# metrics.parquet's schema metadata: the last part number its rows include (parts up to it
# are already in the file: a run killed between writing it and deleting them reads each row once)
_THROUGH = b"popgrpo.parts_through"


def default_run_dir(config: Config, root: str | Path = "runs") -> Path:
    """``runs/<run.name>-<timestamp>``: where a run goes without ``--out``."""
    return Path(root) / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def writable_directory(path: Path, label: str) -> Path:
    """``path``, created now if missing: a directory the user named that cannot be created or
    written is bad input (:class:`ConfigError`, exit 2), not a failure halfway through the
    work. ``label`` names it in the message (``"run directory"``, ``"--out"``)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{label} {path}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{label} {path}: not writable")
    return path


class RunDirectory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def create(self) -> RunDirectory:
        if self.has_metrics():
            raise FileExistsError(f"{self.path} already holds a run; choose another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        # One line per round that ends in a merge: a run of one round (or without population
        # rounds) has none, and its lineage.jsonl is empty rather than missing.
        (self.path / "lineage.jsonl").touch()
        return self

    def _replace(self, name: str, data: bytes | str) -> Path:
        return atomic_write(self.path / name, data)

    def write_config(self, config: Config) -> Path:
        return self._replace("config.yaml", config.to_yaml())

    # ---- metrics: a compacted file plus the parts appended since ------------------------------
    def _parts(self) -> list[tuple[int, Path]]:
        """``metrics.parts/part-NNNNNN.parquet`` files, by number."""
        folder = self.path / PARTS_DIR
        if not folder.is_dir():
            return []
        return sorted((int(m.group(1)), f) for f in folder.iterdir() if (m := _PART.fullmatch(f.name)))

    @staticmethod
    def _table(rows: list[dict]) -> pa.Table:
        # Rows read back by a resumed run carry pandas' NaN where a text column (reward_reasons,
        # code_problems, …) was null: null again.
        schema = metrics_schema()
        text = [f.name for f in schema if pa.types.is_string(f.type)]

        def nulls(row: dict) -> dict:
            nan = [c for c in text if isinstance(row.get(c), float)]
            return {**row, **dict.fromkeys(nan)} if nan else row

        return pa.Table.from_pylist([nulls(r) for r in rows], schema=schema)

    def _write_compacted(self, table: pa.Table, through: int) -> Path:
        target = self.path / "metrics.parquet"
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), _THROUGH: str(through).encode()})
        with atomic_path(target) as tmp:
            pq.write_table(table, tmp)
        for number, part in self._parts():  # after the file that holds them
            if number <= through:
                part.unlink(missing_ok=True)
        return target

    def write_metrics(self, rows: list[dict]) -> Path:
        """Replace every metrics row with ``rows`` (a resumed run keeps those before its checkpoint)."""
        parts = self._parts()
        return self._write_compacted(self._table(rows), parts[-1][0] if parts else -1)

    def append_metrics(self, rows: list[dict]) -> Path:
        """Append ``rows`` as the next part (one file, written atomically); the whole file is not rewritten."""
        parts = self._parts()
        number = max(parts[-1][0] if parts else -1, self._compacted_through()) + 1
        folder = self.path / PARTS_DIR
        folder.mkdir(exist_ok=True)
        target = folder / f"part-{number:06d}.parquet"
        with atomic_path(target) as tmp:
            pq.write_table(self._table(rows), tmp)
        return target

    def has_metrics(self) -> bool:
        """Whether any metrics were written (compacted or in parts)."""
        return (self.path / "metrics.parquet").exists() or bool(self._parts())

    def _compacted_through(self) -> int:
        path = self.path / "metrics.parquet"
        if not path.exists():
            return -1
        metadata = pq.read_schema(path).metadata or {}
        return int(metadata.get(_THROUGH, b"-1"))

    def read_metrics_table(self) -> pa.Table:
        """Every metrics row written, in the order written: ``metrics.parquet``, then the parts after it."""
        path = self.path / "metrics.parquet"
        through = self._compacted_through()
        tables = [pq.read_table(path).replace_schema_metadata(None)] if path.exists() else []
        tables += [pq.read_table(part) for number, part in self._parts() if number > through]
        if not tables:
            raise FileNotFoundError(f"{path}: no metrics written")
        return pa.concat_tables([t.cast(metrics_schema()) for t in tables])

    def compact_metrics(self) -> Path | None:
        """Fold the parts into ``metrics.parquet`` (None: nothing was ever written)."""
        parts = self._parts()
        if not parts:
            return self.path / "metrics.parquet" if (self.path / "metrics.parquet").exists() else None
        path = self._write_compacted(self.read_metrics_table(), parts[-1][0])
        with contextlib.suppress(OSError):  # a leftover temporary file: the next append replaces it
            (self.path / PARTS_DIR).rmdir()
        return path

    def append_lineage(self, record: dict) -> None:
        with open(self.path / "lineage.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def append_merge(self, entry: dict) -> None:
        """Asynchronous rounds' event log: one merge's decision (``merge``, ``actors``,
        ``members``), on disk (fsynced) before the merge is carried out."""
        with open(self.path / "merges.jsonl", "a") as fh:
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def take_merges(self, first: int) -> dict[int, list[int]]:
        """Drop the logged merges numbered ``first`` or later (decided, not checkpointed) from
        ``merges.jsonl`` and return them, merge number → actors, for the resumed run to replay.

        Raises ``ValueError`` (one line) on a line that is not such a decision.
        """
        path = self.path / "merges.jsonl"
        if not path.exists():
            return {}
        kept, dropped = [], {}
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"merges.jsonl line {n}: not JSON ({exc.msg})") from None
            merge, actors = (entry.get("merge"), entry.get("actors")) if isinstance(entry, dict) else (None, None)
            if (
                not isinstance(merge, int)
                or isinstance(merge, bool)
                or merge < 0
                or not isinstance(actors, list)
                or not actors
                or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in actors)
            ):
                raise ValueError(
                    f"merges.jsonl line {n}: not a merge decision (an int merge >= 0 and a list of actors)"
                )
            if merge < first:
                kept.append(line)
            else:
                dropped[merge] = actors
        self._replace("merges.jsonl", "".join(f"{line}\n" for line in kept))
        return dropped

    def append_event(self, event: dict) -> None:
        """A failure or recovery, one JSON line in ``events.jsonl``: never silent."""
        with open(self.path / "events.jsonl", "a") as fh:
            fh.write(json.dumps(event) + "\n")

    def count_events(self, kind: str, cause: str | None = None) -> int:
        """Events of ``kind`` in ``events.jsonl`` (with ``cause``: only those whose cause it is)."""
        path = self.path / "events.jsonl"
        if not path.exists():
            return 0
        events = [json.loads(line) for line in path.read_text().splitlines() if line]
        return sum(e["event"] == kind and (cause is None or e.get("cause") == cause) for e in events)

    def truncate_lineage(self, max_round: int) -> None:
        """Keep only the lineage lines of rounds ``<= max_round`` (for a resumed run)."""
        path = self.path / "lineage.jsonl"
        if not path.exists():
            return
        kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["round"] <= max_round]
        self._replace("lineage.jsonl", "".join(f"{line}\n" for line in kept))

    def write_summary(self, summary: dict) -> Path:
        return self._replace("summary.json", json.dumps(summary, indent=2) + "\n")

    def read_metrics(self):
        return self.read_metrics_table().to_pandas()
