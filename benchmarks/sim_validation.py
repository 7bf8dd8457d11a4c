"""The scheduler simulator, validated against real Ray runs here, then run at 1,000 and 10,000 members.

    python -m benchmarks.sim_validation [--quick] [--out docs/benchmarks/simulator.md] [--data DIR] [--figure PNG]

1. **Calibrate** (:func:`popgrpo.research.sim.measure.calibrate`): every cost of the model measured
   with the real components at sizes the validation does not use (member epochs alone,
   merges of 2 and 8, in-process runs at K = 2 and 8, one Ray actor).
2. **Validate**: real synchronous runs of the ``pop_grpo`` preset on an embedded Ray at
   K = 5, 16 and 64 (64 as 8 actors of 8 members: one actor per member would not fit this
   machine's memory), 6 rounds of T = 10 epochs; the mean time from one round's last report
   to the next round's (rounds 2 to 5: the merge, the adopts and the round's epochs), against
   the simulator's prediction of the same on this machine's cores (one node). Target: within 10%.
3. **Scale**: 100 simulated nodes of 16 cores, K = 1,000 … 10,000 members (packed so that the
   actors fit the cores, as ``check_fits`` requires), member times log-normal with σ = 1 per
   actor-round, one node lost every 30 s on average (back after 60 s), 200 epochs per member;
   sync vs async (B = a quarter of the actors, S = 4). Time to 200 epochs per member on
   average, utilisation of the cores by useful member epochs, and the work lost.

The costs, the validation and the curves go to ``--data`` as JSON, the tables between
``<!-- sim:begin -->`` and ``<!-- sim:end -->`` in ``--out``, the curves to ``--figure``.
``--quick`` runs the smallest sizes (for the smoke test): its numbers say nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import met, write_between
from popgrpo.markdown import md_table

BEGIN, END = "<!-- sim:begin -->", "<!-- sim:end -->"
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
SHARING_FIELDS = ("contention", "actor_call_cpu_s", "ray_share", "background_share")
TARGET = 0.10
SCALE_INTERVAL = 10  # T of the simulated populations at scale
SCALE_SIZES = [1000, 2000, 5000, 10000]
ROOT = Path(__file__).resolve().parents[1]


def _config(k: int, per_actor: int, rounds: int, interval: int | None = None):
    from popgrpo.config import load_config, preset_path

    overrides = [
        f"population.size={k}",
        f"population.members_per_actor={per_actor}",
        f"scheduler.top_m={min(3, k)}",
        "run.loggers=[tensorboard]",
    ]
    cfg = load_config(preset_path("pop_grpo"), overrides)
    t = interval or cfg.scheduler.interval_epochs
    return load_config(
        preset_path("pop_grpo"),
        [*overrides, f"scheduler.interval_epochs={t}", f"run.epochs={rounds * t}"],
    )


def _say(line: str) -> None:
    print(f"  {line}", flush=True)


def validate(
    costs,
    sizes: list[tuple[int, int]],
    rounds: int,
    interval: int | None,
    remeasure: bool = True,
) -> list[dict[str, Any]]:
    """Real Ray runs vs the simulator, one row per (K, members per actor).

    Right before each real run the sharing terms (:func:`popgrpo.research.sim.measure.sharing_costs`,
    at 3 and 18 actors of the run's own members per actor: never the run's own size) are
    measured again, so that the share of the cores other users of the machine take is the one
    of that moment. With ``remeasure`` false (``--quick``) every size uses the calibration's."""
    from dataclasses import replace

    import ray

    from popgrpo.research.sim.measure import run_timed, sharing_costs
    from popgrpo.research.sim.model import ClusterShape, Scheduling, Workload, simulate
    from popgrpo.runtime.cluster import start_local_ray
    from popgrpo.runtime.ray_executor import RayExecutor

    rows = []
    for k, per_actor in sizes:
        cfg = _config(k, per_actor, rounds, interval)
        actors = math.ceil(k / per_actor)
        # with the run's own members per actor: an actor's members take turns on its core
        costs_k = costs
        if remeasure:
            costs_k = replace(costs, **sharing_costs(_config(5, per_actor, 4), costs.epoch_s, progress=_say))
        load = [os.getloadavg()[0]]
        start_local_ray(num_cpus=max(CORES, actors), include_dashboard=False)
        try:
            timer = run_timed(cfg, lambda c, d: RayExecutor(c, run_dir=d))
        finally:
            ray.shutdown()
        load.append(os.getloadavg()[0])
        # From one round's last report to the next's, rounds 2 on: each holds a merge, the
        # adopts and the round's epochs. Not train call to train call: the next train call goes
        # right behind each actor's adopt, so a round has started before the driver's call.
        measured = timer.report_periods()[1:]
        work = Workload.of(cfg)
        sim = simulate(costs_k, work, ClusterShape(1, CORES), Scheduling("sync"))
        predicted = statistics.fmean(sim.report_s[1:])
        real = statistics.fmean(measured)
        rows.append(
            {
                "k": k,
                "members_per_actor": per_actor,
                "actors": actors,
                "rounds_measured": len(measured),
                "real_round_s": real,
                "real_round_spread": [min(measured), max(measured)],
                "sim_round_s": predicted,
                "error": predicted / real - 1,
                "real_train_s": statistics.fmean(timer.per_round(("train",))[1:-1]),
                "load_average_1min": load,
                "sharing": {
                    name: value if isinstance(value, float) else {"a": value.a, "b": value.b}
                    for name, value in ((f, getattr(costs_k, f)) for f in SHARING_FIELDS)
                },
            }
        )
        print(f"K={k}: real {real:.3f} s/round, simulated {predicted:.3f} ({predicted / real - 1:+.1%})", flush=True)
    return rows


