"""Section 5: archive and novelty cost against batch size and memory size, in one process.

What the archive actor does per GRPO step, timed without Ray: the MAP-Elites insert
(:meth:`MapElitesArchive.add`, in-order statuses plus pyribs' store) against the batch
size N, and the novelty memory's ``score`` + ``add`` (k-NN over a rolling memory) against N
and against the memory's capacity C. Ideas are drawn like an untrained policy's (standard
normal in R^16), rewards and behaviours from the idea environment; the archive is filled
and the memory full before timing, so every call sees the steady state. A line
``t = a + b·size`` is fitted per series; linear cost means R² near 1 and time ratios near
the size ratios once ``b·size`` dominates ``a``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.common import fit_line, met
from popgrpo.config import load_config, preset_path
from popgrpo.core.archive import MapElitesArchive
from popgrpo.core.novelty import NoveltyMemory
from popgrpo.envs import make_env
from popgrpo.markdown import md_table

TARGET_R2 = 0.98
DEFAULT_BATCH = 128  # P × G of one GRPO step
DEFAULT_CAPACITY = 512  # maxent.novelty.capacity
N_BATCHES = 8  # distinct pre-drawn batches cycled through while timing


def _batches(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    env = make_env(load_config(preset_path("grpo")).env)
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(N_BATCHES):
        ideas = torch.randn(n, env.idea_dim, generator=generator)
        out.append(
            {
                "ideas": ideas,
                "ideas_np": ideas.double().numpy(),
                "behaviours": env.behaviour(ideas).double().numpy(),
                "rewards": env.reward(ideas, generator).double().numpy(),
            }
        )
    return out


def _per_call(call: Callable[[dict], object], batches: list[dict], min_time: float, repeats: int) -> float:
    """Median over ``repeats`` of seconds per call, each repeat cycling batches for ``min_time``."""
    results = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            call(batches[calls % len(batches)])
            calls += 1
            elapsed = time.perf_counter() - start
            if calls >= 3 and elapsed >= min_time:
                break
        results.append(elapsed / calls)
    return statistics.median(results)


def _archive_add(n: int, min_time: float, repeats: int) -> float:
    archive = MapElitesArchive(10)
    fill = _batches(max(n, 1024), seed=1)
    for b in fill:  # occupy the grid first: steady state, most ideas are "not added"
        archive.add(b["behaviours"], b["rewards"], b["ideas_np"])
    batches = _batches(n, seed=2)
    return _per_call(lambda b: archive.add(b["behaviours"], b["rewards"], b["ideas_np"]), batches, min_time, repeats)


def _novelty(n: int, capacity: int, min_time: float, repeats: int) -> float:
    memory = NoveltyMemory(capacity, k=5)
    memory.add(torch.randn(capacity, 16, generator=torch.Generator().manual_seed(3)))  # full from the start
    batches = _batches(n, seed=4)

    def call(b: dict) -> None:
        memory.score(b["ideas"])
        memory.add(b["ideas"])

    return _per_call(call, batches, min_time, repeats)


def run(quick: bool = False) -> dict:
    torch.set_num_threads(1)  # as in a member or the archive actor (run.torch_threads)
    if quick:
        sizes, capacities, min_time, repeats = [128, 512, 2048], [128, 512, 2048], 0.02, 1
    else:
        sizes = [128 * 2**i for i in range(7)]  # 128 … 8192
        capacities = [128 * 2**i for i in range(6)]  # 128 … 4096
        min_time, repeats = 0.2, 3
    series = {
        "archive_add_vs_batch": {
            "what": "MAP-Elites insert (`MapElitesArchive.add`) vs batch size N",
            "size_name": "N",
            "per": "idea",
            "points": [(n, _archive_add(n, min_time, repeats)) for n in sizes],
        },
        "novelty_vs_batch": {
            "what": f"novelty score + add vs batch size N (capacity {DEFAULT_CAPACITY}, k = 5)",
            "size_name": "N",
            "per": "idea",
            "points": [(n, _novelty(n, DEFAULT_CAPACITY, min_time, repeats)) for n in sizes],
        },
        "novelty_vs_capacity": {
            "what": f"novelty score + add vs memory capacity C (batch {DEFAULT_BATCH}, k = 5)",
            "size_name": "C",
            "per": "memory entry",
            "points": [(c, _novelty(DEFAULT_BATCH, c, min_time, repeats)) for c in capacities],
        },
    }
    for s in series.values():
        xs, ts = zip(*s["points"], strict=True)
        s["intercept_us"], s["slope_us"], s["r2"] = fit_line(xs, [t * 1e6 for t in ts])
    return {"series": series, "min_time": min_time, "repeats": repeats}


def markdown(r: dict) -> str:
    rows = []
    for s in r["series"].values():
        previous = None
        for size, seconds in s["points"]:
            us = seconds * 1e6
            growth = "" if previous is None else f"{us / previous[1]:.2f}× for {size / previous[0]:.0f}× size"
            per_idea = us / size if s["per"] == "idea" else us / DEFAULT_BATCH
            rows.append([s["what"], f"{s['size_name']} = {size}", f"{us:,.1f}", f"{per_idea:.3f}", growth])
            previous = (size, us)
    fits = md_table(
        ["series", "fit: µs per call = a + b·size", "R²", "target", "status"],
        [
            [
                s["what"],
                f"a = {s['intercept_us']:,.1f} µs, b = {s['slope_us']:.4f} µs per {s['per']}",
                f"{s['r2']:.4f}",
                f"linear: R² ≥ {TARGET_R2}",
                met(s["r2"] >= TARGET_R2, f"R² = {s['r2']:.3f}: not a straight line over these sizes"),
            ]
            for s in r["series"].values()
        ],
    )
    table = md_table(["series", "size", "µs per call", "µs per idea", "growth vs previous size"], rows)
    return "\n\n".join(
        [
            f"One thread, no Ray; each point is the median of {r['repeats']} repeats of at least "
            f"{r['min_time']:g} s of calls on {N_BATCHES} pre-drawn batches. A GRPO step sends N = "
            f"{DEFAULT_BATCH}; the default novelty memory is C = {DEFAULT_CAPACITY}.",
            table,
            fits,
        ]
    )
