"""TRL's ``GRPOTrainer`` against a popgrpo language-model member: tokens/s, paired blocks, a CI on the ratio.

``python -m benchmarks.trl_throughput --model runs/program-lm [--steps 4] [--rounds 12] [--device cpu|cuda] [--out DIR]``

Both sides train the same ``save_pretrained`` model (``popgrpo lm pretrain``) with LoRA adapters
of the same rank on all linear layers (``B = 0`` at the start on both, so both start from the
base model), in this process, float32, one torch thread, on the same cores, with:

* **the same optimiser**: Adam with the same learning rate, betas (0.9, 0.999), ε 1e-8, no
  weight decay, fused on both (TRL's ``adamw_torch_fused`` with ``weight_decay=0`` is Adam),
  a constant learning rate and no gradient clipping on both (popgrpo clips nothing);
* **the same objective**: one update per batch, the token-normalised loss (TRL's ``bnpo``,
  ``tests/core/test_trl_equivalence.py``), clip ε 0.2, KL coefficient ``β`` to the base model
  (adapters off) on both, group-normalised advantages;
* **the same prompts**: a seeded sequence of ``P`` prompts per step from the ``lm_programs``
  prompts, the same sequence for both sides of a round (popgrpo's
  ``TextRollouts.prompt_schedule``; TRL's dataset in that order with ``shuffle_dataset=False``);
* **the same sampling**: ``G`` completions per prompt, at most ``T`` new tokens, temperature 1
  without top-k / top-p;
* **the same reward function**: :func:`popgrpo.envs.programs.pooled_program_reward` for TRL,
  ``program_reward`` in the same warm sandbox pool (:mod:`popgrpo.envs.sandbox.pool`, one pool of
  the process for these settings, shared by both sides) for popgrpo: the same value for the
  same completion (``tests/test_trl_parity.py``);
* **the same timed work**: every block starts from a fresh trainer on each side (a new member,
  a new ``GRPOTrainer``), built outside the timed region, then one untimed warm-up step; the
  clock covers the next ``steps`` whole steps (popgrpo: ``Member.step`` ×N and
  ``Member.end_epoch``, so the embeddings and archive of the epoch are inside; TRL: from the end
  of its warm-up step to the end of its last step, as its callbacks see them). One untimed round
  of both comes first (the process's first-call costs).

popgrpo's member runs as configured by ``lm_programs`` (its step sequential by default);
``--set policy.causal_lm.overlap=true`` times the overlapped step (programs start as their rows
finish, the reference pass runs while they do, embeddings on the process's embedding thread),
and ``--compare-sequential`` adds a third block per round with ``overlap=false``, for the
overlap's own effect.

``--device cuda`` puts both models on the GPU, in float32 unless ``--dtype bfloat16``: popgrpo's
member with ``policy.device=cuda`` and ``policy.causal_lm.dtype`` set to it (``auto`` would pick
bfloat16 on CUDA), TRL's trainer with ``use_cpu=False`` (accelerate's CUDA device), its model
loaded in that dtype and ``bf16`` on with bfloat16 (autocast too, as a TRL user runs it). The
clock then waits for the GPU's queued work (``torch.cuda.synchronize``) at each reading, and the
payload records the GPU's name and the library versions. The default, ``cpu``, is as before.

A round is one block of each side, run back to back (the order alternates from round to round)
so that both see the same background load; the ratio is the geometric mean over rounds of
popgrpo's tokens/s over TRL's, with a bootstrap (rounds resampled) and a t confidence interval.
Tokens count each sampled completion's tokens up to and including its end-of-sequence token.

The per-phase profile is each side's main-thread wall time in generation, reference
log-probs, waiting for the reward, the update's forward pass, the optimiser step and the rest
(backward, advantages, metrics), per timed step; popgrpo's embeddings are listed apart when
they run off the main thread.

``--population K`` (default: the machine's cores) adds the population case: K processes each
train one fresh popgrpo member, against K processes each running one TRL trainer, with the
same settings; each process runs one untimed block first, their timed regions start together
(a barrier) and the rate is all their tokens over the span from the first start to the last end.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from popgrpo.markdown import md_table

PROMPTS = ["# arithmetic\n", "# loop\n", "# function\n", "# list\n", "# while\n", "# branch\n"]
ADAM = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}  # both sides


def machine_cpu() -> float | None:
    """CPU seconds every process on the machine has used so far (busy time summed over the
    cores, from ``/proc/stat``): the sandboxes' interpreters and the embedding thread included.
    None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is already in user


