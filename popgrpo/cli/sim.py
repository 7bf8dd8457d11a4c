"""``popgrpo simulate``: what a population would cost on a cluster you do not have yet.

    popgrpo simulate --config pop_grpo --set population.size=1000 --nodes 100 --cores-per-node 16 \\
        --mode both --straggler-sigma 1 --node-mtbf-s 600 --costs costs.json

The population (K, T, epochs, top-M, members per actor) comes from the config; the cluster,
the member-time tail and the faults from the flags; the per-call costs from ``--costs`` (a
:class:`~popgrpo.research.sim.costs.CostModel` JSON, or the ``sim_validation.json`` that
``python -m benchmarks.sim_validation`` writes), or, without it, from measuring them here
(:func:`~popgrpo.research.sim.measure.calibrate`: a few minutes, with 3 and 18 member actors started; ``--save-costs`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from popgrpo.config import Config, ConfigError, load_config, preset_path

__all__ = ["add_parsers"]


def _fail(message: str) -> int:
    print(f"popgrpo simulate: {message}", file=sys.stderr)
    return 2


def _load_costs(path: Path) -> Any:
    from popgrpo.research.sim.costs import CostModel

    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--costs {path}: {type(exc).__name__}: {exc}") from None
    if isinstance(data, dict) and "costs" in data:
        data = data["costs"]
    try:
        return CostModel.from_json(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--costs {path}: not a cost model: {exc}") from None


def _config(args: argparse.Namespace) -> Config:
    source = args.config or "pop_grpo"
    path = Path(source) if Path(source).suffix in (".yaml", ".yml") else preset_path(source)
    return load_config(path, args.set or [])


def _cmd_simulate(args: argparse.Namespace) -> int:
    from popgrpo.research.sim.model import ClusterShape, Mode, Scheduling, Workload, simulate

    try:
        config = _config(args)
    except (ConfigError, FileNotFoundError) as exc:
        return _fail(str(exc).splitlines()[0])
    if args.nodes < 1 or args.cores_per_node < 1:
        return _fail("--nodes and --cores-per-node must be at least 1")
    if args.straggler_sigma < 0 or not 0 <= args.hang_probability < 1:
        return _fail("--straggler-sigma must be >= 0 and --hang-probability in [0, 1)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        return _fail(f"--seeds: expected integers separated by commas, got {args.seeds!r}")
    if not seeds:
        return _fail("--seeds: give at least one seed")
    if args.costs:
        try:
            costs = _load_costs(Path(args.costs))
        except ValueError as exc:
            return _fail(str(exc))
    else:
        from popgrpo.research.sim.measure import calibrate

        print("popgrpo simulate: measuring the per-call costs on this machine (a few minutes)", file=sys.stderr)
        costs = calibrate(config, progress=lambda line: print(f"  {line}", file=sys.stderr))
        if args.save_costs:
            costs.save(args.save_costs)
    costs = replace(costs, logged_members=config.run.logged_members)  # the config's cap, whatever measured the costs
    if args.epoch_s is not None or args.weight_bytes is not None:
        costs = replace(
            costs,
            epoch_s=costs.epoch_s if args.epoch_s is None else args.epoch_s,
            weight_bytes=costs.weight_bytes if args.weight_bytes is None else int(args.weight_bytes),
        )
    pop = config.population
    actors = pop.n_actors
    if actors > args.nodes * args.cores_per_node:
        print(
            f"popgrpo simulate: note: {actors} actors share {args.nodes * args.cores_per_node} cores, as on an "
            "embedded Ray with more logical than physical CPUs; a cluster with that many CPUs would refuse them",
            file=sys.stderr,
        )
    work = Workload.of(
        config,
        straggler_sigma=args.straggler_sigma,
        node_mtbf_s=args.node_mtbf_s,
        node_return_s=args.node_return_s,
        hang_probability=args.hang_probability,
        deadline_factor=args.deadline_factor,
    )
    modes: list[Mode] = ["sync", "async"] if args.mode == "both" else [args.mode]
    out: list[dict[str, Any]] = []
    for mode in modes:
        sched = Scheduling(mode, args.buffer, args.max_staleness)
        results = [
            simulate(costs, work, ClusterShape(args.nodes, args.cores_per_node), sched, seed=s, limit_s=args.limit_s)
            for s in seeds
        ]
        out.append({"mode": mode, "buffer": sched.buffer_for(actors), "runs": [r.to_json() for r in results]})
    if args.json:
        print(json.dumps({"costs": costs.to_json(), "workload": work.__dict__, "results": out}, indent=1))
        return 0
    print(
        f"K = {pop.size} members in {actors} actors on {args.nodes} × {args.cores_per_node} cores; "
        f"{config.run.epochs} epochs per member, T = {work.interval}; {len(seeds)} seed(s), median (min–max)"
    )
    header = (
        f"{'mode':<6} {'B':>6} {'S':>3}  {'time to N epochs (s)':<26} {'utilisation':<22} {'work lost':<22} finished"
    )
    print(header)
    for row in out:
        runs = row["runs"]

        def spread(key: str, fmt: str, runs: list[dict[str, Any]] = runs) -> str:
            values = [float(r[key]) for r in runs]
            return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"

        for r in runs:
            r["lost"] = r["wasted_epochs"] / max(1, r["wasted_epochs"] + r["useful_epochs"])
        s = str(args.max_staleness) if row["mode"] == "async" else "–"
        done = sum(bool(r["finished"]) for r in runs)
        print(
            f"{row['mode']:<6} {row['buffer']:>6} {s:>3}  {spread('wall_s', '.1f'):<26} "
            f"{spread('utilisation', '.1%'):<22} {spread('lost', '.1%'):<22} {done}/{len(runs)}"
        )
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    p = sub.add_parser(
        "simulate", help="simulate the scheduler on a cluster (sync vs async rounds, stragglers, faults)"
    )
    p.add_argument("--config", help="YAML file or preset name; default pop_grpo (K, T, epochs, top-M from it)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--cores-per-node", type=int, default=2, help="cores per node (default 2)")
    p.add_argument("--mode", choices=("sync", "async", "both"), default="both", help="schedule(s) to simulate")
    p.add_argument("--buffer", type=int, default=None, help="async: reports (actors) per merge, B; default all")
    p.add_argument("--max-staleness", type=int, default=0, help="async: merges a base may be behind, S (default 0)")
    p.add_argument("--straggler-sigma", type=float, default=0.0, help="log-normal σ of member times (default 0)")
    p.add_argument("--node-mtbf-s", type=float, default=None, help="mean seconds between node losses, cluster-wide")
    p.add_argument("--node-return-s", type=float, default=60.0, help="seconds until a lost node is back (default 60)")
    p.add_argument("--hang-probability", type=float, default=0.0, help="chance a member hangs in a round")
    p.add_argument("--deadline-factor", type=float, default=3.0, help="hung after this × median round time")
    p.add_argument("--seeds", default="0", help="simulation seeds, comma-separated (default 0)")
    p.add_argument("--costs", help="cost model JSON (default: measure here)")
    p.add_argument("--save-costs", help="with no --costs: write the measured costs here")
    p.add_argument("--epoch-s", type=float, default=None, help="override one member's epoch seconds")
    p.add_argument("--weight-bytes", type=float, default=None, help="override a member's weight bytes")
    p.add_argument("--limit-s", type=float, default=1e7, help="stop a simulation at this simulated time")
    p.add_argument("--json", action="store_true", help="print every run's result as JSON")
    p.set_defaults(func=_cmd_simulate)