def median_costs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Field by field, the median of several calibrations' costs (``CostModel.to_json`` form):
    a number's median, each coefficient of a line's; text from the first."""
    out: dict[str, Any] = {}
    for name, first in runs[0].items():
        values = [run[name] for run in runs]
        if isinstance(first, dict):
            out[name] = {c: statistics.median(v[c] for v in values) for c in first}
        elif isinstance(first, int | float) and not isinstance(first, bool):
            out[name] = statistics.median(values)
        else:
            out[name] = first
    return out


def summarise(repeats: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per size over the repeats (each a :func:`validate`): the median real and simulated
    round times, the error of those medians, each repeat's error, the real means' range."""
    rows = []
    for per_k in zip(*repeats, strict=True):
        real = statistics.median(r["real_round_s"] for r in per_k)
        sim = statistics.median(r["sim_round_s"] for r in per_k)
        loads = [x for r in per_k for x in r["load_average_1min"]]
        rows.append(
            {
                **per_k[0],
                "repeats": len(per_k),
                "real_round_s": real,
                "real_round_spread": [min(r["real_round_s"] for r in per_k), max(r["real_round_s"] for r in per_k)],
                "sim_round_s": sim,
                "sim_round_spread": [min(r["sim_round_s"] for r in per_k), max(r["sim_round_s"] for r in per_k)],
                "error": sim / real - 1,
                "errors": [r["error"] for r in per_k],
                "load_average_1min": [min(loads), max(loads)],
            }
        )
    return rows


