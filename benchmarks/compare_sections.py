"""Sections 1 and 3 of the suite on two checkouts, in turn, each run in a fresh interpreter.

    python -m benchmarks.compare_sections --before PATH [--after PATH] [--order ABBA]
                                          [--size 1] [--out JSONL]
    python -m benchmarks.compare_sections --render JSONL

A run is a child interpreter with ``PYTHONPATH`` and its working directory at one checkout, so
each tree is measured by its own benchmark code: ``benchmarks.step_floor.run()`` (section 1),
then, on a fresh :func:`benchmarks.common.local_ray` as the suite starts it,
``benchmarks.round_overhead.run()`` at one size of its :data:`~benchmarks.round_overhead.SIZES`
(section 3: one untimed warm-up run, the run's Ray and actors watched at rest, then one timed run
of each scheduler mode). ``--order`` says which tree runs when (``A`` before, ``B`` after): the
default ``ABBA`` puts a drift in the machine's speed on both. Each run appends one JSON line to
``--out`` as it ends, so a stopped comparison keeps what it measured; ``--render`` prints the
table of a saved file.

The table gives, per tree, each run's figure in run order: section 1's member ÷ bare-loop ratio
and section 3's share of the wall time outside member training per mode, both as measured and
less the share the run's Ray and actors take at rest (the part the rounds themselves add).

When the runs pair in run order (each of runs 1–2, 3–4, … is one run of each tree, as ``ABBA``
and ``ABBAABBA`` make them), a second table gives, per figure, the paired differences after −
before: their mean, its 95% t interval, the paired t-test's p and Holm's adjustment of those p
over the table's figures (:mod:`popgrpo.research.study.stats`). Adjacent runs share the
machine's state of the moment, so pairing them takes a slow drift out of the differences.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from benchmarks.overhead_budget import rest_share
from popgrpo.markdown import md_table
from popgrpo.research.study.stats import format_p, holm, paired_test

ROOT = Path(__file__).resolve().parent.parent

# Runs inside the child interpreter, against whichever checkout PYTHONPATH names.
_CHILD = """
import json, os, sys, time
from benchmarks import round_overhead, step_floor
from benchmarks.common import local_ray
size = int(sys.argv[1])
record = {"started": time.time(), "load": os.getloadavg()[0], "step_floor": step_floor.run()}
cfg = round_overhead.default_config(False)
with local_ray(num_cpus=max(3 * round_overhead.CORES, cfg.population.size)):
    record["round"] = round_overhead.run(False, round_overhead.CORES, 1, extra=round_overhead.SIZES[size])
