"""Section 2 (population throughput against K) and section 4 (multi-node scaling), on Ray.

Throughput is ideas per second of ``executor.train(n)``: every member trains ``n`` epochs of
``grpo.steps_per_epoch`` GRPO steps of P × G ideas, counted from the metrics rows the call
returns. Ray start-up, actor creation and one warm-up epoch are excluded. Memory is the peak
of the summed RSS of the driver, Ray's own processes and the population's actors (archive
and members), sampled every 0.1 s while it trains; PSS at the end of the timed call is
reported beside it (see :mod:`benchmarks.common`).

Three layouts of the same population (grpo preset members, ``population.size = K``):

* **packed**: ``members_per_actor = ceil(K / cores)``, 1 CPU each: one actor per core;
* **per member**: one actor per member, ``num_cpus = min(1, cores / K)`` so all fit;
* **packed + vectorize**: as packed, with ``population.vectorize=true``.

The executors of one K are created concurrently (their actors import torch and pyribs, about
3 CPU-seconds each, and creation is not what is measured), then timed one at a time while
the others sit idle.
"""

from __future__ import annotations

import math
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import (
    PeakMemory,
    driver_and_ray_daemons,
    gib,
    local_ray,
    loopback_ray_cluster,
    met,
    pss_bytes,
    rss_bytes,
    wait_until,
)
from popgrpo.config import Config, load_config, preset_path
from popgrpo.markdown import md_table

CORES = os.cpu_count() or 1
MEMORY_TARGET_BYTES = 24 * 2**30  # K = 256 runs in 24 GiB
THROUGHPUT_TARGET = 0.8  # of (single-member floor × cores used)
PACKED, PER_MEMBER, VECTORIZED = "packed", "per member", "packed + vectorize"


def population_config(k: int, variant: str, cores: int = CORES) -> Config:
    per_actor = 1 if variant == PER_MEMBER else math.ceil(k / cores)
    cpus = min(1.0, cores / k) if variant == PER_MEMBER else 1.0
    overrides = [
        f"population.size={k}",
        f"population.members_per_actor={per_actor}",
        f"population.resources.num_cpus={cpus:g}",
    ]
    if variant == VECTORIZED:
        overrides.append("population.vectorize=true")
    return load_config(preset_path("grpo"), overrides)


def _layout(cfg: Config) -> dict:
    pop = cfg.population
    actors = math.ceil(pop.size / pop.members_per_actor)
    return {"actors": actors, "per_actor": pop.members_per_actor, "cpus_each": pop.resources.num_cpus}


def create_executors(configs: list[Config]) -> list:
    """``RayExecutor`` per config, built concurrently; an exception in place of one that failed."""
    from popgrpo.runtime.ray_executor import RayExecutor

    def build(cfg: Config):
        try:
            return RayExecutor(cfg)
        except Exception as exc:  # reported in the table, the other layouts still run
            return exc

    with ThreadPoolExecutor(max_workers=max(1, len(configs))) as pool:
        return list(pool.map(build, configs))


def actor_pids(executor) -> list[int]:
    """Process ids of this executor's member actors and its archive actor, if it has one."""

    archive = [] if executor._archive_pid is None else [executor._archive_pid]
    return archive + executor.worker_pids()


def population_pids(executor) -> tuple[list[int], list[int]]:
    """``(driver and Ray's daemons, this executor's archive and member actors)``: process ids."""
    return driver_and_ray_daemons(), actor_pids(executor)


def close(executor) -> None:
    """Close and wait (up to 10 s) until its actor processes are gone, so the next peak is clean."""
    pids = actor_pids(executor)
    executor.close()
    wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), timeout=10)


