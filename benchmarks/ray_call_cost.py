"""What one Ray actor call costs in CPU on this machine, and what that leaves of section 3's 5% budget.

``python -m benchmarks.ray_call_cost [--actors 5] [--seconds 8] [--repeats 3] [--out JSON]``

On an embedded Ray started as section 3 starts it (:func:`benchmarks.common.local_ray`,
3 × cores logical CPUs), ``--actors`` actors of a class with one method that returns at once
are made and left to settle. Each repeat then watches, for ``--seconds`` each, alternating:

* **at rest**: nobody calls; the CPU seconds of this process and every process under it
  (raylet, GCS, Ray's agents, the actors) per second are Ray's floor with that many actors;
* **calls**: batches of one call per actor, each batch's answers awaited, 20 ms apart (a round
  loop's shape, not a tight loop); the same CPU seconds, less the floor over the same time,
  divided by the calls made: the CPU one call costs across the driver, the actor and Ray.

Then, on a second embedded Ray started as ``popgrpo train`` starts its own (the dashboard on, the
workers' logs forwarded to the driver), the same actors are watched at rest only: what the
dashboard adds to the floor that section 3's runs (on the first kind of Ray) do not show.

CPU seconds are psutil's user + system of the processes (:func:`popgrpo.telemetry.cpu.cpu_by_pid`),
so the cost counts every process a call touches, not just this one. The JSON holds every repeat;
``--report JSON`` prints the text again from it.

:func:`budget` sets that cost against a merge of section 3 (``benchmarks/data/round_overhead.json``,
the preset's sync runs): 5% of the merge's core-seconds, less what the run's Ray and actors take at
rest and the machine's other processes, against the two calls (``train``, ``adopt``) every member
actor takes per merge at the least.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import local_ray
from benchmarks.overhead_budget import DEFAULT_JSON, TARGET, load_sizes, rest_share, spread
from popgrpo.markdown import md_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "data" / "ray_call_cost.json"
CORES = os.cpu_count() or 1
GAP_S = 0.02  # between batches of calls
CALLS_PER_MERGE = 2  # train and adopt: every member actor's least per merge


def _ours_cpu() -> dict[int, float]:
    """CPU seconds of this process and each of its descendants (an embedded Ray's processes, its
    actors), by pid."""
    from popgrpo.telemetry.cpu import cpu_by_pid

    return {pid: seconds for pid, (seconds, group) in cpu_by_pid(set()).items() if group != "other processes"}


def _used_since(before: dict[int, float]) -> float:
    """CPU seconds our processes used since ``before``: per pid, so that a process that ended
    in between (a previous Ray's last worker going away) takes nothing off the sum, and one that
    started counts whole."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in _ours_cpu().items())


def measure(actors: int = 5, seconds: float = 8.0, repeats: int = 3) -> dict:
    import ray

    @ray.remote
    class Echo:
        def ping(self) -> None:
            return None

    def settled() -> list:
        handles = [Echo.remote() for _ in range(actors)]
        ray.get([h.ping.remote() for h in handles])
        time.sleep(2.0)  # the actors' start-up settles
        return handles

    def at_rest() -> float:
        cpu0, t0 = _ours_cpu(), time.perf_counter()
        time.sleep(seconds)
        return _used_since(cpu0) / (time.perf_counter() - t0)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rest_rates: list[float] = []
    per_call: list[float] = []
    calls_made: list[int] = []
    with local_ray(num_cpus=max(3 * CORES, actors)):
        handles = settled()
        for _ in range(repeats):
            rest = at_rest()
            cpu0, t0, n = _ours_cpu(), time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                ray.get([h.ping.remote() for h in handles])
                n += actors
                time.sleep(GAP_S)
            span = time.perf_counter() - t0
            used = _used_since(cpu0)
            rest_rates.append(rest)
            per_call.append((used - rest * span) / n)
            calls_made.append(n)
    with local_ray(num_cpus=max(3 * CORES, actors), as_train=True):
        settled()
        dashboard_rates = [at_rest() for _ in range(repeats)]
    return {
        "rest_with_dashboard_cpu_per_s": dashboard_rates,
        "started": started,
        "actors": actors,
        "seconds": seconds,
        "repeats": repeats,
        "cores": CORES,
        "rest_cpu_per_s": rest_rates,
        "cpu_per_call_s": per_call,
        "calls": calls_made,
    }


def budget(calls: dict, overhead: dict, transport: dict | None = None) -> dict[str, float]:
    """Core-milliseconds of one sync merge at the preset of section 3 (``overhead``: its saved
    JSON): the 5% budget, what Ray and the actors at rest and the machine's other processes take of
    it, what is left, the calls every member actor must take per merge, and (``transport``:
    :mod:`benchmarks.transport_cost`'s JSON) moving the members' states once, packed, put and get
    (wall ms of one process, the serialising and deserialising both)."""
    sizes = load_sizes(overhead)
    preset = sizes[min(sizes)]
    runs = preset["arms"]["sync"]
    merge_core_ms = statistics.median(x["window"] / max(x["merges"], 1) for x in runs) * preset["cores"] * 1e3
    at_rest = rest_share(preset) or 0.0
    others = (preset.get("at_rest") or {}).get("other processes", 0.0)
    calls_ms = preset["actors"] * CALLS_PER_MERGE * statistics.median(calls["cpu_per_call_s"]) * 1e3
    states_ms = float("nan")
    if transport is not None:
        packed = transport["times"]["packed"]
        states_ms = statistics.median(p + g for p, g in zip(packed["put"], packed["get"], strict=True)) * 1e3
    return {
        "states_ms": states_ms,
        "merge_core_ms": merge_core_ms,
        "budget_core_ms": TARGET * merge_core_ms,
        "rest_core_ms": at_rest * merge_core_ms,
        "others_core_ms": others * merge_core_ms,
        "left_core_ms": (TARGET - at_rest - others) * merge_core_ms,
        "calls_core_ms": calls_ms,
        "actors": preset["actors"],
    }


def markdown(r: dict, overhead: dict | None = None, transport: dict | None = None) -> str:
    def of_cores(rate: float) -> str:
        return f"{100 * rate / r['cores']:.1f}%"

    table = md_table(
        ["what", "median (min–max)"],
        [
            [
                f"Ray with {r['actors']} idle actors, at rest: % of the {r['cores']} cores",
                spread(r["rest_cpu_per_s"], of_cores),
            ],
            *(
                [
                    [
                        f"the same on a Ray as `popgrpo train` starts it (dashboard on, logs to the driver): % of the "
                        f"{r['cores']} cores",
                        spread(r["rest_with_dashboard_cpu_per_s"], of_cores),
                    ]
                ]
                if r.get("rest_with_dashboard_cpu_per_s")
                else []
            ),
            [
                "one no-op actor call, driver + actor + Ray: CPU ms",
                spread(r["cpu_per_call_s"], lambda v: f"{v * 1e3:.2f}"),
            ],
        ],
    )
    text = (
        f"`python -m benchmarks.ray_call_cost --actors {r['actors']} --seconds {r['seconds']:g} --repeats "
        f"{r['repeats']}`, {r['started']}: an embedded Ray as section 3 starts it, {r['actors']} actors with a "
        f"method that returns at once; {r['repeats']} alternated repeats of {r['seconds']:g} s at rest and "
        f"{r['seconds']:g} s of one call per actor every {GAP_S * 1e3:.0f} ms ({min(r['calls']):,}–"
        f"{max(r['calls']):,} calls); then the same actors at rest on a second Ray, started as `popgrpo train` "
        "starts its own; CPU of this process and every process under it (module docstring).\n\n" + table
    )
    if overhead is not None:
        b = budget(r, overhead, transport)
        text += (
            f"\n\nAgainst a sync merge at the preset (section 3's first table: {b['merge_core_ms']:,.0f} core-ms, the wall "
            f"time per merge × the cores): the 5% target allows {b['budget_core_ms']:.0f} core-ms outside member "
            f"training. Ray and the run's actors at rest take {b['rest_core_ms']:.0f} of them and the machine's "
            f"other processes {b['others_core_ms']:.0f}, which leaves {b['left_core_ms']:.0f} core-ms for "
            f"everything a merge does; the {CALLS_PER_MERGE} calls each of the {b['actors']} member actors takes "
            f"per merge at the least (`train`, `adopt`) cost {b['calls_core_ms']:.0f} core-ms as no-op calls, "
            "before any weights move, any merge is made or any file is written"
            + (
                f"; moving the {transport['members']} members' states once through the object store (what the "
                f"`adopt` answers carry for the checkpoint; put + get, packed: `benchmarks/transport_cost.py`) "
                f"takes {b['states_ms']:.1f} ms more."
                if transport is not None
                else "."
            )
        )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_call_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0, help="each window, at rest and calling (default 8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report", type=Path, metavar="JSON", help="print the text from a saved JSON, run nothing")
    args = parser.parse_args(argv)
    if args.report:
        r = json.loads(args.report.read_text())
    else:
        r = measure(args.actors, args.seconds, args.repeats)
        args.out.write_text(json.dumps(r, indent=1) + "\n")
    from benchmarks import transport_cost

    saved, moved = DEFAULT_JSON, transport_cost.DEFAULT_OUT
    overhead = json.loads(saved.read_text()) if saved.is_file() else None
    print(markdown(r, overhead, json.loads(moved.read_text()) if moved.is_file() else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
