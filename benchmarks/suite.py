"""The benchmark suite: every figure in one run, side by side, written to docs/benchmarks/suite.md.

    python -m benchmarks [--quick] [--skip-peer] [--out docs/benchmarks/suite.md]

Sections: 1 step floor, 2 population throughput, 3 round overhead, 4 multi-node scaling,
5 archive and novelty cost, 6 the RLlib peer (:mod:`benchmarks.peer_rllib`, when present).
Each reports ratios against its target, met or not, with the reason where not. The output
replaces what lies between ``<!-- benchmarks:begin -->`` and ``<!-- benchmarks:end -->`` in
``--out`` (the markers are appended when absent); the rest of the file is kept as it is.

Order: the sections that need no Ray first (a quiet machine for the step floor), then one
embedded single-node Ray (loopback, own temp dir) for sections 2-4's single-node parts, then
a loopback multi-node ``ray.cluster_utils.Cluster`` for section 4, then the peer, which
starts its own Ray. ``--quick`` runs the smallest sizes, for CI.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.util
import os
import platform
import shlex
import sys
import time
import traceback
from pathlib import Path

from benchmarks.common import replace_between, write_between

BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "suite.md"  # BENCHMARKS.md links it
CORES = os.cpu_count() or 1
SECTION_TITLES = {
    "floor": "### 1. Step floor: one member's GRPO step vs bare torch",
    "throughput": "### 2. Population throughput and memory against K",
    "overhead": "### 3. Round overhead at the default config",
    "multinode": "### 4. Multi-node layout: 4 loopback nodes vs 1",
    "archive": "### 5. Archive and novelty cost against batch and memory size",
    "peer": "### 6. Peer: RLlib PPO on the same environment",
}


def replace_generated(text: str, region: str) -> str:
    """``text`` with everything between the markers replaced by ``region`` (markers appended when absent)."""
    return replace_between(text, region, BEGIN, END)


def write_region(path: Path, region: str) -> None:
    write_between(path, region, BEGIN, END)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 2**20


def header(command: str, started: dt.datetime, wall: dict[str, float], load: tuple[float, float]) -> str:
    import ray
    import torch

    from popgrpo.markdown import md_table

    timings = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in wall.items())
    rows = [
        ["command", f"`{command}`"],
        ["date", started.strftime("%Y-%m-%d %H:%M %Z").strip()],
        ["machine", f"{CORES} cores (`os.cpu_count()`), {_ram_gib():.1f} GiB RAM, {_cpu_model()}, no GPU used"],
        ["software", f"Python {platform.python_version()}, torch {torch.__version__}, ray {ray.__version__}"],
        ["wall time", f"{sum(wall.values()):.0f} s ({timings})"],
        ["load average (1 min), start / end", f"{load[0]:.2f} / {load[1]:.2f}"],
    ]
    return md_table(["", ""], rows)


def _summary(results: dict, cores: int) -> str:
    """One row per headline figure, every one a ratio, from the sections' results."""
    from benchmarks import round_overhead, step_floor, throughput
    from popgrpo.markdown import md_table

    rows = []
    floor = results.get("floor")
    if floor:
        ok = floor["ratio"] <= step_floor.TARGET
        rows.append(["1", "member step / bare torch step", f"{floor['ratio']:.2f}×", f"≤ {step_floor.TARGET}×", ok])
    pop = results.get("throughput")
    if pop:
        for e in pop["rows"]:
            if e["variant"] != throughput.PACKED or "ideas_per_s" not in e:
                continue
            ratio = e["ideas_per_s"] / (pop["floor_ideas_per_s"] * min(cores, e["actors"]))
            rows.append(
                [
                    "2",
                    f"K = {e['k']} packed: ideas/s ÷ (floor × cores used)",
                    f"{ratio:.2f}",
                    f"≥ {throughput.THROUGHPUT_TARGET}",
                    ratio >= throughput.THROUGHPUT_TARGET,
                ]
            )
            if e["k"] == 256:
                share = e["peak_rss"] / throughput.MEMORY_TARGET_BYTES
                rows.append(["2", "K = 256 packed: peak RSS ÷ 24 GiB", f"{share:.2f}", "≤ 1", share <= 1])
    over = results.get("overhead")
    if over:
        modes, shares = " / ".join(over["shares"]), " / ".join(f"{s:.1%}" for s in over["shares"].values())
        rows.append(["3", f"round time outside member training ({modes})", shares, f"≤ {round_overhead.TARGET:.0%}",
                     over["outside_share"] <= round_overhead.TARGET])  # fmt: skip
    multi = results.get("multinode")
    if multi:
        ratio = multi["multi"]["ideas_per_s"] / multi["single"]["ideas_per_s"]
        rows.append(["4", "ideas/s, 4 nodes ÷ 1 node (same cores)", f"{ratio:.2f}×", "≥ 0.9×", ratio >= 0.9])
    arch = results.get("archive")
    if arch:
        from benchmarks.archive_cost import TARGET_R2

        worst = min(s["r2"] for s in arch["series"].values())
        rows.append(["5", "archive/novelty cost vs size: worst R² of a line", f"{worst:.4f}", f"≥ {TARGET_R2}",
                     worst >= TARGET_R2])  # fmt: skip
    peer = results.get("peer")
    if isinstance(peer, dict) and "ratio" in peer:
        target = peer.get("target_ratio", 20)
        rows.append(["6", "ideas/s, popgrpo ÷ RLlib PPO", f"{peer['ratio']:.1f}×", f"≥ {target:g}×",
                     bool(peer.get("target_met"))])  # fmt: skip
    return md_table(
        ["§", "figure", "measured", "target", "status"],
        [[*row[:4], "met" if row[4] else "not met"] for row in rows],
    )