print(json.dumps(record))
"""


def _revision(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "popgrpo"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") if done.returncode == 0 else str(tree)


def run_once(tree: Path, size: int) -> dict:
    """One child run on ``tree``: its JSON record, with the tree's revision."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(size)], env=env, capture_output=True, text=True, check=False, cwd=tree
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: exit {done.returncode}: {done.stderr.strip().splitlines()[-3:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {"tree": _revision(tree), "size": size, **record}


def table(records: list[dict]) -> str:
    """One row per figure, one column per tree (in order of first appearance): each run's value,
    in run order, separated by slashes."""
    trees = list(dict.fromkeys(r["tree"] for r in records))
    by_tree = {t: [r for r in records if r["tree"] == t] for t in trees}
    arms = list(records[0]["round"]["shares"])

    def cell(tree: str, value) -> str:
        return " / ".join(value(r) for r in by_tree[tree])

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x:.1%}"

    rows = [
        ["1. `step_floor`: member / bare loop", *(cell(t, lambda r: f"{r['step_floor']['ratio']:.3f}") for t in trees)],
        [
            "3. Ray and actors at rest, share of the cores",
            *(cell(t, lambda r: pct(rest_share(r["round"]))) for t in trees),
        ],
    ]
    for arm in arms:
        rows.append(
            [
                f"3. outside member training, {arm}",
                *(cell(t, lambda r, a=arm: pct(r["round"]["shares"][a])) for t in trees),
            ]
        )
    for arm in arms:
        rows.append(
            [
                f"3. … of it beyond Ray at rest, {arm}",
                *(cell(t, lambda r, a=arm: pct(_beyond_rest(r, a))) for t in trees),
            ]
        )
    return md_table(["figure", *(f"`{t}`" for t in trees)], rows)


def _beyond_rest(record: dict, arm: str) -> float | None:
    """The run's share outside member training in mode ``arm`` less its share at rest (None
    when the run has no rest measurement)."""
    rest = rest_share(record["round"])
    return None if rest is None else record["round"]["shares"][arm] - rest


def paired_runs(records: list[dict]) -> tuple[list[dict], list[dict]] | None:
    """The before and after runs of each pair of runs in run order (1–2, 3–4, …), or None when
    the records are not such pairs of two trees."""
    trees = list(dict.fromkeys(r["tree"] for r in records))
    if len(trees) != 2 or len(records) % 2 or len(records) < 4:
        return None
    pairs = [records[i : i + 2] for i in range(0, len(records), 2)]
    if any({r["tree"] for r in pair} != set(trees) for pair in pairs):
        return None
    before, after = trees
    return (
        [next(r for r in pair if r["tree"] == before) for pair in pairs],
        [next(r for r in pair if r["tree"] == after) for pair in pairs],
    )


def differences(records: list[dict]) -> str:
    """Per figure, the paired differences after − before (:func:`paired_runs`): mean, 95% t
    interval, paired t-test p and Holm-adjusted p over the figures. Shares in percentage points."""
    paired = paired_runs(records)
    if paired is None:
        raise ValueError("the runs do not pair in run order (1–2, 3–4, …: one run of each tree)")
    before, after = paired

    def points(record: dict, arm: str) -> float:
        share = _beyond_rest(record, arm)
        return float("nan") if share is None else 100 * share

    # (name, unit, the figure of one run)
    figures: list[tuple[str, str, Callable[[dict], float]]] = [
        ("1. `step_floor`: member / bare loop", "ratio", lambda r: r["step_floor"]["ratio"])
    ]
    figures += [
        (f"3. beyond Ray at rest, {arm}", "points", partial(points, arm=arm)) for arm in records[0]["round"]["shares"]
    ]
    tests = [paired_test([value(r) for r in after], [value(r) for r in before]) for _, _, value in figures]
    adjusted, _ = holm([t.t_p for t in tests])
    rows = []
    for (name, unit, _), test, p_holm in zip(figures, tests, adjusted, strict=True):
        half = scipy_stats.t.ppf(0.975, test.n - 1) * test.sd / np.sqrt(test.n)
        digits = 3 if unit == "ratio" else 2
        rows.append(
            [
                name,
                f"{test.mean:+.{digits}f} {unit}",
                f"[{test.mean - half:+.{digits}f}, {test.mean + half:+.{digits}f}]",
                format_p(test.t_p),
                format_p(p_holm),
            ]
        )
    header = [f"figure (after − before, {len(before)} pairs)", "mean", "95% t interval", "paired t p", "Holm p"]
    return md_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_sections", description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the checkout measured as A")
    parser.add_argument("--after", type=Path, default=ROOT, help="the checkout measured as B (default: this one)")
    parser.add_argument("--order", default="ABBA", help="which tree runs when, A before and B after (default ABBA)")
    parser.add_argument(
        "--size", type=int, default=1, help="section 3's size, a factor of round_overhead.SIZES (default 1)"
    )
    parser.add_argument("--out", type=Path, help="append each run's JSON line here")
    parser.add_argument("--render", type=Path, metavar="JSONL", help="the table of a saved --out, run nothing")
    args = parser.parse_args(argv)
    if args.render:
        records = [json.loads(line) for line in args.render.read_text().splitlines() if line.strip()]
    else:
        if args.before is None or set(args.order) - {"A", "B"}:
            parser.error("--before PATH and an --order of A and B are needed")
        trees = {"A": args.before.resolve(), "B": args.after.resolve()}
        records = []
        for i, which in enumerate(args.order, 1):
            started = time.strftime("%H:%M:%S UTC", time.gmtime())
            record = run_once(trees[which], args.size)
            records.append(record)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(record) + "\n")
            print(
                f"{i}/{len(args.order)} {record['tree']} from {started}: {' / '.join(f'{s:.1%}' for s in record['round']['shares'].values())}",
                flush=True,
            )
    print(table(records))
    if paired_runs(records) is not None:
        print()
        print(differences(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