def scale(
    costs, members: list[int], epochs: int, nodes: int, cores: int, seeds: list[int], checkpoint_every: int = 1
) -> list[dict[str, Any]]:
    from dataclasses import replace

    from popgrpo.research.sim.costs import Linear
    from popgrpo.research.sim.model import ClusterShape, Scheduling, Workload, simulate

    # A cluster of its own: nobody else takes its cores (Ray's own processes still do).
    costs = replace(costs, background_share=Linear())
    rows = []
    cluster = ClusterShape(nodes, cores)
    for k in members:
        per_actor = max(1, math.ceil(k / (nodes * cores)))
        actors = math.ceil(k / per_actor)
        work = Workload(
            members=k,
            epochs=epochs,
            interval=SCALE_INTERVAL,
            top_m=3,
            members_per_actor=per_actor,
            straggler_sigma=1.0,
            node_mtbf_s=30.0,
            node_return_s=60.0,
            checkpoint_every=checkpoint_every,
        )
        for name, sched in (("sync", Scheduling("sync")), ("async", Scheduling("async", max(1, actors // 4), 4))):
            results = [simulate(costs, work, cluster, sched, seed=s) for s in seeds]
            rows.append(
                {
                    "k": k,
                    "mode": name,
                    "buffer": sched.buffer_for(actors),
                    "max_staleness": sched.max_staleness,
                    "members_per_actor": per_actor,
                    "wall_s": [r.wall_s for r in results],
                    "utilisation": [r.utilisation for r in results],
                    "wasted_share": [r.wasted_epochs / max(1, r.useful_epochs + r.wasted_epochs) for r in results],
                    "restarts": [r.restarts for r in results],
                    "checkpoint_every": checkpoint_every,
                }
            )
            print(f"K={k} {name}: {statistics.fmean(rows[-1]['wall_s']):.1f} s", flush=True)
    return rows


def _spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


PROBE = ROOT / "benchmarks" / "data" / "sim_probe.json"


def findings(rows: list[dict]) -> list[str]:
    """The probe's (benchmarks/sim_probe.py) rounds, one bullet each, from its data."""
    alone = rows[0]["alone_epoch"]
    lines = []
    shares = []  # the rest of the machine's share of the cores, per probed size
    loads = [x for r in rows[1:] for x in r["load_average_1min"]]
    for r in rows[1:]:
        cpu = r["cpu_s_per_round"]
        cores_s = CORES * r["round_s"]
        ray_s = sum(cpu.get(g, 0.0) for g in ("raylet", "gcs", "ray agents", "other ray workers"))
        outside = (cpu["member actors"] - r["member_train_cpu_s_per_round"]) / r["actors"]
        others = max(0.0, 1 - r["run_cpu_share_of_cores"] - r["machine_idle_s_per_round"] / cores_s)
        calls = sum(v for k, v in r["calls_s_per_round"].items() if k != "train")
        shares.append(others)
        lines.append(
            f"- K = {r['k']} ({r['actors']} actors), load {r['load_average_1min'][0]:.1f}: "
            f"{r['round_s']:.2f} s a round: the train call {r['train_wall_s_per_round']:.2f} s, the other "
            f"executor calls {calls:.2f} s, the driver outside calls {r['outside_calls_s_per_round']:.2f} s. "
            f"Of the cores' {cores_s:.2f} core-seconds a round the member actors used {cpu['member actors']:.2f} "
            f"({r['member_train_cpu_s_per_round']:.2f} in epochs: {r['member_epoch_cpu_ms']:.1f} ms an epoch, "
            f"against {alone['cpu_ms']:.1f} ms for an epoch alone in one process just before; "
            f"{outside * 1e3:.0f} ms an actor per call outside its epochs; "
            f"{r['actor_ctx_switches_per_round']['involuntary'] / r['actors']:.0f} involuntary context switches "
            f"an actor a round), the driver {cpu.get('driver', 0.0):.2f}, Ray's raylet, GCS, agents and idle "
            f"workers {ray_s:.2f} ({ray_s / cores_s:.1%} of the cores), the rest of the machine {others:.0%}."
        )
    first = ROOT / "benchmarks" / "data" / "sim_validation_first_model.json"
    before = []
    if first.is_file():
        data = json.loads(first.read_text())
        epoch, t = data["costs"]["epoch_s"], _config(5, 1, 4).scheduler.interval_epochs
        over = [
            f"{r['real_train_s'] / (r['k'] * t * epoch / min(r['actors'], CORES)) - 1:.0%} at K = {r['k']}"
            for r in data["validation"]
        ]
        before = [
            "In the first model's validation (its data kept in `benchmarks/data/sim_validation_first_model.json`), "
            f"the train call alone took {', '.join(over)} longer than K·T epochs of its {epoch * 1e3:.1f} ms "
            "spread over the cores: most of the gap was in the training phase, not in the merge, adopt or driver phases.",
            "",
        ]
    return [
        *before,
        "What the probe found (`python -m benchmarks.sim_probe`; 1-minute load averages "
        f"{min(loads):.1f}–{max(loads):.1f} during its runs, the runs' own actors included):",
        "",
        *lines,
        "",
        "In these rounds the time the first model missed went to: the share of the cores the rest of the "
        "machine took ("
        + ", ".join(f"{share:.0%} at K = {r['k']}" for r, share in zip(rows[1:], shares, strict=True))
        + "; the first model held 2 whole cores for the run); an epoch's "
        "CPU time growing with the actors that share the cores (time-slicing and caches: "
        + ", ".join(f"{r['member_epoch_cpu_ms'] / alone['cpu_ms'] - 1:+.0%} at K = {r['k']}" for r in rows[1:])
        + " over an epoch alone); an actor's CPU per call outside its epochs (Ray's worker threads and the "
        "live metrics published after every epoch: "
        + ", ".join(
            f"{r['cpu_s_per_round']['member actors'] / r['member_train_cpu_s_per_round'] - 1:+.0%} at K = {r['k']}"
            for r in rows[1:]
        )
        + " on top of the epochs' CPU); Ray's own processes and the driver, a few percent of the cores. The "
        "time from a call's submission to its start in the actor was not timed on its own: it is inside the "
        "train call's wall time, which the CPU accounting above accounts for.",
    ]


def _line(line, fmt: str) -> str:
    sign = "−" if line.b < 0 else "+"
    return f"({format(line.a, fmt)} {sign} {format(abs(line.b), fmt)}·x)"


def _share_at(row: dict) -> float:
    """The share of the cores the simulation of ``row`` gave the rest of the machine, at its actors per core."""
    line = row["sharing"]["background_share"]
    return max(0.0, line["a"] + line["b"] * row["actors"] / CORES)


def verdict(validation: list[dict]) -> list[str]:
    """The paragraph under the table: validated at every K, or where not and by how much."""
    off = [r for r in validation if abs(r["error"]) > TARGET]
    if not off:
        repeats = validation[0].get("repeats", 1)
        worst = max(abs(e) for r in validation for e in r.get("errors", [r["error"]]))
        return [
            f"**Validated on this machine**: the medians of the simulated round times are within ±{TARGET:.0%} "
            f"of the real ones' at K = {', '.join(str(r['k']) for r in validation)} over {repeats} repeat(s) of "
            f"calibration and real runs, with every cost measured at other sizes; a single repeat was up to "
            f"{worst:.0%} off (calibrations and runs vary from one to the next on this shared machine). "
            "That checks one node of 2 shared cores; the curves below add what it does not check (many nodes, "
            "stragglers, lost nodes, Ray at thousands of actors), so read them as the model's prediction.",
            "",
        ]
    return [
        f"**Not validated** at K = {', '.join(str(r['k']) for r in off)}: the simulated round "
        + ("time is " if len(off) == 1 else "times are ")
        + ", ".join(f"{r['error']:+.1%}" for r in off)
        + (" off the real one there" if len(off) == 1 else " off the real ones there")
        + f" (the target is ±{TARGET:.0%}), so the curves below are what the model says, "
        "not a prediction of a real cluster. " + remaining(validation, off),
        "",
    ]


def remaining(validation: list[dict], off: list[dict]) -> str:
    """What the data say about the remaining error: the other sessions' share of the cores."""
    from popgrpo.research.sim.measure import SHARING_AT

    x0, x1 = (n / CORES for n in SHARING_AT)
    parts = []
    for r in off:
        x = r["actors"] / CORES
        line = r["sharing"]["background_share"]
        if not x0 <= x <= x1:
            parts.append(
                f"At K = {r['k']} the run had {x:g} actors per core, outside the {x0:g}–{x1:g} the sharing terms "
                f"were measured at, so the share of the cores the rest of the machine took is the line "
                f"extrapolated ({_share_at(r):.0%}; measured {line['a'] + line['b'] * x0:.0%} and "
                f"{line['a'] + line['b'] * x1:.0%} at {x0:g} and {x1:g} just before), the least certain number "
                "of that prediction."
            )
    for r in off:
        x = r["actors"] / CORES
        ray = r["sharing"]["ray_share"]
        left = 1 - _share_at(r) - max(0.0, ray["a"] + ray["b"] * x)
        parts.append(
            f"With {left:.0%} of the cores left to the run at K = {r['k']}, one point of the cores more or less "
            f"for the rest of the machine moves the predicted round time by about {1 / left:.0f}%."
        )
    loads = [v for r in validation for v in r["load_average_1min"]]
    errors = [e for r in validation for e in r.get("errors", [r["error"]])]
    parts.append(
        f"Single repeats of the same procedure came out between {min(errors):+.0%} and {max(errors):+.0%} "
        f"(1-minute load averages {min(loads):.0f}–{max(loads):.0f} over these runs, the runs' own actors "
        "included): the calibration and the real round times both move from one repeat to the next on this "
        "machine by more than the target allows, so a single repeat says little either way."
    )
    return " ".join(parts)


def writer_bound(costs, curves: list[dict]) -> list[str]:
    """A paragraph when the driver's background writer, not the members, sets the pace at scale:
    its work per round (``driver_cost(K)``, one thread) against one actor's round of training,
    and what spacing the checkpoints out changed in the curves."""
    k = max(r["k"] for r in curves)

    def at(mode: str, every: int) -> dict | None:
        return next(
            (r for r in curves if r["k"] == k and r["mode"] == mode and r.get("checkpoint_every", 1) == every), None
        )

    row = at("sync", 1)
    if row is None:
        return []
    writes = costs.driver_cost(k)
    train = SCALE_INTERVAL * row["members_per_actor"] * costs.epoch_s  # T epochs of each of the actor's members
    if writes <= train:
        return []
    text = (
        f"At K = {k:,} the driver's per-round work ({costs.driver_s.a * 1e3:.1f} + {costs.driver_s.b * 1e3:.2f}·K ms "
        f"of CPU, plus {costs.logged_member_s * 1e3:.2f} ms for each of the {_logged(costs, k)} members with logger "
        f"series of their own: {writes:.1f} s a round, on the one background writer thread) takes longer than an "
        f"actor's round of training ({train:.2f} s): what is left is per member (its rows, its state in the "
        "checkpoint), measured at K = 2 and 8 and extrapolated."
    )
    if costs.checkpoint_member_s > 0:
        text += (
            f" Of it the checkpoint takes {costs.checkpoint_s * 1e3:.1f} + {costs.checkpoint_member_s * 1e3:.2f}·K ms "
            f"({costs.checkpoint_s + costs.checkpoint_member_s * k:.1f} s at K = {k:,}). An async merge's "
            "checkpoint holds every member's restore point, but serialises only those renewed since the last "
            "checkpoint (the reporters'); the others' files are linked from the round before"
            + (
                f", {costs.checkpoint_link_s * 1e3:.2f} ms a member (the archives' file, rewritten whole, included)."
                if costs.checkpoint_link_s > 0
                else "."
            )
        )
    rows = {(m, e): at(m, e) for m in ("sync", "async") for e in (1, 10)}
    if all(rows.values()):
        med = {key: statistics.median(r["wall_s"]) for key, r in rows.items() if r is not None}
        text += (
            f" With a checkpoint every round or merge, async rounds took {med['async', 1]:.0f} s to the sync "
            f"rounds' {med['sync', 1]:.0f} s; with `run.checkpoint_every` = 10, {med['async', 10]:.0f} s to "
            f"{med['sync', 10]:.0f} s (medians over the seeds): sync rounds hardly change (in the model each waits for its slowest "
            "member)."
        )
    else:
        text += (
            " A population of thousands needs checkpoints less often, or the writes spread over more than one "
            "writer, before async rounds can pay in full."
        )
    return [text, ""]


def _logged(costs, k: int) -> str:
    return f"{k:,}" if costs.logged_members is None else f"{min(k, costs.logged_members):,}"


def markdown(
    costs, validation: list[dict], curves: list[dict], seeds: int, command: str, autogroup: str | None = None
) -> str:
    from popgrpo.research.sim.measure import SHARING_AT

    x0, x1 = (n / CORES for n in SHARING_AT)
    groups = (
        [
            f"The kernel shares the cores between sessions here, not between tasks (autogroup scheduling, "
            f"`/proc/sys/kernel/sched_autogroup_enabled` = {autogroup}): in the calibration the rest of the "
            f"machine took {costs.background_share(x0):.0%} of the cores against {SHARING_AT[0]} actors and "
            f"{costs.background_share(x1):.0%} against {SHARING_AT[1]}, so more actors win the run hardly more "
            "of the cores, and the driver's work alone between rounds runs at the same fraction of a core as "
            "the actors'.",
        ]
        if autogroup == "1"
        else []
    )

    c = costs
    lines = [
        "### 7. Scheduler simulator: checked against real runs here, then 1,000–10,000 members",
        "",
        f"`{command}`; model: `popgrpo/research/sim/model.py`, costs: `popgrpo/research/sim/measure.py`.",
        "",
        f"Measured costs (pop_grpo preset, this machine; core work in CPU seconds; the median of "
        f"{validation[0].get('repeats', 1)} calibration(s), field by field; the driver's per-round work "
        "includes its background writer's CPU): "
        f"epoch {c.epoch_s * 1e3:.1f} ms, weights {c.weight_bytes:,} B, Ray call {c.call_s * 1e3:.2f} ms, "
        f"fetch {c.fetch_s.b * c.weight_bytes * 1e3:.2f} ms, adopt {c.adopt_s.b * c.weight_bytes * 1e3:.2f} ms, "
        f"merge {c.merge_s.a * 1e3:.2f} + {c.merge_s.b * 1e3:.2f}·M ms, driver {c.driver_s.a * 1e3:.1f} + "
        f"{c.driver_s.b * 1e3:.2f}·K ms per round plus {c.logged_member_s * 1e3:.2f} ms per member with logger "
        f"series of its own (`run.logged_members` = {c.logged_members}), "
        + (
            f"of it the checkpoint {c.checkpoint_s * 1e3:.1f} + {c.checkpoint_member_s * 1e3:.2f}·K ms "
            f"({c.checkpoint_link_s * 1e3:.2f} ms for a member whose state is unchanged since the last one), "
            if c.checkpoint_member_s > 0
            else ""
        )
        + f"actor start {c.start_s:.2f} s; sharing the cores, with x "
        f"actors per core (measured at {SHARING_AT[0]} and {SHARING_AT[1]} actors): an epoch's CPU time in real rounds "
        f"× {_line(c.contention, '.3f')}, {c.actor_call_cpu_s * 1e3:.1f} ms of an actor's CPU per train call "
        f"outside its epochs, Ray's own processes and the driver {_line(c.ray_share, '.1%')} of the cores, "
        f"the rest of the machine {_line(c.background_share, '.1%')} of the cores.",
        "",
        "Where the real round's time went that the first model (per-call costs only) missed: "
        "`python -m benchmarks.sim_probe` (data: `benchmarks/data/sim_probe.json`) times a real round "
        "at K = 5 and 16 phase by phase with every process's CPU time; its findings are listed below the "
        "table. The sharing terms model them. They are measured at 3 and 18 actors (1.5 and 9 per core), "
        "with the run's own members per actor, never at the validation's 5, 16 and 8 actors (2.5, 8 and "
        "4 per core, all between the two), and measured again right "
        "before each validation run, because other "
        "users of this machine take a share of the cores that changes minute by minute (the table gives "
        "the share the simulation of that run used). Fitting any term "
        "to the validation runs themselves would make the comparison circular; none is. "
        "A round's time, real and simulated, runs from one round's last report to the next round's "
        "(from round 2 on: the merge, the adopts and the round's epochs, with each actor's next train "
        "call queued right behind its adopt and the driver's writes in the background, as the "
        "real driver does).",
        "",
        md_table(
            [
                "K",
                "actors × members",
                "repeats × rounds",
                "real s/round: median (min–max)",
                "simulated s/round: median (min–max)",
                "error of the medians",
                "error in each repeat",
                "others' share of the cores",
                "load (1 min)",
                "target",
                "status",
            ],
            [
                [
                    r["k"],
                    f"{r['actors']} × {r['members_per_actor']}",
                    f"{r.get('repeats', 1)} × {r['rounds_measured']}",
                    f"{r['real_round_s']:.3f} ({r['real_round_spread'][0]:.3f}–{r['real_round_spread'][1]:.3f})",
                    f"{r['sim_round_s']:.3f}"
                    + (
                        f" ({r['sim_round_spread'][0]:.3f}–{r['sim_round_spread'][1]:.3f})"
                        if "sim_round_spread" in r
                        else ""
                    ),
                    f"{r['error']:+.1%}",
                    ", ".join(f"{e:+.1%}" for e in r.get("errors", [r["error"]])),
                    f"{_share_at(r):.0%}",
                    f"{r['load_average_1min'][0]:.1f}–{r['load_average_1min'][1]:.1f}",
                    f"±{TARGET:.0%}",
                    met(abs(r["error"]) <= TARGET),
                ]
                for r in validation
            ],
        ),
        "",
        *(findings(json.loads(PROBE.read_text())) if PROBE.is_file() else []),
        "",
        *groups,
        "",
        *verdict(validation),
        f"At scale (100 nodes × 16 cores, log-normal member times σ = 1, a node lost every 30 s, "
        f"{seeds} seeds: median (min–max)):",
        "",
        md_table(
            [
                "K",
                "mode",
                "B",
                "S",
                "checkpoint every (rounds / merges)",
                "time to N epochs, s",
                "utilisation",
                "work lost",
                "restarts",
            ],
            [
                [
                    r["k"],
                    r["mode"],
                    r["buffer"],
                    r["max_staleness"] if r["mode"] == "async" else "–",
                    r.get("checkpoint_every", 1),
                    _spread(r["wall_s"], ".1f"),
                    _spread(r["utilisation"], ".1%"),
                    _spread(r["wasted_share"], ".1%"),
                    _spread([float(x) for x in r["restarts"]], ".0f"),
                ]
                for r in curves
            ],
        ),
        "",
        *writer_bound(costs, curves),
        "The curves as a figure: `docs/img/sim_scale.png` (shown in docs/guides/scale.md).",
    ]
    return "\n".join(lines)


def figure(curves: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    everies = sorted({r.get("checkpoint_every", 1) for r in curves})
    for mode, colour in (("sync", "tab:red"), ("async", "tab:blue")):
        for every, style in zip(everies, ("-", "--", ":"), strict=False):
            rows = [r for r in curves if r["mode"] == mode and r.get("checkpoint_every", 1) == every]
            ks = [r["k"] for r in rows]
            label = mode if len(everies) == 1 else f"{mode}, checkpoint every {every}"
            for ax, key in zip(axes, ("wall_s", "utilisation"), strict=True):
                med = [statistics.median(r[key]) for r in rows]
                lo = [m - min(r[key]) for m, r in zip(med, rows, strict=True)]
                hi = [max(r[key]) - m for m, r in zip(med, rows, strict=True)]
                ax.errorbar(ks, med, yerr=[lo, hi], marker="o", color=colour, linestyle=style, label=label, capsize=3)
    axes[0].set(xscale="log", xlabel="members K", ylabel="time to N epochs per member (s)")
    axes[1].set(xscale="log", xlabel="members K", ylabel="core utilisation by useful epochs")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle("Simulated: 100 nodes × 16 cores, log-normal member times (σ = 1), node loss")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


CHECKPOINT_EVERY = (1, 10)  # run.checkpoint_every of the scale curves once the checkpoint's part is measured


def checkpoint_split(args: argparse.Namespace, base) -> int:
    """``--checkpoint-split``: the checkpoint's part of the driver's per-round work, measured
    ``args.repeats`` times (:func:`popgrpo.research.sim.measure.checkpoint_part`, the median of each of
    its two numbers), added to the saved costs; the scale curves simulated again for each
    :data:`CHECKPOINT_EVERY`; the section and figure redrawn. The validation is not rerun."""
    from dataclasses import replace

    from popgrpo.research.sim.costs import CostModel
    from popgrpo.research.sim.measure import NO_CHECKPOINTS, checkpoint_part, driver_line

    path = args.data / "sim_validation.json"
    data = json.loads(path.read_text())
    costs = CostModel.from_json(data["costs"])
    measured = []
    for i in range(args.repeats):
        with_ = driver_line(base, costs.merge_s, 0)
        without = driver_line(base, costs.merge_s, 0, NO_CHECKPOINTS)
        part = checkpoint_part(with_, without)
        measured.append({"with": [with_.a, with_.b], "without": [without.a, without.b], "part": list(part)})
        _say(f"repeat {i + 1}: checkpoint {part[0] * 1e3:.2f} ms + {part[1] * 1e3:.3f} ms per member")
    costs = replace(
        costs,
        checkpoint_s=statistics.median(m["part"][0] for m in measured),
        checkpoint_member_s=statistics.median(m["part"][1] for m in measured),
    )
    curves = [
        row
        for every in CHECKPOINT_EVERY
        for row in scale(costs, SCALE_SIZES, epochs=200, nodes=100, cores=16, seeds=[0, 1, 2], checkpoint_every=every)
    ]
    data.update(
        costs=costs.to_json(),
        curves=curves,
        checkpoint_split={"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": measured},
    )
    path.write_text(json.dumps(data, indent=1) + "\n")
    figure(curves, args.figure)
    region = markdown(
        costs,
        data["validation"],
        curves,
        len(curves[0]["wall_s"]),
        "python -m benchmarks.sim_validation; then python -m benchmarks.sim_validation --checkpoint-split",
        data.get("autogroup"),
    )
    write_between(args.out, region, BEGIN, END)
    print(f"wrote {args.out}, {path}, {args.figure}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smallest sizes; the numbers say nothing")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "simulator.md")
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "sim_scale.png")
    parser.add_argument("--render", action="store_true", help="redraw the section and figure from --data, run nothing")
    parser.add_argument(
        "--checkpoint-split",
        action="store_true",
        help="measure the checkpoint's part of the driver's work (3 times, in-process), add it to the saved costs "
        "and simulate the scale curves again with a checkpoint every round and every 10; the validation is kept",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="calibrations and real runs, each a repeat (default 3; --quick 1)"
    )
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)

    from popgrpo.research.sim.measure import calibrate

    base = _config(5, 1, 4)
    if args.checkpoint_split:
        return checkpoint_split(args, base)
    if args.render:  # the tables and the figure again from the saved data, nothing rerun
        from popgrpo.research.sim.costs import CostModel

        data = json.loads((args.data / "sim_validation.json").read_text())
        costs = CostModel.from_json(data["costs"])
        figure(data["curves"], args.figure)
        region = markdown(
            costs,
            data["validation"],
            data["curves"],
            len(data["curves"][0]["wall_s"]),
            "python -m benchmarks.sim_validation",
            data.get("autogroup"),
        )
        write_between(args.out, region, BEGIN, END)
        return 0
    from popgrpo.research.sim.costs import CostModel

    # --quick: the sharing terms at 1 and 3 actors, each over 2 rounds
    quick_sharing, quick_rounds = ((1, 3), 2) if args.quick else (None, None)
    calibrations, repeats = [], []
    for i in range(args.repeats):
        print(f"repeat {i + 1} of {args.repeats}: calibration, then the real runs", flush=True)
        costs = calibrate(
            base, epochs=4 if args.quick else 20, progress=_say, sharing_at=quick_sharing, sharing_rounds=quick_rounds
        )
        calibrations.append(costs.to_json())
        if args.quick:
            repeats.append(validate(costs, [(2, 1), (4, 2)], 3, 2, remeasure=False))
        else:
            repeats.append(validate(costs, [(5, 1), (16, 1), (64, 8)], rounds=6, interval=None))
    validation = summarise(repeats)
    costs = CostModel.from_json(median_costs(calibrations))
    if args.quick:
        curves = scale(costs, [200, 400], epochs=20, nodes=10, cores=16, seeds=[0])
    else:
        curves = [
            row
            for every in CHECKPOINT_EVERY
            for row in scale(
                costs, SCALE_SIZES, epochs=200, nodes=100, cores=16, seeds=[0, 1, 2], checkpoint_every=every
            )
        ]
    args.data.mkdir(parents=True, exist_ok=True)
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    (args.data / "sim_validation.json").write_text(
        json.dumps(
            {
                "costs": costs.to_json(),
                "validation": validation,
                "calibrations": calibrations,
                "repeats": repeats,
                "curves": curves,
                "autogroup": autogroup.read_text().strip() if autogroup.is_file() else None,
            },
            indent=1,
        )
        + "\n"
    )
    figure(curves, args.figure)
    command = "python -m benchmarks.sim_validation" + (" --quick" if args.quick else "")
    region = markdown(
        costs,
        validation,
        curves,
        len(curves[0]["wall_s"]),
        command,
        autogroup.read_text().strip() if autogroup.is_file() else None,
    )
    write_between(args.out, region, BEGIN, END)
    print(f"wrote {args.out}, {args.data / 'sim_validation.json'}, {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
