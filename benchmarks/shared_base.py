"""Members on one shared base against the same members each with a model of its own.

``python -m benchmarks.shared_base --model DIR [--members 1,2,4,8] [--repeats 3] [--device cpu|cuda]
[--dtype float32|bfloat16] [--label NAME] [--json PATH] [--write docs/benchmarks/shared-base.md]``;
``python -m benchmarks.shared_base --render A.json [B.json ...] --write docs/benchmarks/shared-base.md`` redraws the
section from saved results; ``--targets A.json`` prints the issue's three targets as met or not.

For each M in ``--members`` and each side, a fresh process builds M members and times
``--steps`` member steps after one untimed warm-up step:

* **separate**: M :class:`~popgrpo.policies.causal_lm.CausalLMPolicy` objects, each loading the
  base model, stepping one after another (what ``population.members_per_actor`` = M does without
  ``policy.causal_lm.share_base``);
* **shared**: one :class:`~popgrpo.policies.shared_base.SharedBase` with M adapters, every phase
  one mixed-adapter batch (what ``share_base`` does).

A step has the three phases of the TRL benchmark's profile: generation (``P`` prompts × ``G``
completions a member, exactly ``T`` new tokens: ``min_new_tokens = max_new_tokens``, so the rate
does not depend on what the random weights say), the reference pass (base model, no adapter) and
the update (forward with entropy, a GRPO-shaped token loss, backward, each member's Adam step).
Both sides do the same work on the same prompts with the same LoRA settings; the loss's value is
not what is measured. tokens/s is every member's completion tokens over the step's wall time;
a phase's tokens/s is the same tokens over that phase's seconds.

Peak memory is the process's peak RSS (``ru_maxrss``, loading included) on the CPU, or
``torch.cuda.max_memory_allocated`` on a GPU. The sides alternate within a repeat, M by M, in
fresh processes, so both see the same background load; the table gives medians with the range
over repeats, and the shared/separate ratio per repeat (paired).

Opt-in, for a GPU (nothing changes without them):

* ``--diagnose 1,8``: at these M, one more step after the timed ones, untimed, under
  ``torch.profiler``: each phase's GPU busy time (the union of its kernels' and copies'
  intervals) over the phase's wall time in the timed steps. A phase whose GPU is busy less than
  :data:`LAUNCH_BOUND_BELOW` of its wall time is flagged launch-bound: the GPU waits on the host
  to launch the next kernel (or on host work). The separate side profiles its first member only
  (its members do the same work) against its wall time per member. On the CPU the diagnosis is
  recorded as not applicable.
* ``--decode-graphs 8,16``: at these M, a third side, the shared base with **graph decoding**:
  ``generate`` with transformers' static KV cache and its decoding step compiled by
  ``torch.compile`` (``--graphs-backend inductor``: ``mode="reduce-overhead"``, CUDA graphs;
  ``cudagraphs``: dynamo's CUDA-graph backend on eager kernels), so that a decoding step is one
  graph replay instead of thousands of kernel launches. Compilation happens in the untimed
  warm-up step (its seconds are ``warmup_s``). On the CPU it is recorded as "skipped: needs
  CUDA", except ``--graphs-backend eager`` (the static cache and the compiled step without
  graphs: what the tests run on the CPU).
* ``--budget-s S``: the whole benchmark stops within S seconds (a run is started only with 20 s
  left, and is given what is left at most); ``--separate-last`` runs each M's separate side after
  its shared ones (the separate side is the costly and the known one, so it is what a budget
  cuts). With ``--json`` the results are written after every run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import met, write_between
from popgrpo.markdown import md_table

PROMPTS = ["def add(a, b):", "x = 3 * (4 + 5)", "for i in range(3):", "print(1 + 2)", "y = [1, 2]", "z = 7 - 2"]
BEGIN, END = "<!-- shared-base-cpu:begin -->", "<!-- shared-base-cpu:end -->"
GPU_BEGIN, GPU_END = "<!-- shared-base-gpu:begin -->", "<!-- shared-base-gpu:end -->"
PHASES = ("generation", "reference", "update")
PHASE_MARK = "popgrpo-phase:"  # the profiler's name of a phase's window (torch.profiler.record_function)
LAUNCH_BOUND_BELOW = 0.5
"""A phase whose GPU is busy less than this share of its wall time is flagged launch-bound."""
NOT_APPLICABLE = "not applicable on the CPU (no GPU kernels: a phase computes where it runs)"
NEEDS_CUDA = "skipped: needs CUDA"
GRAPHS_MODES = {"inductor": "reduce-overhead", "cudagraphs": "default", "eager": "default"}
"""``--graphs-backend``: torch.compile's backend, and the mode it is given."""
TARGET_SPEED, TARGET_MEMORY, TARGET_TOKENS_S, TARGET_M = 3.0, 1.5, 2000.0, 8
"""Issue 45's targets: at M = 8, ≥ 3× the tokens/s of 8 separate members and ≤ 1.5× one member's
peak memory; ≥ 2,000 generated-and-trained tokens/s end to end (the shared side's best M)."""
MIN_RUN_S = 20  # --budget-s: no run is started with less than this left