def _peer(quick: bool, budget: int | None) -> tuple[dict | str, str]:
    """``(result or note, markdown)`` of :mod:`benchmarks.peer_rllib`, or a note when absent or failing."""
    if importlib.util.find_spec("benchmarks.peer_rllib") is None:
        note = "Not run: `benchmarks/peer_rllib.py` is not in this checkout."
        return note, note
    try:
        peer = importlib.import_module("benchmarks.peer_rllib")
        result = peer.run(budget, quick)  # None: its default, a whole grpo run's ideas (quick: 4 epochs)
        return result, peer.markdown(result)
    except Exception as exc:
        traceback.print_exc()
        note = f"Not run: `benchmarks.peer_rllib` failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return note, note


def run_all(
    quick: bool, peer_budget: int | None = None, cores: int = CORES, skip_peer: bool = False
) -> tuple[dict, dict[str, str], dict[str, float]]:
    """Every section; returns the results, their Markdown, and the wall seconds of each part."""
    from benchmarks import archive_cost, round_overhead, step_floor, throughput
    from benchmarks.common import local_ray

    results, text, wall = {}, {}, {}

    @contextlib.contextmanager
    def timed(name: str):
        print(f"benchmarks: {name} …", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield
        finally:
            wall[name] = time.perf_counter() - start

    with timed("floor"):
        results["floor"] = step_floor.run(quick)
        text["floor"] = step_floor.markdown(results["floor"])
    with timed("archive"):
        results["archive"] = archive_cost.run(quick)
        text["archive"] = archive_cost.markdown(results["archive"])
    k_default = round_overhead.default_config(quick).population.size
    start = time.perf_counter()
    # 3 × cores logical CPUs: section 2 builds a K's three layouts side by side before timing them one by one.
    with local_ray(num_cpus=max(3 * cores, k_default, throughput.N_NODES)):
        wall["ray start"] = time.perf_counter() - start
        with timed("throughput"):
            results["throughput"] = throughput.run_population(quick, results["floor"]["member_ideas_per_s"], cores)
            text["throughput"] = throughput.markdown_population(results["throughput"])
        with timed("overhead"):
            results["overhead"] = round_overhead.run(quick, cores)
            text["overhead"] = round_overhead.markdown(results["overhead"])
        with timed("multinode (1 node)"):
            single = throughput.run_multinode_single(quick, results["throughput"], cores)
    with timed("multinode (4 nodes)"):
        multi = throughput.run_multinode_cluster(quick, cores)
        results["multinode"] = {"single": single, "multi": multi}
        text["multinode"] = throughput.markdown_multinode(single, multi, quick, cores)
    if skip_peer:
        results["peer"] = text["peer"] = "Not run: `--skip-peer`."
    else:
        with timed("peer"):
            results["peer"], text["peer"] = _peer(quick, peer_budget)
    return results, text, wall


def render(results: dict, text: dict[str, str], command: str, started, wall, load, quick: bool) -> str:
    parts = [
        "## Benchmark suite" + (" (quick)" if quick else ""),
        "Generated by `python -m benchmarks`; everything between the `benchmarks:begin` and `benchmarks:end` "
        "markers is replaced by the next run. All figures come from this one run, on this machine, at the "
        "same time; other processes may have been running (see the load average).",
        header(command, started, wall, load),
        "#### Headline figures",
        _summary(results, CORES),
    ]
    for key, title in SECTION_TITLES.items():
        parts += [title, text[key]]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smallest sizes (CI): about a minute and a half")
    parser.add_argument("--out", default=str(OUT), help="Markdown file to update between the markers")
    parser.add_argument(
        "--peer-budget", type=int, default=None, help="ideas per run for the RLlib peer (default: its own default)"
    )
    parser.add_argument(
        "--skip-peer",
        action="store_true",
        help="leave out section 6 (the RLlib peer starts its own Ray and trains twice)",
    )
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks", *argv])
    started = dt.datetime.now().astimezone()
    load_start = os.getloadavg()[0]
    results, text, wall = run_all(args.quick, args.peer_budget, skip_peer=args.skip_peer)
    region = render(results, text, command, started, wall, (load_start, os.getloadavg()[0]), args.quick)
    write_region(Path(args.out), region)
    print(region)
    print(f"benchmarks: wrote {args.out}", file=sys.stderr)
    return 0
