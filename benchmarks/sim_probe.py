"""Where a real Ray round's time goes, phase by phase: the measurements behind the simulator's terms.

    python -m benchmarks.sim_probe [--sizes 5x1,16x1] [--rounds 5] [--out benchmarks/data/sim_probe.json]

For each size (K × members per actor) it runs the ``pop_grpo`` preset on an embedded Ray
(the validation's setup, :func:`benchmarks.sim_validation.validate`) and, over the rounds
after the first and before the last:

* the driver's wall time per round, inside ``train``, ``adopt``, ``get_weights`` and
  ``snapshot`` calls, and outside them;
* the member actors' CPU seconds in their epochs (``MemberGroup.train_cpu_seconds``, thread
  time) against the wall time of the ``train`` calls, and their voluntary / involuntary
  context switches (psutil);
* the CPU seconds of every process on the machine over the same span, grouped: member
  actors, the driver, the raylet, the GCS, Ray's agents (dashboard / metrics / runtime env),
  other Ray workers, and everything else (other users of the cores);
* the load average.

It changes nothing in the run; the numbers go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.sim_validation import CORES, _config
from popgrpo.runtime.round_timer import RoundTimer
from popgrpo.telemetry.cpu import cpu_by_pid


class Probe(RoundTimer):
    """A :class:`RoundTimer` of every executor call; at each round's ``train`` call and at close
    it samples every process's CPU time, the member actors' context switches, the load average
    and the machine's CPU times into :attr:`marks`."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, mark=self._mark)
        self.marks: list[dict[str, Any]] = []

    def _mark(self, round_index: int | None) -> None:
        switches = {}
        for pid in self.worker_pids():
            try:
                s = psutil.Process(pid).num_ctx_switches()
                switches[pid] = (s.voluntary, s.involuntary)
            except psutil.NoSuchProcess:
                pass
        self.marks.append(
            {
                "t": time.perf_counter(),
                "cpu": cpu_by_pid(set(self.worker_pids())),
                "switches": switches,
                "load": os.getloadavg()[0],
                "cpu_times": psutil.cpu_times(),
            }
        )


def alone_epoch(epochs: int = 20) -> dict[str, float]:
    """One member's epoch in this process, nothing else of the run running: wall and thread CPU (ms)."""
    from popgrpo.runtime.executor import LocalExecutor

    cfg = _config(1, 1, 2)
    local = LocalExecutor(cfg)
    local.train(1)
    walls, cpus = [], []
    for _ in range(epochs):
        w, c = time.perf_counter(), time.thread_time()
        local.train(1)
        walls.append(time.perf_counter() - w)
        cpus.append(time.thread_time() - c)
    return {
        "wall_ms": 1e3 * statistics.median(walls),
        "cpu_ms": 1e3 * statistics.median(cpus),
        "load": os.getloadavg()[0],
    }


def probe(k: int, per_actor: int, rounds: int) -> dict[str, Any]:
    import ray

    from popgrpo.runtime.cluster import start_local_ray
    from popgrpo.runtime.ray_executor import RayExecutor
    from popgrpo.train import train

    cfg = _config(k, per_actor, rounds, None)
    actors = math.ceil(k / per_actor)
    start_local_ray(num_cpus=max(CORES, actors), include_dashboard=False)
    holder: dict[str, Probe] = {}

    def make(c: Any, d: Path) -> Any:
        holder["p"] = Probe(RayExecutor(c, run_dir=d))
        return holder["p"]

    try:
        with tempfile.TemporaryDirectory(prefix="pgprobe-") as tmp:
            train(cfg, Path(tmp) / "run", executor_factory=make, progress=False)
    finally:
        ray.shutdown()
    p = holder["p"]
    actor_set = set(p.worker_pids())
    first, last = 1, len(p.marks) - 1  # rounds 1 .. n-2 (marks[i] starts round i; the last mark is close)
    a, b = p.marks[first], p.marks[last]
    wall = b["t"] - a["t"]
    n = last - first
    groups: dict[str, float] = {}
    for pid, (t1, g) in b["cpu"].items():
        if pid not in a["cpu"]:
            continue  # started inside the span
        groups[g] = groups.get(g, 0.0) + (t1 - a["cpu"][pid][0])
    idle = b["cpu_times"].idle - a["cpu_times"].idle
    round_calls = p.round_calls()
    train_wall = [c.get("train", 0.0) for c in round_calls[first:last]]
    train_cpu = [sum(cs[r] for cs in p.epoch_cpu if r < len(cs)) for r in range(first, last)]
    sw = {
        kind: sum(b["switches"][pid][i] - a["switches"][pid][i] for pid in actor_set if pid in a["switches"]) / n
        for i, kind in enumerate(("voluntary", "involuntary"))
    }
    calls = {name: statistics.fmean(c.get(name, 0.0) for c in round_calls[first:last]) for name in round_calls[first]}
    ours = sum(v for g, v in groups.items() if g != "other processes")
    out = {
        "k": k,
        "members_per_actor": per_actor,
        "actors": actors,
        "rounds_measured": n,
        "round_s": wall / n,
        "calls_s_per_round": calls,
        "outside_calls_s_per_round": wall / n - sum(calls.values()),
        "train_wall_s_per_round": statistics.fmean(train_wall),
        "member_train_cpu_s_per_round": statistics.fmean(train_cpu),
        "member_epoch_cpu_ms": 1e3 * statistics.fmean(train_cpu) / (k * cfg.scheduler.interval_epochs),
        "cpu_s_per_round": {g: v / n for g, v in sorted(groups.items())},
        "machine_idle_s_per_round": idle / n,
        "run_cpu_share_of_cores": ours / (CORES * wall),
        "other_cpu_share_of_cores": groups.get("other processes", 0.0) / (CORES * wall),
        "actor_ctx_switches_per_round": sw,
        "load_average_1min": [a["load"], b["load"]],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="5x1,16x1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/data/sim_probe.json"))
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = [{"alone_epoch": alone_epoch()}]
    print(rows[0], flush=True)
    for size in args.sizes.split(","):
        k, per = (int(x) for x in size.split("x"))
        row = probe(k, per, args.rounds)
        print(json.dumps(row, indent=1), flush=True)
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
