"""Two checkouts of popgrpo on the same training workload, in turn, by CPU time per idea.

    python -m benchmarks.compare_trees --before PATH [--after PATH] [--k 64] [--vectorize]
                                       [--epochs 4] [--pairs 4]

Wall-clock throughput on a shared machine moves with whatever else runs; the CPU seconds a
process spends on the same work move much less. Each run is a fresh interpreter with
``PYTHONPATH`` at one checkout that builds the in-process executor (``--executor local``'s:
every member in that process, one torch thread) on the ``grpo`` preset with ``K`` members,
trains one untimed warm-up epoch, then ``--epochs`` timed ones, and reports the CPU seconds
of the timed call (``time.process_time``) and the ideas it trained on. Runs alternate
before, after, before, after ... (``--pairs`` of each) so a drift in the machine's speed
falls on both; the ratio is taken pair by pair and its median, minimum and maximum printed.
This is the check behind "no worse than before" claims about section 2 of the suite
(:mod:`benchmarks.throughput`), which measures the same members on Ray by wall clock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from popgrpo.markdown import md_table

# Runs inside the child interpreter, against whichever checkout PYTHONPATH names.
_CHILD = """
import json, sys, time
from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
k, vectorize, epochs = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
overrides = [f"population.size={k}", "run.torch_threads=1"] + (["population.vectorize=true"] if vectorize else [])
config = load_config(preset_path("grpo"), overrides)
executor = LocalExecutor(config)
executor.train(1)
start = time.process_time()
rows = executor.train(epochs)
cpu = time.process_time() - start
g = config.grpo
ideas = sum(len(r) for r in rows) * g.steps_per_epoch * config.policy.n_prompts * g.group_size
print(json.dumps({"cpu_s": cpu, "ideas": ideas}))
"""


def run_once(tree: Path, k: int, vectorize: bool, epochs: int) -> dict:
    """One child run on ``tree``: ``{"cpu_s", "ideas"}``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", _CHILD, str(k), "1" if vectorize else "0", str(epochs)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(before: Path, after: Path, k: int, vectorize: bool, epochs: int, pairs: int) -> dict:
    """Alternate the two trees ``pairs`` times; ideas per CPU-second of each run and the ratios."""
    rates: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(pairs):
        for name, tree in (("before", before), ("after", after)):
            r = run_once(tree, k, vectorize, epochs)
            rates[name].append(r["ideas"] / r["cpu_s"])
    ratios = [a / b for a, b in zip(rates["after"], rates["before"], strict=True)]
    return {"k": k, "vectorize": vectorize, "rates": rates, "ratios": ratios}


def report(result: dict) -> str:
    layout = "packed + vectorize" if result["vectorize"] else "packed"
    med = {name: statistics.median(v) for name, v in result["rates"].items()}
    r = result["ratios"]
    return md_table(
        ["layout", "K", "before, ideas per CPU-s (median)", "after", "after / before: median (min–max)", "pairs"],
        [
            [
                layout,
                result["k"],
                f"{med['before']:,.0f}",
                f"{med['after']:,.0f}",
                f"{statistics.median(r):.3f} ({min(r):.3f}–{max(r):.3f})",
                len(r),
            ]
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_trees", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of popgrpo (the baseline)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1], help="default: this one")
    parser.add_argument("--k", type=int, default=64, help="members (default 64)")
    parser.add_argument("--vectorize", action="store_true", help="population.vectorize=true")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs per run (default 4)")
    parser.add_argument("--pairs", type=int, default=4, help="runs of each tree (default 4)")
    args = parser.parse_args(argv)
    for tree in (args.before, args.after):
        if not (tree / "popgrpo" / "__init__.py").is_file():
            parser.exit(2, f"compare_trees: {tree} is not a popgrpo checkout (no popgrpo/__init__.py)\n")
    if min(args.k, args.epochs, args.pairs) < 1:
        parser.exit(2, "compare_trees: --k, --epochs and --pairs must be positive\n")
    result = compare(args.before.resolve(), args.after.resolve(), args.k, args.vectorize, args.epochs, args.pairs)
    sys.stdout.write(report(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