def busy_seconds(
    windows: Iterable[tuple[str, float, float]], intervals: Iterable[tuple[float, float]]
) -> dict[str, float]:
    """For each window name, the time covered by ``intervals`` (the union, so overlapping kernels
    count once) inside that name's ``(name, start, end)`` windows, summed over them."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    busy: dict[str, float] = {}
    for name, lo, hi in windows:
        covered = sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in merged if end > lo and start < hi)
        busy[name] = busy.get(name, 0.0) + covered
    return busy


def diagnosis_of(busy: dict[str, float], wall: dict[str, float], below: float = LAUNCH_BOUND_BELOW) -> dict[str, Any]:
    """Per phase: GPU busy seconds, wall seconds, their ratio, and whether that is under ``below``."""
    phases = {}
    for phase, seconds in wall.items():
        share = busy.get(phase, 0.0) / seconds if seconds > 0 else float("nan")
        phases[phase] = {
            "gpu_busy_s": busy.get(phase, 0.0),
            "wall_s": seconds,
            "busy_share": share,
            "launch_bound": bool(share < below),
        }
    return {"applicable": True, "below": below, "phases": phases}


def profile_intervals(prof: Any) -> tuple[list[tuple[str, float, float]], list[tuple[float, float]]]:
    """From a finished ``torch.profiler.profile``: the phase windows (``record_function`` ranges
    named :data:`PHASE_MARK` + phase, on the host) and the GPU's activity intervals (kernels,
    copies, sets), in seconds on the profiler's one clock. Read from the raw kineto events, not
    ``prof.events()``, whose tree of a step's hundreds of thousands of events takes minutes."""
    from torch.autograd import DeviceType

    windows, intervals = [], []
    for event in prof.profiler.kineto_results.events():
        name = event.name()
        start = event.start_ns() / 1e9
        end = start + event.duration_ns() / 1e9
        if event.device_type() == DeviceType.CPU:
            if name.startswith(PHASE_MARK):
                windows.append((name[len(PHASE_MARK) :], start, end))
        elif event.device_type() == DeviceType.CUDA:
            annotation = getattr(event, "is_user_annotation", lambda: False)()
            if not annotation and not name.startswith(PHASE_MARK):
                intervals.append((start, end))
    return windows, intervals