def time_train(executor, epochs: int, pids: tuple[list[int], list[int]]) -> dict:
    """Warm-up epoch, then ``train(epochs)`` timed; ideas/s and memory (``pids``: :func:`population_pids`)."""
    daemons, actors = pids
    everything = sorted(set(daemons) | set(actors))
    with PeakMemory(everything) as memory:
        executor.train(1)
        start = time.perf_counter()
        rows = executor.train(epochs)
        seconds = time.perf_counter() - start
        pss = pss_bytes(everything)
    ideas = sum(row["ideas"] for member_rows in rows for row in member_rows)
    steps = sum(len(member_rows) for member_rows in rows) * executor.config.grpo.steps_per_epoch
    return {
        "epochs": epochs,
        "seconds": seconds,
        "ideas": ideas,
        "member_steps": steps,
        "ideas_per_s": ideas / seconds,
        "peak_rss": memory.peak,
        "pss": pss,
        "rss_per_actor": rss_bytes(actors) / len(actors),
    }


def vectorize_readers() -> list[str]:
    """popgrpo modules (besides the config) that read ``population.vectorize``: is it wired up?"""
    root = Path(__file__).resolve().parent.parent / "popgrpo"
    return sorted(
        str(p.relative_to(root.parent))
        for p in root.rglob("*.py")
        if p.parent.name != "config" and re.search(r"\bvectorize\b", p.read_text())
    )


def _epochs_for(k: int, quick: bool) -> int:
    """Timed epochs: about 32 member-epochs per measurement (quick: 4), at least one epoch."""
    return max(1, math.ceil((4 if quick else 32) / k))


