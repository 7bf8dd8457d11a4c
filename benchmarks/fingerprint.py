"""Seed-42 fingerprints of every simulated-environment preset: is a refactor behaviour-preserving?

Trains each preset in this process (``--executor local``, no Ray) for ``--epochs`` epochs at
seed 42 and prints, per run, a SHA-256 of ``metrics.parquet``'s values (every column, every
row, in order; wall-clock columns excluded) and of ``archive.parquet``'s. Two trees give the
same fingerprints exactly when their runs wrote the same numbers bit for bit.

    python -m benchmarks.fingerprint --out /tmp/before.json
    python -m benchmarks.fingerprint --out /tmp/after.json --compare /tmp/before.json

``--compare`` exits 1 naming every run whose fingerprint differs. Language-model presets
(``lm_*``) need a model directory and are left out.
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


def frame_digest(path: Path) -> str:
    """SHA-256 of a Parquet file's column names and values, timing columns excluded."""
    frame = pd.read_parquet(path)
    frame = frame[[c for c in frame.columns if not any(t in c for t in TIMING_COLUMNS)]]
    digest = hashlib.sha256(json.dumps(list(frame.columns)).encode())
    for column in frame.columns:
        values = frame[column]
        try:
            digest.update(pd.util.hash_pandas_object(values, index=False).to_numpy().tobytes())
        except TypeError:  # lists or dicts in cells
            digest.update(json.dumps(values.tolist(), default=str, sort_keys=True).encode())
    return digest.hexdigest()


def runs(epochs: int) -> dict[str, tuple[str, list[str]]]:
    presets = sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if not p.stem.startswith("lm_"))
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
    result = {"metrics": frame_digest(out / "metrics.parquet")}
    if (out / "archive.parquet").exists():
        result["archive"] = frame_digest(out / "archive.parquet")
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
            print(name, json.dumps(results[name]), flush=True)
    args.out.write_text(json.dumps({"epochs": args.epochs, "runs": results}, indent=1) + "\n")
    if args.compare:
        before = json.loads(args.compare.read_text())["runs"]
        differ = [n for n in results if before.get(n) != results[n]]
        print("differ:" if differ else "all equal to", differ or args.compare)
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