def _cpu_used(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def prompt_schedule(seed: int, steps: int, per_step: int) -> list[list[str]]:
    """``steps`` lists of ``per_step`` distinct prompts (with repeats across steps), seeded."""
    rng = random.Random(seed)
    return [rng.sample(PROMPTS, per_step) for _ in range(steps)]


class Phases:
    """Main-thread wall time per named phase while :attr:`active`; other threads' time apart."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.active = False

    def wrap(self, obj: Any, attr: str, name: str | Callable[[], str]) -> None:
        inner = getattr(obj, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return inner(*args, **kwargs)
            key = name if isinstance(name, str) else name()
            if threading.current_thread() is not threading.main_thread():
                key += " (off the main thread)"
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - start

        setattr(obj, attr, timed)

    def per_step(self, total: float, steps: int) -> dict[str, float]:
        main = {k: v for k, v in self.seconds.items() if "off the main thread" not in k}
        out = {k: v / steps for k, v in sorted(self.seconds.items())}
        out["rest"] = (total - sum(main.values())) / steps
        out["step"] = total / steps
        return out


def _on_cuda(args: argparse.Namespace) -> bool:
    return getattr(args, "device", "cpu") == "cuda"


def _clock(cuda: bool) -> float:
    """``time.perf_counter()``; with ``cuda``, after the GPU's queued work has finished."""
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter()


# ---- popgrpo ------------------------------------------------------------------------------------
CUDA_OVERRIDES = ["policy.device=cuda"]


def _dtype_name(args: argparse.Namespace) -> str:
    """The weights' dtype of both sides (``--dtype``; float32 unless asked)."""
    return getattr(args, "dtype", "float32")


def popgrpo_config(args: argparse.Namespace, seed: int, overrides: list[str] | None = None):
    from popgrpo.config import load_config, preset_path

    return load_config(
        preset_path("lm_programs"),
        [
            f"run.seed={seed}",
            f"policy.causal_lm.model={args.model}",
            f"policy.causal_lm.prompts_per_step={args.prompts}",
            f"policy.causal_lm.max_new_tokens={args.tokens}",
            f"policy.causal_lm.lora.r={args.lora_r}",
            "policy.causal_lm.temperature=1.0",
            f"grpo.group_size={args.group}",
            f"grpo.kl_coef={args.beta}",
            f"grpo.lr={args.lr}",
            "grpo.adam=fused",
            "grpo.updates_per_batch=1",
            "grpo.clip=0.2",
            "policy.causal_lm.loss_normalisation=token",
            f"grpo.steps_per_epoch={args.steps}",
            f"env.text.sandbox_pool_size={'null' if args.pool_size is None else args.pool_size}",
            "population.size=1",
            "scheduler.enabled=false",
            *(CUDA_OVERRIDES if _on_cuda(args) else []),
            f"policy.causal_lm.dtype={_dtype_name(args)}",
            *getattr(args, "overrides", []),
            *(overrides or []),
        ],
    )


def build_popgrpo(args: argparse.Namespace, seed: int, overrides: list[str] | None = None):
    """A fresh member for one block, fed the round's prompt sequence (warm-up step first)."""
    from popgrpo.algorithms.archive_service import LocalArchive
    from popgrpo.algorithms.member import Member, resolve_device

    config = popgrpo_config(args, seed, overrides)
    if _on_cuda(args):  # as the executors place a member: policy.device=cuda, CUDA or an error
        member = Member(0, config, LocalArchive(), device=resolve_device(config.policy.device, has_gpu=True)[0])
    else:
        member = Member(0, config, LocalArchive())
    schedule = prompt_schedule(seed, args.steps + 1, args.prompts)
    member.rollouts.prompt_schedule = iter(schedule)  # pyright: ignore[reportAttributeAccessIssue]  # TextRollouts
    return member, schedule


def time_popgrpo(args: argparse.Namespace, seed: int, barrier: Any = None, overrides: list[str] | None = None) -> dict:
    member, schedule = build_popgrpo(args, seed, overrides)
    rollouts, policy, env = member.rollouts, member.policy, member.env
    phases = Phases()
    phases.wrap(policy, "rollout", "generation")
    phases.wrap(policy, "reference_log_probs", "reference log-probs")
    phases.wrap(env, "score", "reward (waiting)")
    phases.wrap(env, "embed", "embeddings")
    phases.wrap(rollouts, "log_prob_and_entropy", "update forward")
    phases.wrap(member.optimizer, "step", "optimizer")
    member.step()  # warm-up
    if barrier is not None:
        barrier.wait()
    phases.active = True
    start, cpu_start = _clock(_on_cuda(args)), machine_cpu()
    stats = [member.step() for _ in range(args.steps)]
    member.end_epoch(stats)
    end, cpu_end = _clock(_on_cuda(args)), machine_cpu()
    phases.active = False
    completions = sum(s.scores.complexity.numel() for s in stats)
    tokens = int(sum(float(s.scores.complexity.sum()) for s in stats))  # a text member's complexity: tokens
    return {
        "seconds": end - start,
        "start": start,
        "end": end,
        "completions": completions,
        "tokens": tokens,
        "prompts": schedule[1:],
        "profile": phases.per_step(end - start, args.steps),
        "cpu_s": _cpu_used(cpu_start, cpu_end),
        "load": os.getloadavg()[0],
    }


# ---- TRL ----------------------------------------------------------------------------------------
class RewardCounter:
    """TRL's reward function: :func:`pooled_program_reward`, recording what it was given while counting."""

    __name__ = "pooled_program_reward"

    def __init__(self, eos_token_id: int) -> None:
        self.eos = eos_token_id
        self.counting = False
        self.completions = 0
        self.tokens = 0
        self.prompts: list[list[str]] = []  # each call's distinct prompts, in order (all calls)
        self.calls: list[tuple[list[str], list[str], list[float]]] = []  # (prompts, completions, rewards)

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        from popgrpo.envs.programs import pooled_program_reward

        rewards = pooled_program_reward(prompts, completions)
        self.prompts.append(list(dict.fromkeys(prompts)))
        self.calls.append((list(prompts), list(completions), list(rewards)))
        if self.counting:
            self.completions += len(completions)
            if completion_ids is not None:
                self.tokens += sum(len(ids) for ids in completion_ids)  # up to and including EOS (TRL's mask)
        return rewards


def build_trl(args: argparse.Namespace, seed: int, out: Path):
    """A fresh GRPOTrainer for one block (``steps + 1`` steps: the warm-up, then the timed ones)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    tokenizer.padding_side = "left"
    counter = RewardCounter(tokenizer.eos_token_id)
    schedule = prompt_schedule(seed, args.steps + 1, args.prompts)
    config = GRPOConfig(
        output_dir=str(out),
        max_steps=args.steps + 1,
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        max_completion_length=args.tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=args.beta,
        epsilon=0.2,
        num_iterations=1,
        loss_type="bnpo",  # popgrpo's `token` normalisation (tests/core/test_trl_equivalence.py)
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch_fused",
        adam_beta1=ADAM["betas"][0],
        adam_beta2=ADAM["betas"][1],
        adam_epsilon=ADAM["eps"],
        weight_decay=ADAM["weight_decay"],
        max_grad_norm=0.0,  # popgrpo clips nothing
        shuffle_dataset=False,  # the round's prompt sequence, in order
        use_cpu=not _on_cuda(args),  # on CUDA: accelerate's device, the GPU
        bf16=_dtype_name(args) == "bfloat16",  # as a TRL user runs bfloat16 weights: autocast on too
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=seed,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(
            args.model, local_files_only=True, dtype=getattr(torch, _dtype_name(args))
        ),
        reward_funcs=cast(Any, counter),  # a callable object; TRL annotates plain functions
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [p for step in schedule for p in step]}),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=args.lora_r,
            lora_alpha=2 * args.lora_r,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        ),
    )
    return trainer, counter, schedule


def time_trl(args: argparse.Namespace, seed: int, out: Path, barrier: Any = None) -> dict:
    from transformers import TrainerCallback

    trainer, counter, schedule = build_trl(args, seed, out)
    phases = Phases()
    phases.wrap(trainer, "_generate_single_turn", "generation")
    phases.wrap(trainer, "_calculate_rewards", "reward (waiting)")
    phases.wrap(
        trainer,
        "_get_per_token_logps_and_entropies",
        lambda: "update forward" if torch.is_grad_enabled() else "reference log-probs",
    )
    ends: list[float] = []
    cpus: list[float | None] = []
    cuda = _on_cuda(args)  # the callbacks' own `args` are TRL's

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            if optimizer is not None:
                phases.wrap(optimizer, "step", "optimizer")

        def on_step_end(self, args, state, control, **kwargs):
            if not ends and barrier is not None:
                barrier.wait()
            ends.append(_clock(cuda))
            cpus.append(machine_cpu())
            phases.active = counter.counting = True

    trainer.add_callback(Clock())
    trainer.train()
    seconds = ends[-1] - ends[0]
    return {
        "seconds": seconds,
        "start": ends[0],
        "end": ends[-1],
        "completions": counter.completions,
        "tokens": counter.tokens,
        "prompts": counter.prompts[1:],
        "scheduled": schedule[1:],
        "profile": phases.per_step(seconds, args.steps),
        "cpu_s": _cpu_used(cpus[0], cpus[-1]),
        "load": os.getloadavg()[0],
    }


# ---- the population case ------------------------------------------------------------------------
def _population_worker(side: str, args: argparse.Namespace, seed: int, out: str, barrier: Any, queue: Any) -> None:
    torch.set_num_threads(args.threads)
    try:
        # An untimed block first, as in the paired rounds: the new process's first-call costs.
        if side == "popgrpo":
            time_popgrpo(args, seed + 50_000)
        else:
            time_trl(args, seed + 50_000, Path(out) / "warm")
        result = time_popgrpo(args, seed, barrier) if side == "popgrpo" else time_trl(args, seed, Path(out), barrier)
        queue.put({k: v for k, v in result.items() if k in ("start", "end", "tokens", "completions")})
    except BaseException as exc:
        barrier.abort()
        queue.put({"error": repr(exc)})
        raise


def time_population(side: str, args: argparse.Namespace, seed: int, out: Path, k: int) -> dict:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(k), ctx.Queue()
    procs = [
        ctx.Process(
            target=_population_worker,
            args=(side, args, seed * 1000 + i, str(out / f"{side}-{i}"), barrier, queue),
        )
        for i in range(k)
    ]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"population {side}: {errors}")
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "seconds": span,
        "completions": sum(r["completions"] for r in results),
        "tokens": sum(r["tokens"] for r in results),
        "load": os.getloadavg()[0],
    }


# ---- statistics ---------------------------------------------------------------------------------
def ratio_summary(popgrpo: list[dict], trl: list[dict], resamples: int = 10_000) -> dict:
    """Geometric mean over rounds of popgrpo's tokens/s over TRL's; bootstrap and t 95% intervals."""
    import numpy as np
    from scipy import stats

    logs = np.log(
        [(p["tokens"] / p["seconds"]) / (t["tokens"] / t["seconds"]) for p, t in zip(popgrpo, trl, strict=True)]
    )
    n = len(logs)
    out: dict[str, Any] = {
        "ratio": float(np.exp(logs.mean())),
        "rounds": n,
        "per_round": np.exp(logs).round(4).tolist(),
    }
    if n >= 2:
        rng = np.random.default_rng(0)
        means = logs[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
        out["bootstrap_ci95"] = [float(np.exp(np.quantile(means, 0.025))), float(np.exp(np.quantile(means, 0.975)))]
        half = float(stats.t.ppf(0.975, n - 1)) * float(logs.std(ddof=1)) / math.sqrt(n)
        out["t_ci95"] = [float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))]
    return out


PHASES = ("generation", "reference log-probs", "reward (waiting)", "update forward", "optimizer", "embeddings", "rest")


def report_markdown(payload: dict) -> str:
    """The tables docs/benchmarks/lm.md shows, from this benchmark's JSON (``--report FILE``)."""

    def ci(summary: dict, key: str) -> str:
        lo, hi = summary.get(key, [math.nan, math.nan])
        return f"{lo:.2f}–{hi:.2f}"

    results = payload["results"]
    rows = []
    for side, blocks in results.items():
        rates = _rates(blocks)
        rows.append(
            [
                "popgrpo member" if side == "popgrpo" else "TRL GRPOTrainer",
                len(blocks),
                ", ".join(f"{r:.0f}" for r in rates),
                f"{statistics.median(rates):.1f}",
                f"{sum(b['tokens'] for b in blocks) / max(1, sum(b['completions'] for b in blocks)):.1f}",
                f"{statistics.median(b['load'] for b in blocks):.0f}",
            ]
        )
    parts = [
        md_table(["trainer", "blocks", "tokens/s per block", "median tokens/s", "mean tokens", "load (median)"], rows),
        "",
        md_table(
            ["", "popgrpo / TRL tokens/s", "bootstrap 95% CI", "t 95% CI", "rounds", "per round"],
            [
                [
                    "one trainer each",
                    f"**{payload['ratio']:.2f}**",
                    ci(payload, "bootstrap_ci95"),
                    ci(payload, "t_ci95"),
                    payload["rounds"],
                    ", ".join(f"{r:.2f}" for r in payload["per_round"]),
                ]
            ]
            + (
                [
                    [
                        f"population: {payload['population']['members']} processes each",
                        f"**{payload['population']['ratio']:.2f}**",
                        ci(payload["population"], "bootstrap_ci95"),
                        ci(payload["population"], "t_ci95"),
                        payload["population"]["rounds"],
                        ", ".join(f"{r:.2f}" for r in payload["population"]["per_round"]),
                    ]
                ]
                if payload.get("population")
                else []
            ),
        ),
        "",
    ]
    profile = payload["profile"]
    names = [p for p in PHASES if any(p in prof for prof in profile.values())]
    names += sorted({k for prof in profile.values() for k in prof} - {*names, "step"})
    parts.append(
        md_table(
            ["seconds per step (median over blocks)", "popgrpo member", "TRL GRPOTrainer"],
            [
                [name, *(f"{profile[side][name]:.3f}" if name in profile[side] else "—" for side in ("popgrpo", "trl"))]
                for name in [*names, "step"]
            ],
        )
    )
    cpu = cpu_budget(payload)
    if cpu:
        parts += [
            "",
            md_table(
                [
                    "machine CPU (all processes)",
                    "CPU s per 1,000 tokens (median)",
                    "cores busy (median)",
                    "tokens/s measured (median)",
                    f"tokens/s if all {payload['cores']} cores did only this",
                ],
                [
                    [name, f"{c['cpu_per_1k']:.2f}", f"{c['busy']:.2f}", f"{c['rate']:.0f}", f"{c['ceiling']:.0f}"]
                    for name, c in cpu.items()
                ],
            ),
        ]
    return "\n".join(parts)


def cpu_budget(payload: dict) -> dict[str, dict[str, float]]:
    """Per side: the machine's CPU seconds per 1,000 tokens, the cores kept busy, the measured
    rate and the rate all the machine's cores would give at that CPU cost per token (medians
    over blocks; empty where the blocks carry no ``cpu_s``)."""
    sides = {
        "popgrpo member": payload["results"].get("popgrpo", []),
        "TRL GRPOTrainer": payload["results"].get("trl", []),
    }
    if payload.get("sequential"):
        sides["popgrpo member, sequential step"] = payload["sequential"]["results"]
    out: dict[str, dict[str, float]] = {}
    for name, blocks in sides.items():
        blocks = [b for b in blocks if b.get("cpu_s") is not None and b["tokens"] > 0]
        if not blocks:
            continue
        per_1k = statistics.median(1000 * b["cpu_s"] / b["tokens"] for b in blocks)
        out[name] = {
            "cpu_per_1k": per_1k,
            "busy": statistics.median(b["cpu_s"] / b["seconds"] for b in blocks),
            "rate": statistics.median(_rates(blocks)),
            "ceiling": payload["cores"] * 1000 / per_1k,
        }
    return out


def environment() -> dict[str, Any]:
    """The GPU and the versions a ``--device cuda`` run used (recorded in its JSON)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **{name: installed(name) for name in ("transformers", "peft", "trl", "accelerate", "sentence-transformers")},
    }


def _rates(blocks: list[dict]) -> list[float]:
    return [b["tokens"] / b["seconds"] for b in blocks]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().split("\n")[0])
    parser.add_argument("--model", default="runs/program-lm", help="a popgrpo lm pretrain output directory")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step P")
    parser.add_argument("--group", type=int, default=8, help="group size G")
    parser.add_argument("--tokens", type=int, default=64, help="completion length limit T")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--beta", type=float, default=0.01, help="KL coefficient (both compute reference log-probs)")
    parser.add_argument("--lr", type=float, default=0.004, help="learning rate of both (lm_programs' grpo.lr)")
    parser.add_argument("--pool-size", type=int, default=None, help="warm sandboxes (default: 2 per core)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per block")
    parser.add_argument("--rounds", type=int, default=12, help="rounds of one popgrpo and one TRL block")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no round that the last round's duration says would end past this many seconds "
        "from the first timed round's start (the JSON's `rounds` says how many ran; default: no limit)",
    )
    parser.add_argument(
        "--population", type=int, default=None, help="K for the population case (default: cores; 0: skip)"
    )
    parser.add_argument("--population-rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where both sides compute (cuda: policy.device=cuda, TRL use_cpu=False)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="both sides' weights: popgrpo policy.causal_lm.dtype, TRL's model loaded so (bfloat16: bf16=True)",
    )
    parser.add_argument(
        "--compare-sequential",
        action="store_true",
        help="a third block per round: popgrpo with policy.causal_lm.overlap=false (the overlap's own effect)",
    )
    parser.add_argument(
        "--report", metavar="JSON", help="print docs/benchmarks/lm.md's tables from a run's JSON and exit"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for popgrpo's member (e.g. policy.causal_lm.overlap=false: phases one after another)",
    )
    parser.add_argument("--out", default="runs/bench-trl", help="TRL's output_dir and this benchmark's JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.report:
        print(report_markdown(json.loads(Path(args.report).read_text())))
        return 0
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: not a save_pretrained directory (run popgrpo lm pretrain first)")
    for name in ("steps", "rounds", "prompts", "group", "tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.prompts > len(PROMPTS):
        parser.error(f"--prompts {args.prompts}: the task has {len(PROMPTS)} prompts")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available to this process (torch CPU build?)")
    if args.dtype == "bfloat16" and args.device != "cuda":
        parser.error("--dtype bfloat16: only with --device cuda (TRL's bf16 needs a GPU that supports it)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # One untimed round first: the process's first-call costs (numba's compile of the archive's
    # insert, the embedding model's load, the sandbox pool's first fill) fall on neither side's blocks.
    time_popgrpo(args, seed=10_000)
    time_trl(args, 10_000, out / "trl-warm")
    results: dict[str, list[dict]] = {"popgrpo": [], "trl": []}
    sequential: list[dict] = []
    rounds_start = last_round = time.perf_counter()
    for i in range(args.rounds):
        if args.budget_s is not None and i > 0:
            now = time.perf_counter()
            if now - rounds_start + (now - last_round) > args.budget_s:
                print(f"--budget-s {args.budget_s:g}: stopping after {i} rounds", flush=True)
                break
            last_round = now
        order = ["popgrpo", "trl"] if i % 2 == 0 else ["trl", "popgrpo"]
        if args.compare_sequential:
            order.insert(1, "sequential")
        for side in order:
            if side == "popgrpo":
                results["popgrpo"].append(time_popgrpo(args, seed=i))
            elif side == "sequential":
                sequential.append(time_popgrpo(args, seed=i, overrides=["policy.causal_lm.overlap=false"]))
            else:
                results["trl"].append(time_trl(args, i, out / f"trl-{i}"))
        print(
            json.dumps({k: round(v[-1]["tokens"] / v[-1]["seconds"], 1) for k, v in results.items()} | {"round": i}),
            flush=True,
        )
    summary = ratio_summary(results["popgrpo"], results["trl"])
    profile = {
        side: {k: statistics.median(b["profile"][k] for b in blocks) for k in blocks[0]["profile"]}
        for side, blocks in results.items()
    }
    population: dict[str, Any] = {}
    k = (os.cpu_count() or 1) if args.population is None else args.population
    if k > 0:
        pop: dict[str, list[dict]] = {"popgrpo": [], "trl": []}
        for i in range(args.population_rounds):
            order = ["popgrpo", "trl"] if i % 2 == 0 else ["trl", "popgrpo"]
            for side in order:
                pop[side].append(time_population(side, args, 100 + i, out / f"population-{i}", k))
            print(json.dumps({s: round(v[-1]["tokens"] / v[-1]["seconds"], 1) for s, v in pop.items()}), flush=True)
        population = {"members": k, "results": pop, **ratio_summary(pop["popgrpo"], pop["trl"])}
    rows = [
        [
            side,
            len(blocks),
            sum(b["completions"] for b in blocks),
            f"{statistics.median(_rates(blocks)):.1f}",
            f"{sum(b['tokens'] for b in blocks) / max(1, sum(b['completions'] for b in blocks)):.1f}",
        ]
        for side, blocks in results.items()
    ]
    print(md_table(["trainer", "blocks", "completions", "tokens/s (median)", "mean tokens"], rows))
    ci = summary.get("bootstrap_ci95", [math.nan, math.nan])
    print(f"popgrpo / TRL tokens/s: {summary['ratio']:.2f} (bootstrap 95% CI {ci[0]:.2f}–{ci[1]:.2f})")
    for side, phases in profile.items():
        print(side, {k: round(v, 3) for k, v in phases.items()})
    if population:
        print(f"population of {k}: popgrpo / TRL tokens/s {population['ratio']:.2f}")
    payload = {
        "args": vars(args),
        "cores": os.cpu_count(),
        "results": results,
        "profile": profile,
        "population": population,
        **summary,
    }
    if args.device == "cuda":
        payload["environment"] = environment()
    if sequential:
        payload["sequential"] = {"results": sequential, **ratio_summary(results["popgrpo"], sequential)}
        print(f"popgrpo overlapped / sequential tokens/s: {payload['sequential']['ratio']:.2f}")
    (out / "trl_throughput.json").write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