def _decode_with_graphs(policies: Sequence[Any], backend: str) -> None:
    """Every ``generate`` of these policies (and of a shared base, which takes its settings from its
    first member's) runs with a static KV cache and a compiled decoding step (transformers'
    automatic compilation in ``generate``): on CUDA with CUDA graphs but for ``eager``."""
    from transformers import CompileConfig

    config = CompileConfig(backend=backend, mode=GRAPHS_MODES[backend])
    if backend == "eager":
        config._compile_all_devices = True  # transformers compiles only on accelerators unless told
    for policy in policies:
        policy.generation_config = functools.partial(
            type(policy).generation_config, policy, cache_implementation="static", compile_config=config
        )


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """One side at one M: build, warm up, time ``args.steps`` steps; the measurements as a dict."""
    import torch

    from popgrpo.config import CausalLMConfig
    from popgrpo.policies.causal_lm import CausalLMPolicy
    from popgrpo.policies.shared_base import MixedBatch, SharedBase, update_members

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    cfg = CausalLMConfig.model_validate(
        {
            "model": args.model,
            "dtype": args.dtype,
            "max_new_tokens": args.tokens,
            "min_new_tokens": args.tokens,
            "prompts_per_step": args.prompts,
            "lora": {"r": args.rank},
            "share_base_update_members": args.update_members,
        }
    )
    m = args.m
    start = time.perf_counter()
    if args.mode == "separate":
        policies = [CausalLMPolicy(cfg, device, torch.Generator().manual_seed(k)) for k in range(m)]
        base = None
    else:
        base = SharedBase(cfg, range(m), device)
        policies = [base.member_policy(k, torch.Generator().manual_seed(k)) for k in range(m)]
    sync()
    load_s = time.perf_counter() - start
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.decode == "graphs":
        _decode_with_graphs(policies, args.graphs_backend)
    optimizers = [torch.optim.Adam(p.parameters(), lr=1e-4) for p in policies]
    generators = [torch.Generator().manual_seed(100 + k) for k in range(m)]
    prompt_sets = [[PROMPTS[(k + i) % len(PROMPTS)] for i in range(args.prompts)] for k in range(m)]

    def loss_of(logp: torch.Tensor, ref: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        advantage = torch.linspace(-1, 1, logp.shape[0], device=logp.device)[:, None]
        terms = -(logp - logp.detach()).exp() * advantage + 0.04 * (ref - logp) - 0.01 * entropy
        return (terms * mask).sum() / mask.sum()

    def unmarked(name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def step(
        mark: Callable[[str], contextlib.AbstractContextManager[Any]] = unmarked, first_only: bool = False
    ) -> tuple[dict[str, float], int]:
        """One step of every member (``first_only``: of the separate side's first member), each
        phase inside ``mark(phase)`` (the profiler's window in the diagnosis)."""
        phases = dict.fromkeys(PHASES, 0.0)
        tokens = 0
        if base is None:
            members = list(zip(policies, optimizers, generators, prompt_sets, strict=True))
            for policy, opt, gen, prompts in members[:1] if first_only else members:
                with mark("generation"):
                    t0 = time.perf_counter()
                    rollout = policy.rollout(prompts, args.group, gen)
                    sync()
                    t1 = time.perf_counter()
                with mark("reference"):
                    ref = policy.reference_log_probs(rollout)
                    sync()
                    t2 = time.perf_counter()
                with mark("update"):
                    logp, entropy = policy.token_log_probs(rollout, with_entropy=True)
                    assert entropy is not None
                    mask = rollout.completion_mask.to(logp.device)
                    opt.zero_grad(set_to_none=True)
                    loss_of(logp, ref, entropy, mask).backward()
                    opt.step()
                    sync()
                    t3 = time.perf_counter()
                phases["generation"] += t1 - t0
                phases["reference"] += t2 - t1
                phases["update"] += t3 - t2
                tokens += int(rollout.completion_mask.sum())
            return phases, tokens
        with mark("generation"):
            t0 = time.perf_counter()
            seeds = [int(torch.randint(0, 2**62, (1,), generator=g)) for g in generators]
            rollouts = base.mixed_rollouts(policies, prompt_sets, args.group, seeds)
            sync()
            t1 = time.perf_counter()
        with mark("reference"):
            batch = MixedBatch.of(policies, rollouts)
            with torch.no_grad():
                refs = base.mixed_log_probs(batch, reference=True)
            sync()
            t2 = time.perf_counter()
        with mark("update"):
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            chunk = update_members(cfg, m, device)  # as SharedBaseMembers passes the update
            for start in range(0, m, chunk):
                part = list(range(start, min(start + chunk, m)))
                passes = base.mixed_log_probs(batch.select(part), with_entropy=True)
                losses = []
                for (logp, entropy), k in zip(passes, part, strict=True):
                    assert entropy is not None
                    mask = rollouts[k].completion_mask.to(logp.device)
                    losses.append(loss_of(logp, refs[k][0], entropy, mask))
                torch.stack(losses).sum().backward()
            for opt in optimizers:
                opt.step()
            sync()
            t3 = time.perf_counter()
        tokens = sum(int(r.completion_mask.sum()) for r in rollouts)
        return {"generation": t1 - t0, "reference": t2 - t1, "update": t3 - t2}, tokens

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    warm = time.perf_counter()
    step()  # warm-up: first-call costs (and graph decoding's compilation)
    warmup_s = time.perf_counter() - warm
    timed = [step() for _ in range(args.steps)]
    seconds = sum(sum(p.values()) for p, _ in timed)
    tokens = sum(t for _, t in timed)
    phases_s = {k: sum(p[k] for p, _ in timed) / args.steps for k in timed[0][0]}
    result = {
        "mode": args.mode,
        "decode": args.decode,
        "m": m,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "phases_s": phases_s,
        "phase_tokens_per_s": {k: tokens / args.steps / v for k, v in phases_s.items()},
        "load_s": load_s,
        "warmup_s": warmup_s,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_after_load_bytes": rss_loaded,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "peak_gpu_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
    }
    if args.diagnose and not cuda:
        result["diagnosis"] = {"applicable": False, "reason": NOT_APPLICABLE}
    elif args.diagnose:
        try:
            result["diagnosis"] = _diagnose(step, phases_s, m if base is None else None)
        except Exception as exc:  # the timed figures stand without it
            result["diagnosis"] = {"applicable": False, "reason": f"failed: {type(exc).__name__}: {exc}"}
    return result


def _diagnose(step: Callable[..., Any], phases_s: dict[str, float], separate_m: int | None) -> dict[str, Any]:
    """One more step under ``torch.profiler`` (CUDA): each phase's GPU busy time against its wall
    time in the timed steps. ``separate_m``: the separate side's M, of which the first member alone
    is profiled, against the wall time per member."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def marked(name: str) -> contextlib.AbstractContextManager[Any]:
        return record_function(PHASE_MARK + name)

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        profiled, _ = step(marked, first_only=True)
    windows, intervals = profile_intervals(prof)
    per = separate_m or 1
    diagnosis = diagnosis_of(busy_seconds(windows, intervals), {k: v / per for k, v in phases_s.items()})
    diagnosis.update(profiled_wall_s=profiled, members_profiled="first" if separate_m else "all")
    return diagnosis


def side_of(run: dict[str, Any]) -> str:
    """A run's side as the tables name it: ``separate``, ``shared``, ``shared, graph decoding``."""
    decode = run.get("decode", "plain")
    return run["mode"] if decode == "plain" else f"{run['mode']}, graph decoding"


def _run_child(args: argparse.Namespace, mode: str, m: int, decode: str, timeout: float) -> dict[str, Any]:
    """One side at one M in a fresh process, cut after ``timeout`` seconds."""
    identity = {"mode": mode, "decode": decode, "m": m}
    if decode == "graphs" and args.device != "cuda" and args.graphs_backend != "eager":
        return {**identity, "skipped": NEEDS_CUDA}
    command = [sys.executable, "-m", "benchmarks.shared_base", "--child", "--mode", mode, "--m", str(m)]
    for key in ("model", "device", "dtype", "steps", "prompts", "group", "tokens", "rank", "threads"):
        command += [f"--{key}", str(getattr(args, key))]
    if args.update_members is not None:
        command += ["--update-members", str(args.update_members)]
    command += ["--decode", decode, "--graphs-backend", args.graphs_backend]
    if m in _members(args.diagnose):
        command += ["--diagnose-child"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        cut = " (what was left of the budget)" if timeout < args.timeout else ""
        return {**identity, "error": [f"cut: timed out after {timeout:.0f} s{cut}"]}
    if done.returncode != 0:
        return {**identity, "error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _members(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def _sides(runs: list[dict[str, Any]]) -> list[str]:
    order = ["separate", "shared", "shared, graph decoding", "separate, graph decoding"]
    present = {side_of(r) for r in runs}
    return [s for s in order if s in present]


def _memory_key(result: dict[str, Any]) -> str:
    return "peak_gpu_bytes" if result["settings"]["device"] == "cuda" else "peak_rss_bytes"


def _phase_tokens_per_s(run: dict[str, Any], steps: int) -> dict[str, float]:
    return {k: run["tokens"] / steps / v for k, v in run["phases_s"].items()}


def render(result: dict[str, Any], with_targets: bool = False) -> str:
    """The Markdown section of one run of this benchmark (``with_targets``: and the issue's targets)."""
    runs = [r for r in result["runs"] if "error" not in r and "skipped" not in r]
    s = result["settings"]
    gpu = s["device"] == "cuda"
    memory_key = _memory_key(result)
    one = [r[memory_key] for r in runs if side_of(r) == "separate" and r["m"] == 1]
    one_member = statistics.median(one) if one else float("nan")
    sides = _sides(runs)
    others = [side for side in sides if side != "separate"]
    rows = []
    for m in sorted(s["members"]):
        cells: list[object] = [m]
        rates: dict[str, list[float]] = {}
        for side in sides:
            mine = [r for r in runs if r["m"] == m and side_of(r) == side]
            rates[side] = [r["tokens_per_s"] for r in mine]
            memory = [r[memory_key] / 2**30 for r in mine]
            cells += [_spread(rates[side], ".1f"), _spread(memory, ".2f")]
        for side in others:
            paired = [x / p for x, p in zip(rates[side], rates.get("separate", []), strict=False)]
            side_memory = [r[memory_key] for r in runs if r["m"] == m and side_of(r) == side]
            cells += [
                _spread(paired, ".2f"),
                f"{statistics.median(side_memory) / one_member:.2f}" if side_memory and one else "—",
            ]
        rows.append(cells)
    memory = "peak GPU memory allocated (GiB)" if gpu else "peak RSS (GiB)"
    header = ["M"]
    for side in sides:
        header += [f"{side} tokens/s", f"{side} {memory}"]
    for side in others:
        header += [f"{side} / separate tokens/s", f"{side} memory / one member's"]
    phase_rows = []
    for m in sorted(s["members"]):
        for side in sorted(sides):
            mine = [r for r in runs if r["m"] == m and side_of(r) == side]
            if not mine:
                continue
            seconds = [statistics.median(r["phases_s"][k] for r in mine) for k in PHASES]
            rates_by_phase = [statistics.median(_phase_tokens_per_s(r, s["steps"])[k] for r in mine) for k in PHASES]
            phase_rows.append([m, side, *(f"{v:.3f}" for v in seconds), *(f"{v:.1f}" for v in rates_by_phase)])
    failed = [f"- M = {r['m']}, {side_of(r)}: {r['error']}" for r in result["runs"] if "error" in r]
    skipped = [f"- M = {r['m']}, {side_of(r)}: {r['skipped']}" for r in result["runs"] if "skipped" in r]
    graphs = ""
    if s.get("decode_graphs"):
        backend = s["graphs_backend"]
        graphs = (
            f" Graph decoding at M = {', '.join(str(m) for m in s['decode_graphs'])}: static KV cache, decoding "
            f"step compiled (torch.compile backend {backend}, mode {GRAPHS_MODES[backend]})."
        )
    text = [
        f"### {s['label']}: {s['device_name']}, {s['dtype']}",
        "",
        f"`{s['command']}` ({s['when']}; {s['repeats']} repeats, {s['steps']} timed steps after one warm-up "
        f"each; a member step: {s['prompts']} prompts × {s['group']} completions × {s['tokens']} tokens, LoRA "
        f"r = {s['rank']}; {s['threads']} torch thread(s)). Medians, range over repeats in brackets.{graphs}",
        "",
        md_table(header, rows),
        "",
        "Seconds per step (all M members) and tokens/s by phase (the step's completion tokens over the "
        "phase's seconds), median over repeats:",
        "",
        md_table(
            ["M", "side", *PHASES, *(f"{p} tokens/s" for p in PHASES)],
            phase_rows,
        ),
    ]
    text += _render_diagnosis(result)
    if failed:
        text += ["", "Runs that failed:", *failed]
    if skipped:
        text += ["", "Runs not made:", *skipped]
    if with_targets:
        text += ["", "The targets (issue 45):", "", render_targets(check_targets(result))]
    return "\n".join(text)


def _render_diagnosis(result: dict[str, Any]) -> list[str]:
    diagnosed = sorted(
        (r for r in result["runs"] if "diagnosis" in r), key=lambda r: (r["m"], side_of(r), r.get("repeat", 0))
    )
    measured = [r for r in diagnosed if r["diagnosis"]["applicable"]]
    unmeasured = [r for r in diagnosed if not r["diagnosis"]["applicable"]]
    reasons = list(dict.fromkeys(r["diagnosis"]["reason"] for r in unmeasured))
    if not measured:
        return [] if not reasons else ["", f"Launch-bound diagnosis: {'; '.join(reasons)}."]
    below = measured[0]["diagnosis"]["below"]
    rows = []
    for r in measured:
        cells: list[object] = [r["m"], side_of(r)]
        for phase in PHASES:
            d = r["diagnosis"]["phases"][phase]
            cells.append(f"{d['busy_share']:.0%}" + (" launch-bound" if d["launch_bound"] else ""))
        rows.append(cells)
    text = [
        "",
        "GPU busy share of each phase's wall time (one more step, profiled after the timed ones: its kernels' and "
        "copies' time over the timed steps' wall time of the phase; the separate side's first member over the wall "
        f"time per member); launch-bound: under {below:.0%}:",
        "",
        md_table(["M", "side", *PHASES], rows),
    ]
    return text + [f"- M = {r['m']}, {side_of(r)}: {r['diagnosis']['reason']}" for r in unmeasured]


def check_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's three targets on one result, for the shared side and each variant of it: the
    value, the target, and ``met`` (None: not measured, the runs it needs missing)."""
    runs = [r for r in result["runs"] if "error" not in r and "skipped" not in r]
    memory_key = _memory_key(result)
    sides = [side for side in _sides(result["runs"]) if side != "separate"] or ["shared"]

    def median_of(side: str, m: int, key: str) -> float | None:
        values = [r[key] for r in runs if side_of(r) == side and r["m"] == m]
        return statistics.median(values) if values else None

    def rates_by_repeat(side: str, m: int) -> dict[int, float]:
        return {r.get("repeat", 0): r["tokens_per_s"] for r in runs if side_of(r) == side and r["m"] == m}

    checks = []
    for side in sides:
        separate, mine = rates_by_repeat("separate", TARGET_M), rates_by_repeat(side, TARGET_M)
        paired = [mine[k] / separate[k] for k in mine if k in separate]
        speed = statistics.median(paired) if paired else None
        checks.append(
            {
                "target": f"tokens/s at M = {TARGET_M}, {side} / separate",
                "value": speed,
                "goal": f"≥ {TARGET_SPEED:g}×",
                "met": None if speed is None else speed >= TARGET_SPEED,
            }
        )
        one, at_m = median_of("separate", 1, memory_key), median_of(side, TARGET_M, memory_key)
        ratio = at_m / one if one and at_m is not None else None
        checks.append(
            {
                "target": f"peak memory at M = {TARGET_M}, {side} / one separate member",
                "value": ratio,
                "goal": f"≤ {TARGET_MEMORY:g}×",
                "met": None if ratio is None else ratio <= TARGET_MEMORY,
            }
        )
        by_m = {m: median_of(side, m, "tokens_per_s") for m in sorted({r["m"] for r in runs})}
        best = max(((v, m) for m, v in by_m.items() if v is not None), default=None)
        checks.append(
            {
                "target": f"end-to-end tokens/s, {side}" + (f" (best: M = {best[1]})" if best else ""),
                "value": best[0] if best else None,
                "goal": f"≥ {TARGET_TOKENS_S:,.0f}",
                "met": None if best is None else best[0] >= TARGET_TOKENS_S,
            }
        )
    return checks


def render_targets(checks: list[dict[str, Any]]) -> str:
    """One line per target: ``<target>: <value> (target <goal>): met | not met | not measured``."""
    lines = []
    for c in checks:
        if c["value"] is None:
            lines.append(f"- {c['target']}: not measured (target {c['goal']})")
            continue
        value = f"{c['value']:,.1f}" if "end-to-end" in c["target"] else f"{c['value']:.2f}×"
        lines.append(f"- {c['target']}: {value} (target {c['goal']}): {met(c['met'])}")
    return "\n".join(lines)


def _settings(args: argparse.Namespace, argv: list[str] | None, members: list[int], device_name: str) -> dict[str, Any]:
    import torch

    keys = ("repeats", "steps", "prompts", "group", "tokens", "rank", "device", "dtype", "threads", "update_members")
    settings = {
        **{k: getattr(args, k) for k in keys},
        "members": members,
        "label": args.label or Path(args.model).name,
        "device_name": device_name,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m benchmarks.shared_base " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
    }
    if args.decode_graphs:  # only where asked: a default run's JSON is as it was
        settings.update(decode_graphs=_members(args.decode_graphs), graphs_backend=args.graphs_backend)
    if args.diagnose:
        settings.update(diagnose=_members(args.diagnose), launch_bound_below=LAUNCH_BOUND_BELOW)
    if args.budget_s is not None:
        settings.update(budget_s=args.budget_s, separate_last=args.separate_last)
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a save_pretrained model (popgrpo lm tiny / lm init)")
    parser.add_argument("--members", default="1,2,4,8", help="the M values, comma-separated, in the order run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed member steps after one warm-up step")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per member step")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per completion (exactly)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument(
        "--update-members", type=int, help="policy.causal_lm.share_base_update_members (default: its default)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one side at one M may take")
    parser.add_argument("--budget-s", type=float, help="the whole benchmark ends within this many seconds")
    parser.add_argument("--separate-last", action="store_true", help="each M's separate side after its shared ones")
    parser.add_argument("--decode-graphs", help="M values at which to also run the shared side with graph decoding")
    parser.add_argument("--graphs-backend", default="inductor", choices=tuple(GRAPHS_MODES))
    parser.add_argument("--diagnose", help="M values at which to profile one more step: GPU busy share per phase")
    parser.add_argument("--label", default="", help="the model's name in the section's title")
    parser.add_argument("--json", help="write the results here (after every run)")
    parser.add_argument("--write", help="rewrite this file's shared-base section (docs/benchmarks/shared-base.md)")
    parser.add_argument("--section", choices=("cpu", "gpu"), default="cpu", help="which section --write rewrites")
    parser.add_argument("--render", nargs="+", help="only redraw the section from these saved --json files")
    parser.add_argument("--targets", nargs="+", help="only print the targets of these saved --json files")
    parser.add_argument("--with-targets", action="store_true", help="the section ends with the targets")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("separate", "shared"), help=argparse.SUPPRESS)
    parser.add_argument("--m", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--decode", choices=("plain", "graphs"), default="plain", help=argparse.SUPPRESS)
    parser.add_argument("--diagnose-child", dest="diagnose_child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    begin, end = (BEGIN, END) if args.section == "cpu" else (GPU_BEGIN, GPU_END)
    if args.child:
        args.diagnose = args.diagnose_child
        print(json.dumps(_child(args)))
        return 0
    if args.targets:
        for path in args.targets:
            print(f"Targets of {path}:\n{render_targets(check_targets(json.loads(Path(path).read_text())))}")
        return 0
    if args.render:
        text = "\n\n".join(render(json.loads(Path(p).read_text()), args.with_targets) for p in args.render)
        print(text)
        if args.write:
            write_between(Path(args.write), text, begin, end)
        return 0
    if not args.model:
        parser.error("--model is required (or --render / --targets saved results)")
    import torch

    members = _members(args.members)
    graph_members = set(_members(args.decode_graphs))
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPU cores"
    settings = _settings(args, argv, members, device_name)
    result: dict[str, Any] = {"settings": settings, "runs": []}
    began = time.monotonic()
    for repeat in range(args.repeats):
        for m in members:
            order = ("separate", "shared") if (repeat + m) % 2 == 0 else ("shared", "separate")
            sides = [(mode, "plain") for mode in order]
            if m in graph_members:
                sides.append(("shared", "graphs"))
            if args.separate_last:
                sides.sort(key=lambda side: side[0] == "separate")
            for mode, decode in sides:
                left = float("inf") if args.budget_s is None else args.budget_s - (time.monotonic() - began)
                if left < MIN_RUN_S:
                    spent = f"not run: the {args.budget_s:g} s budget was spent"
                    run = {"mode": mode, "decode": decode, "m": m, "skipped": spent}
                else:
                    run = _run_child(args, mode, m, decode, min(args.timeout, left))
                run["repeat"] = repeat
                result["runs"].append(run)
                print(f"repeat {repeat} M={m} {side_of(run)}: {_shown(run)}", flush=True)
                if args.json:
                    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    text = render(result, args.with_targets)
    print(text)
    if not args.with_targets:
        print(f"\nThe targets (issue 45):\n{render_targets(check_targets(result))}")
    if args.write:
        write_between(Path(args.write), text, begin, end)
    return 0


def _shown(run: dict[str, Any]) -> str:
    """A run's line in the log."""
    if "error" in run or "skipped" in run:
        return str(run.get("error") or run["skipped"])
    line = f"{run['tokens_per_s']:.1f} tokens/s, peak RSS {run['peak_rss_bytes'] / 2**30:.2f} GiB"
    if run["peak_gpu_bytes"]:
        line += f", peak GPU {run['peak_gpu_bytes'] / 2**30:.2f} GiB"
    line += f", phases {json.dumps({k: round(v, 3) for k, v in run['phases_s'].items()})}"
    if "phase_tokens_per_s" in run:
        line += f", tokens/s by phase {json.dumps({k: round(v, 1) for k, v in run['phase_tokens_per_s'].items()})}"
    if "warmup_s" in run:
        line += f", warm-up {run['warmup_s']:.1f} s"
    diagnosis = run.get("diagnosis")
    if diagnosis and diagnosis["applicable"]:
        shares = {
            k: f"{d['busy_share']:.0%}{' launch-bound' if d['launch_bound'] else ''}"
            for k, d in diagnosis["phases"].items()
        }
        line += f", GPU busy {json.dumps(shares)}"
    elif diagnosis:
        line += f", diagnosis {diagnosis['reason']}"
    return line


if __name__ == "__main__":
    raise SystemExit(main())
