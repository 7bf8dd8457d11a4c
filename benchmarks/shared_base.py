"""Members on one shared base against the same members each with a model of its own.

``python -m benchmarks.shared_base --model DIR [--members 1,2,4,8] [--repeats 3] [--device cpu|cuda]
[--dtype float32|bfloat16] [--label NAME] [--json PATH] [--write BENCHMARKS.md]``;
``python -m benchmarks.shared_base --render A.json [B.json ...] --write BENCHMARKS.md`` redraws the
section from saved results.

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
not what is measured. tokens/s is every member's completion tokens over the step's wall time.

Peak memory is the process's peak RSS (``ru_maxrss``, loading included) on the CPU, or
``torch.cuda.max_memory_allocated`` on a GPU. The sides alternate within a repeat, M by M, in
fresh processes, so both see the same background load; the table gives medians with the range
over repeats, and the shared/separate ratio per repeat (paired).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import write_between
from popgrpo.markdown import md_table

PROMPTS = ["def add(a, b):", "x = 3 * (4 + 5)", "for i in range(3):", "print(1 + 2)", "y = [1, 2]", "z = 7 - 2"]
BEGIN, END = "<!-- shared-base-cpu:begin -->", "<!-- shared-base-cpu:end -->"


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
    optimizers = [torch.optim.Adam(p.parameters(), lr=1e-4) for p in policies]
    generators = [torch.Generator().manual_seed(100 + k) for k in range(m)]
    prompt_sets = [[PROMPTS[(k + i) % len(PROMPTS)] for i in range(args.prompts)] for k in range(m)]

    def loss_of(logp: torch.Tensor, ref: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        advantage = torch.linspace(-1, 1, logp.shape[0], device=logp.device)[:, None]
        terms = -(logp - logp.detach()).exp() * advantage + 0.04 * (ref - logp) - 0.01 * entropy
        return (terms * mask).sum() / mask.sum()

    def step() -> tuple[dict[str, float], int]:
        phases = {"generation": 0.0, "reference": 0.0, "update": 0.0}
        tokens = 0
        if base is None:
            for policy, opt, gen, prompts in zip(policies, optimizers, generators, prompt_sets, strict=True):
                t0 = time.perf_counter()
                rollout = policy.rollout(prompts, args.group, gen)
                sync()
                t1 = time.perf_counter()
                ref = policy.reference_log_probs(rollout)
                sync()
                t2 = time.perf_counter()
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
        t0 = time.perf_counter()
        seeds = [int(torch.randint(0, 2**62, (1,), generator=g)) for g in generators]
        rollouts = base.mixed_rollouts(policies, prompt_sets, args.group, seeds)
        sync()
        t1 = time.perf_counter()
        batch = MixedBatch.of(policies, rollouts)
        with torch.no_grad():
            refs = base.mixed_log_probs(batch, reference=True)
        sync()
        t2 = time.perf_counter()
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
    step()  # warm-up: first-call costs
    timed = [step() for _ in range(args.steps)]
    seconds = sum(sum(p.values()) for p, _ in timed)
    tokens = sum(t for _, t in timed)
    return {
        "mode": args.mode,
        "m": m,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "phases_s": {k: sum(p[k] for p, _ in timed) / args.steps for k in timed[0][0]},
        "load_s": load_s,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_after_load_bytes": rss_loaded,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
    }


def _run_child(args: argparse.Namespace, mode: str, m: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.shared_base", "--child", "--mode", mode, "--m", str(m)]
    for key in ("model", "device", "dtype", "steps", "prompts", "group", "tokens", "rank", "threads"):
        command += [f"--{key}", str(getattr(args, key))]
    if args.update_members is not None:
        command += ["--update-members", str(args.update_members)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=False)
    if done.returncode != 0:
        return {"mode": mode, "m": m, "error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def render(result: dict[str, Any]) -> str:
    """The Markdown section of one run of this benchmark."""
    runs = [r for r in result["runs"] if "error" not in r]
    gpu = result["settings"]["device"] == "cuda"
    memory_key = "peak_gpu_bytes" if gpu else "peak_rss_bytes"
    one = [r[memory_key] for r in runs if r["mode"] == "separate" and r["m"] == 1]
    one_member = statistics.median(one) if one else float("nan")
    rows = []
    for m in result["settings"]["members"]:
        cells: list[object] = [m]
        rates: dict[str, list[float]] = {}
        for mode in ("separate", "shared"):
            mine = [r for r in runs if r["m"] == m and r["mode"] == mode]
            rates[mode] = [r["tokens_per_s"] for r in mine]
            memory = [r[memory_key] / 2**30 for r in mine]
            cells += [_spread(rates[mode], ".1f"), _spread(memory, ".2f")]
        paired = [s / p for s, p in zip(rates["shared"], rates["separate"], strict=False)]
        shared_memory = [r[memory_key] for r in runs if r["m"] == m and r["mode"] == "shared"]
        cells += [
            _spread(paired, ".2f"),
            f"{statistics.median(shared_memory) / one_member:.2f}" if shared_memory and one else "—",
        ]
        rows.append(cells)
    memory = "peak GPU memory allocated (GiB)" if gpu else "peak RSS (GiB)"
    header = ["M", "separate tokens/s", f"separate {memory}", "shared tokens/s", f"shared {memory}"]
    header += ["shared / separate tokens/s", "shared memory / one member's"]
    phase_rows = []
    for r in sorted(runs, key=lambda r: (r["m"], r["mode"])):
        if r is next(x for x in runs if x["m"] == r["m"] and x["mode"] == r["mode"]):
            mine = [x for x in runs if x["m"] == r["m"] and x["mode"] == r["mode"]]
            phases = {k: statistics.median(x["phases_s"][k] for x in mine) for k in r["phases_s"]}
            phase_rows.append([r["m"], r["mode"], *(f"{v:.3f}" for v in phases.values())])
    errors = [f"- M = {r['m']}, {r['mode']}: {r['error']}" for r in result["runs"] if "error" in r]
    s = result["settings"]
    text = [
        f"### {s['label']}: {s['device_name']}, {s['dtype']}",
        "",
        f"`{s['command']}` ({s['when']}; {s['repeats']} repeats, {s['steps']} timed steps after one warm-up "
        f"each; a member step: {s['prompts']} prompts × {s['group']} completions × {s['tokens']} tokens, LoRA "
        f"r = {s['rank']}; {s['threads']} torch thread(s)). Medians, range over repeats in brackets.",
        "",
        md_table(header, rows),
        "",
        "Seconds per step (all M members), median over repeats:",
        "",
        md_table(["M", "side", "generation", "reference", "update"], phase_rows),
    ]
    if errors:
        text += ["", "Runs that failed:", *errors]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a save_pretrained model (popgrpo lm tiny / lm init)")
    parser.add_argument("--members", default="1,2,4,8", help="the M values, comma-separated")
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
    parser.add_argument("--label", default="", help="the model's name in the section's title")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--write", help="rewrite this file's shared-base section (BENCHMARKS.md)")
    parser.add_argument("--render", nargs="+", help="only redraw the section from these saved --json files")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("separate", "shared"), help=argparse.SUPPRESS)
    parser.add_argument("--m", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    if args.render:
        text = "\n\n".join(render(json.loads(Path(p).read_text())) for p in args.render)
        print(text)
        if args.write:
            write_between(Path(args.write), text, BEGIN, END)
        return 0
    if not args.model:
        parser.error("--model is required (or --render saved results)")
    import torch

    members = [int(x) for x in args.members.split(",")]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPU cores"
    runs = []
    for repeat in range(args.repeats):
        for m in members:
            order = ("separate", "shared") if (repeat + m) % 2 == 0 else ("shared", "separate")
            for mode in order:
                run = _run_child(args, mode, m)
                run["repeat"] = repeat
                runs.append(run)
                shown = run.get("error") or (
                    f"{run['tokens_per_s']:.1f} tokens/s, peak RSS {run['peak_rss_bytes'] / 2**30:.2f} GiB"
                    + (f", peak GPU {run['peak_gpu_bytes'] / 2**30:.2f} GiB" if run["peak_gpu_bytes"] else "")
                    + f", phases {json.dumps({k: round(v, 3) for k, v in run['phases_s'].items()})}"
                )
                print(f"repeat {repeat} M={m} {mode}: {shown}", flush=True)
    settings = {
        **{
            k: getattr(args, k)
            for k in (
                "repeats",
                "steps",
                "prompts",
                "group",
                "tokens",
                "rank",
                "device",
                "dtype",
                "threads",
                "update_members",
            )
        },
        "members": members,
        "label": args.label or Path(args.model).name,
        "device_name": device_name,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m benchmarks.shared_base " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
    }
    result = {"settings": settings, "runs": runs}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    print(text)
    if args.write:
        write_between(Path(args.write), text, BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
