"""Seed-42 fingerprints of every simulated-environment preset: is a refactor behaviour-preserving?

Trains each preset in this process (``--executor local``, no Ray) for ``--epochs`` epochs at
seed 42 and prints, per run, a SHA-256 of ``metrics.parquet``'s values (every column, every
row, in order; wall-clock columns excluded) and of ``archive.parquet``'s. Two trees give the
same fingerprints exactly when their runs wrote the same numbers bit for bit.

    python -m benchmarks.fingerprint --out /tmp/before.json
    python -m benchmarks.fingerprint --out /tmp/after.json --compare /tmp/before.json

The JSON also records a digest per column (``columns``), so that a change which only adds
columns can be told from one that changes behaviour. ``--compare`` against such a baseline
passes when every baseline column of every run is bit-identical, names the columns a run
added, and exits 1 naming every run with a changed or removed column. Against an older
baseline without per-column digests it compares whole-frame digests, as before (an added
column then reads as a difference). Presets of a language-model policy (``lm_*``,
``code_programs``: a policy whose registry entry samples text) need a model directory and are
left out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

PRESET_DIR = Path(__file__).resolve().parents[1] / "jobs" / "configs"
# Columns that measure time, not what was computed.
TIMING_COLUMNS = ("seconds", "wall", "time", "timestamp", "duration")
# Variants that take another code path than their preset's defaults.
VARIANTS = {
    "pop_grpo_vectorised": ("pop_grpo", ["population.vectorize=true"]),
    "pop_grpo_svd_task_arithmetic": ("pop_grpo", ["scheduler.mutate=svd", "scheduler.merge=task_arithmetic"]),
    "pop_grpo_wise_ft": ("pop_grpo", ["scheduler.merge=wise_ft"]),
}


def _untimed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[[c for c in frame.columns if not any(t in c for t in TIMING_COLUMNS)]]


def _value_bytes(values: pd.Series) -> bytes:
    """The bytes a column's digest is taken over: pandas' per-row hashes, or JSON of the cells."""
    try:
        return pd.util.hash_pandas_object(values, index=False).to_numpy().tobytes()
    except TypeError:  # lists or dicts in cells
        return json.dumps(values.tolist(), default=str, sort_keys=True).encode()


def frame_digest(path: Path) -> str:
    """SHA-256 of a Parquet file's column names and values, timing columns excluded."""
    frame = _untimed(pd.read_parquet(path))
    digest = hashlib.sha256(json.dumps(list(frame.columns)).encode())
    for column in frame.columns:
        digest.update(_value_bytes(frame[column]))
    return digest.hexdigest()


def column_digests(path: Path) -> dict[str, str]:
    """SHA-256 of each column's values (name excluded), timing columns excluded: {column: hex}."""
    frame = _untimed(pd.read_parquet(path))
    return {str(c): hashlib.sha256(_value_bytes(frame[c])).hexdigest() for c in frame.columns}


def compare_run(before: dict | None, after: dict) -> tuple[list[str], list[str]]:
    """Compare one run's fingerprints: (what changed or went missing, columns added).

    ``before`` with a ``columns`` entry is compared column by column: a baseline column whose
    digest differs or that is absent reads ``"table.column"`` in the first list, a column
    only ``after`` has reads ``"table.column"`` in the second. ``before`` without it (an older
    baseline) is compared by whole-frame digest per table, as before; ``None`` (a run the
    baseline lacks) is a difference.
    """
    if before is None:
        return ["(run missing from the baseline)"], []
    tables = sorted({k for k in (*before, *after) if k != "columns"})
    if "columns" not in before:
        return [t for t in tables if before.get(t) != after.get(t)], []
    changed: list[str] = []
    added: list[str] = []
    old_columns: dict[str, dict[str, str]] = before["columns"]
    new_columns: dict[str, dict[str, str]] = after.get("columns", {})
    for table in sorted({*old_columns, *new_columns}):
        old, new = old_columns.get(table), new_columns.get(table)
        if old is None or new is None:
            changed.append(f"{table} (table {'added' if old is None else 'missing'})")
            continue
        changed += [f"{table}.{c}" for c in old if new.get(c) != old[c]]
        added += [f"{table}.{c}" for c in new if c not in old]
    return changed, added


def compare(before: dict[str, dict], after: dict[str, dict]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Compare every run of ``after`` with ``before``: ({run: changed}, {run: added columns})."""
    differ: dict[str, list[str]] = {}
    added: dict[str, list[str]] = {}
    for name, result in after.items():
        changed, new = compare_run(before.get(name), result)
        if changed:
            differ[name] = changed
        if new:
            added[name] = new
    return differ, added


def _samples_text(preset: Path) -> bool:
    """The preset's policy samples text (a causal LM, which needs a model directory)."""
    from popgrpo.config import load_config
    from popgrpo.registry import POLICIES, TEXT_IDEAS, ideas_of

    return ideas_of(POLICIES, load_config(preset).policy.kind) == TEXT_IDEAS


def runs(epochs: int) -> dict[str, tuple[str, list[str]]]:
    presets = sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if not _samples_text(p))
    plan = {name: (name, []) for name in presets}
    plan.update(VARIANTS)
    return {
        name: (preset, [*extra, "run.seed=42", f"run.epochs={epochs}", "run.loggers=[]"])
        for name, (preset, extra) in plan.items()
    }


def fingerprint(name: str, preset: str, overrides: list[str], root: Path) -> dict:
    out = root / name
    cmd = [sys.executable, "-m", "popgrpo.cli", "train", "--config", preset, "--executor", "local", "--out", str(out)]
    for item in overrides:
        cmd += ["--set", item]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name}: popgrpo train exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    result: dict = {"metrics": frame_digest(out / "metrics.parquet")}
    columns = {"metrics": column_digests(out / "metrics.parquet")}
    if (out / "archive.parquet").exists():
        result["archive"] = frame_digest(out / "archive.parquet")
        columns["archive"] = column_digests(out / "archive.parquet")
    result["columns"] = columns
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path, help="a previous --out to compare with")
    parser.add_argument("--only", nargs="*", help="run names to fingerprint (default: all)")
    args = parser.parse_args(argv)
    plan = runs(args.epochs)
    if args.only:
        unknown = sorted(set(args.only) - set(plan))
        if unknown:
            parser.error(f"--only: unknown run names {unknown}; choices: {', '.join(plan)}")
        plan = {k: v for k, v in plan.items() if k in args.only}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (preset, overrides) in plan.items():
            results[name] = fingerprint(name, preset, overrides, Path(tmp))
            whole = {k: v for k, v in results[name].items() if k != "columns"}
            print(name, json.dumps(whole), flush=True)
    args.out.write_text(json.dumps({"epochs": args.epochs, "runs": results}, indent=1) + "\n")
    if args.compare:
        differ, added = compare(json.loads(args.compare.read_text())["runs"], results)
        for name, columns in added.items():
            print(f"{name}: columns added: {', '.join(columns)}")
        for name, changed in differ.items():
            print(f"{name}: changed: {', '.join(changed)}")
        if differ:
            print("differ:", sorted(differ))
            return 1
        print("all equal to", args.compare, *(["(every baseline column; columns added)"] if added else []))
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