def run_population(quick: bool, floor_ideas_per_s: float, cores: int = CORES) -> dict:
    """Needs a connected single-node Ray with at least ``3 × cores`` logical CPUs (see module doc)."""
    sizes = [1, 4, 16] if quick else [1, 4, 16, 64, 256]
    available = _mem_available()
    rss_per_actor, measured = 0.6 * 2**30, False  # a first guess until an actor's RSS is measured
    results = []
    for k in sizes:
        variants, skipped = [PACKED], {}
        if quick and k < 16:
            skipped[VECTORIZED] = "quick mode: vectorize is measured at K = 16 only"
        else:
            variants.append(VECTORIZED)
        if k == 1:
            skipped[PER_MEMBER] = "same layout as packed at K = 1 (one actor, one member)"
        elif quick and k > 4:
            skipped[PER_MEMBER] = f"quick mode: {k} actor start-ups (~3.5 CPU-s each) skipped"
        elif k * rss_per_actor > 0.5 * available:
            source = "as measured at smaller K" if measured else "estimated"
            skipped[PER_MEMBER] = (
                f"not run: {k} actor processes × {gib(rss_per_actor)} RSS each ({source}) ≈ "
                f"{gib(k * rss_per_actor)}, over half of the {gib(available)} available"
            )
        else:
            variants.insert(1, PER_MEMBER)
        configs = [population_config(k, v, cores) for v in variants]
        executors = create_executors(configs)
        epochs = _epochs_for(k, quick)
        try:
            for variant, cfg, executor in zip(variants, configs, executors, strict=True):
                entry = {"k": k, "variant": variant, **_layout(cfg)}
                if isinstance(executor, Exception):
                    entry["error"] = f"{type(executor).__name__}: {executor}".splitlines()[0]
                else:
                    try:
                        entry.update(time_train(executor, epochs, population_pids(executor)))
                        one_member = entry["per_actor"] == 1  # the per-member layout's actors
                        if one_member and (not measured or entry["rss_per_actor"] > rss_per_actor):
                            rss_per_actor, measured = entry["rss_per_actor"], True
                    except Exception as exc:
                        entry["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                results.append(entry)
        finally:
            for executor in executors:
                if not isinstance(executor, Exception):
                    close(executor)
        results.extend({"k": k, "variant": v, "skipped": why} for v, why in skipped.items())
    return {
        "cores": cores,
        "floor_ideas_per_s": floor_ideas_per_s,
        "rows": results,
        "vectorize_readers": vectorize_readers(),
        "mem_available": available,
    }


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def markdown_population(r: dict) -> str:
    floor, cores = r["floor_ideas_per_s"], r["cores"]
    order = {PACKED: 0, PER_MEMBER: 1, VECTORIZED: 2}
    rows_sorted = sorted(r["rows"], key=lambda e: (e["k"], order[e["variant"]]))
    packed_rate = {e["k"]: e["ideas_per_s"] for e in rows_sorted if e["variant"] == PACKED and "ideas_per_s" in e}
    lines = []
    for e in rows_sorted:
        k, variant = e["k"], e["variant"]
        if "skipped" in e or "error" in e:
            why = e.get("skipped") or f"failed: {e['error']}"
            lines.append([k, variant, "—", "—", "—", "—", "—", "—", "—", why])
            continue
        cores_used = min(cores, e["actors"])
        ratio = e["ideas_per_s"] / (floor * cores_used)
        step_ms = cores_used * e["seconds"] / e["member_steps"] * 1e3
        floor_ms = e["ideas"] / e["member_steps"] / floor * 1e3
        why = f"{step_ms:.2f} ms per member step per core vs {floor_ms:.2f} ms in-process"
        if e["actors"] > cores:
            why += f"; {e['actors']} actors time-share {cores} cores"
        status = f"≥ {THROUGHPUT_TARGET:.0%} of floor × {cores_used}: {met(ratio >= THROUGHPUT_TARGET, why)}"
        if k == 256:
            fits = e["peak_rss"] <= MEMORY_TARGET_BYTES
            status += f"; peak RSS ≤ {gib(MEMORY_TARGET_BYTES)}: {met(fits, gib(e['peak_rss']))}"
        vs_packed = "" if variant == PACKED or k not in packed_rate else f"{e['ideas_per_s'] / packed_rate[k]:.2f}×"
        lines.append(
            [
                k,
                variant,
                f"{e['actors']} × {e['per_actor']} @ {e['cpus_each']:g} CPU",
                f"{e['ideas_per_s']:,.0f}",
                vs_packed,
                f"{ratio:.0%}",
                gib(e["peak_rss"]),
                gib(e["pss"]),
                f"{e['epochs']} ep, {e['seconds']:.2f} s",
                status,
            ]
        )
    table = md_table(
        [
            "K",
            "layout",
            "actors × members @ CPUs",
            "ideas/s",
            "vs packed",
            "ideas/s ÷ (floor × cores used)",
            "peak RSS",
            "PSS at end",
            "timed",
            "target: status",
        ],
        lines,
    )
    readers = ", ".join(f"`{m}`" for m in r["vectorize_readers"]) or "no module yet"
    return "\n\n".join(
        [
            f"grpo preset members; floor = one member's in-process step from section 1, "
            f"{floor:,.0f} ideas/s; cores used = min({cores}, member actors). Memory: driver + Ray's "
            "own processes + this population's actors (RSS counts shared libraries once per process; "
            f"PSS shares them out). `population.vectorize` is read by: {readers}.",
            table,
        ]
    )


# ---- section 4: multi-node --------------------------------------------------------------------
N_NODES = 4


def multinode_config(k: int, cpus_per_node: int) -> Config:
    """K members in one actor per node (``members_per_actor = K / nodes``), a node's CPUs each."""
    return load_config(
        preset_path("grpo"),
        [
            f"population.size={k}",
            f"population.members_per_actor={math.ceil(k / N_NODES)}",
            f"population.resources.num_cpus={cpus_per_node}",
        ],
    )


def _measure_on_connected_ray(cfg: Config, epochs: int) -> dict:
    import ray

    (executor,) = create_executors([cfg])
    if isinstance(executor, Exception):
        raise executor
    try:
        nodes = len(set(executor.worker_node_ids()))
        result = time_train(executor, epochs, population_pids(executor))
        result["nodes_used"] = nodes
        result["cluster_nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        return result
    finally:
        close(executor)


def multinode_sizes(quick: bool, cores: int = CORES) -> tuple[int, int, int]:
    """``(K, cpus per node, timed epochs)``."""
    cpus_per_node = max(1, cores // N_NODES)  # Ray needs whole CPUs per node
    return (4, cpus_per_node, 2) if quick else (16, cpus_per_node, 4)


def run_multinode_single(quick: bool, population: dict | None = None, cores: int = CORES) -> dict:
    """The one-node baseline on the connected single-node Ray (``N_NODES × cpus_per_node`` CPUs needed).

    When section 2 (``population``, :func:`run_population`'s result) already timed the same
    actors × members layout on this node, that measurement is the baseline: a CPU
    reservation changes nothing on one node, and each actor start-up costs seconds.
    """
    k, cpus_per_node, epochs = multinode_sizes(quick, cores)
    cfg = multinode_config(k, cpus_per_node)
    layout = _layout(cfg)
    for row in (population or {}).get("rows", []):
        same = (row["k"], row.get("actors"), row.get("per_actor")) == (k, layout["actors"], layout["per_actor"])
        if same and "ideas_per_s" in row and row["variant"] != VECTORIZED:
            return {**row, "nodes_used": 1, "from_section_2": f"K = {k} {row['variant']}"}
    return _measure_on_connected_ray(cfg, epochs)


def run_multinode_cluster(quick: bool, cores: int = CORES) -> dict:
    """The same population on a loopback ``Cluster`` of N_NODES nodes (starts and stops it)."""
    k, cpus_per_node, epochs = multinode_sizes(quick, cores)
    start = time.perf_counter()
    head = {"num_cpus": cpus_per_node, "include_dashboard": False}
    with loopback_ray_cluster(head, worker_cpus=(cpus_per_node,) * (N_NODES - 1)):
        started = time.perf_counter() - start
        result = _measure_on_connected_ray(multinode_config(k, cpus_per_node), epochs)
    result["cluster_start_s"] = started
    return result


def markdown_multinode(single: dict, multi: dict, quick: bool, cores: int = CORES) -> str:
    k, cpus_per_node, _ = multinode_sizes(quick, cores)
    ratio = multi["ideas_per_s"] / single["ideas_per_s"]
    logical = N_NODES * cpus_per_node
    reused = single.get("from_section_2")
    rows = [
        [
            "1 node (embedded single-node Ray" + (f"; section 2's {reused} row)" if reused else ")"),
            single["nodes_used"],
            f"{single['ideas_per_s']:,.0f}",
            "1.00×",
            gib(single["peak_rss"]),
            f"{single['epochs']} ep, {single['seconds']:.2f} s",
            "",
        ],
        [
            f"{N_NODES} nodes (`ray.cluster_utils.Cluster`, {cpus_per_node} CPU each)",
            multi["nodes_used"],
            f"{multi['ideas_per_s']:,.0f}",
            f"{ratio:.2f}×",
            gib(multi["peak_rss"]),
            f"{multi['epochs']} ep, {multi['seconds']:.2f} s",
            f"≥ 0.9× of 1 node on the same cores: {met(ratio >= 0.9, f'{ratio:.2f}×')}",
        ],
    ]
    table = md_table(
        ["cluster", "nodes holding members", "ideas/s", "vs 1 node", "peak RSS", "timed", "target: status"], rows
    )
    return "\n\n".join(
        [
            f"K = {k} grpo members, {N_NODES} actors of {math.ceil(k / N_NODES)} member(s), {cpus_per_node} CPU each; "
            "each member's private archive in its own actor (no archive actor, no per-step call). All nodes are "
            f"processes on this {cores}-core machine (Ray needs whole CPUs per node: {cpus_per_node} logical CPU "
            f"per node, {logical} in all), so this shows what the multi-node layout costs (one raylet and object "
            "store per node, the driver's calls crossing nodes), not real scaling, which needs more machines.",
            table,
        ]
    )


__all__ = [
    "create_executors",
    "local_ray",
    "markdown_multinode",
    "markdown_population",
    "population_config",
    "run_multinode_cluster",
    "run_multinode_single",
    "run_population",
    "time_train",
]
