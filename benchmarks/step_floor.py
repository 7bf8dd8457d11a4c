"""Section 1, the step floor: one member's GRPO step against the same arithmetic as bare torch.

The member runs through :meth:`Member.train_epochs` (grpo preset, default sizes: P = 8
prompts × G = 16 ideas, policy 64 → 128 → 128 → two 16-wide heads) with its in-process
archive. The bare loop (:class:`BareGRPO`) does only what a GRPO step needs: sample,
log-probabilities under the policy and the frozen reference (whose heads for the fixed
prompts it computes once, as the member does), the environment's reward, group advantages,
clipped surrogate + k3 KL, one Adam step. The two are timed alternately,
one thread each; the member's step is then profiled with cProfile.
"""

from __future__ import annotations

import cProfile
import math
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.common import met
from popgrpo.algorithms.initial_weights import initial_weights
from popgrpo.algorithms.member import make_optimizer
from popgrpo.config import Config, load_config, preset_path
from popgrpo.envs import make_env
from popgrpo.markdown import md_table
from popgrpo.runtime.executor import LocalExecutor

TARGET = 1.15  # member / bare
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class BareGRPO:
    """One GRPO learner as plain torch: the floor a member's step is measured against."""

    def __init__(self, config: Config, seed: int = 0) -> None:
        self.cfg = config
        weights = initial_weights(config)  # the member's starting point; the cost does not depend on it
        self.params = {k: v.clone().requires_grad_() for k, v in weights.items()}
        with torch.no_grad():  # the frozen reference's heads, computed once (as the member does)
            self.reference_heads = self.heads({k: v.clone() for k, v in weights.items()})
        self.optimizer = make_optimizer(self.params.values(), config)  # the member's Adam (grpo.adam)
        self.env = make_env(config.env)
        self.generator = torch.Generator().manual_seed(seed)

    def heads(self, w: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[P, d]`` mean and clamped log-std of every prompt."""
        h = F.relu(F.linear(w["prompt_embedding"], w["trunk.0.weight"], w["trunk.0.bias"]))
        h = F.relu(F.linear(h, w["trunk.2.weight"], w["trunk.2.bias"]))
        log_std = F.linear(h, w["log_std_head.weight"], w["log_std_head.bias"])
        return F.linear(h, w["mean_head.weight"], w["mean_head.bias"]), log_std.clamp(
            self.cfg.policy.log_std_min, self.cfg.policy.log_std_max
        )

    @staticmethod
    def log_prob(mean: torch.Tensor, log_std: torch.Tensor, ideas: torch.Tensor) -> torch.Tensor:
        z = (ideas - mean[:, None]) / log_std.exp()[:, None]
        return (-0.5 * z.pow(2) - log_std[:, None] - _LOG_SQRT_2PI).sum(-1)  # [P, G]

    def step(self) -> None:
        P, G, d = self.cfg.policy.n_prompts, self.cfg.grpo.group_size, self.cfg.env.dim
        with torch.no_grad():
            mean, log_std = self.heads(self.params)
            ideas = mean[:, None] + log_std.exp()[:, None] * torch.randn((P, G, d), generator=self.generator)
            old_logp = self.log_prob(mean, log_std, ideas)
            ref_logp = self.log_prob(*self.reference_heads, ideas)
        rewards = self.env.reward(ideas.reshape(P * G, d), self.generator).reshape(P, G)
        adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + self.cfg.grpo.adv_eps)
        logp = self.log_prob(*self.heads(self.params), ideas)
        ratio = (logp - old_logp).exp()
        clip = self.cfg.grpo.clip
        surrogate = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
        delta = ref_logp - logp
        loss = surrogate + self.cfg.grpo.kl_coef * (delta.exp() - delta - 1).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


# (file suffix, function) → what the profile row means, and whether the bare loop does that work
# too; reported as cumulative time per step (rows nest inside the whole step).
_PHASES = [
    (("member.py", "step"), "Member.step (whole step)", True),
    (("gaussian.py", "sample"), "policy.sample", True),
    (("gaussian.py", "log_prob"), "policy.log_prob (old, reference, update)", True),
    (("idea.py", "reward"), "env.reward", True),
    (("step.py", "step_advantages"), "step_advantages", True),
    (("_tensor.py", "backward"), "loss.backward", True),
    (("adam.py", "step"), "Adam.step", True),
    (("optimizer.py", "zero_grad"), "optimizer.zero_grad", True),
    (("gaussian.py", "entropy"), "policy.entropy (every step, also when no entropy bonus)", False),
    (("idea.py", "behaviour"), "env.behaviour (archive descriptor)", False),
    (("idea.py", "complexity"), "env.complexity", False),
    (("archive_service.py", "step"), "LocalArchive.step (MAP-Elites insert)", False),
    (("metrics.py", "pairwise_diversity"), "pairwise_diversity (metrics)", False),
    (("metrics.py", "group_pass_best_at_k"), "pass@k / best@k (metrics)", False),
    (("member.py", "end_epoch"), "Member.end_epoch (once per epoch)", False),
]


def _time_member(member, epochs: int) -> float:
    """CPU seconds per step of the calling thread (not wall time: see :func:`run`)."""
    steps = epochs * member.config.grpo.steps_per_epoch
    start = time.thread_time()
    member.train_epochs(epochs)
    return (time.thread_time() - start) / steps


def _time_bare(bare: BareGRPO, steps: int) -> float:
    start = time.thread_time()
    for _ in range(steps):
        bare.step()
    return (time.thread_time() - start) / steps


def _profile(member, epochs: int) -> dict:
    steps = epochs * member.config.grpo.steps_per_epoch
    profiler = cProfile.Profile()
    profiler.enable()
    member.train_epochs(epochs)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, func) -> (cc, nc, tottime, cumtime, callers)
    total = sum(v[2] for v in stats.values())
    phases = []
    for (suffix, func), label, in_bare in _PHASES:
        cum = sum(v[3] for (file, _, name), v in stats.items() if name == func and file.endswith(suffix))
        if cum > 0:
            phases.append({"what": label, "ms_per_step": cum / steps * 1e3, "share": cum / total, "in_bare": in_bare})
    own = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    top = [
        {
            "function": _label(file, line, name),
            "calls_per_step": v[1] / steps,
            "ms_per_step": v[2] / steps * 1e3,
            "share": v[2] / total,
        }
        for (file, line, name), v in own
    ]
    return {"total_ms_per_step": total / steps * 1e3, "phases": phases, "top": top}


def _label(file: str, line: int, name: str) -> str:
    if file == "~":  # a C function
        return name.strip("<>").replace("built-in method ", "")
    for marker in ("site-packages/", "/work/main/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{file}:{line} {name}"


def run(quick: bool = False) -> dict:
    """Member and bare loop in short alternating blocks (one epoch each), timed in CPU time.

    This machine's speed drifts by tens of percent within minutes (a shared VM): the ratio
    is the median of the ratios of neighbouring blocks, which drift leaves alone, and the
    thread's CPU time leaves out the time it was not running at all.
    """
    cfg = load_config(preset_path("grpo"))
    blocks = 12 if quick else 80
    executor = LocalExecutor(cfg)  # sets run.torch_threads (1) for this process
    member = executor.members[0]
    bare = BareGRPO(cfg)
    steps_per_block = cfg.grpo.steps_per_epoch
    member.train_epochs(1)  # warm-up: first allocations, lazy imports
    _time_bare(bare, steps_per_block)
    member_s, bare_s = [], []
    for _ in range(blocks):
        member_s.append(_time_member(member, 1))
        bare_s.append(_time_bare(bare, steps_per_block))
    ratios = [m / b for m, b in zip(member_s, bare_s, strict=True)]
    member_step, bare_step = statistics.median(member_s), statistics.median(bare_s)
    ideas_per_step = cfg.policy.n_prompts * cfg.grpo.group_size
    quartiles = statistics.quantiles(ratios, n=4)
    return {
        "member_ms": member_step * 1e3,
        "bare_ms": bare_step * 1e3,
        "member_spread_ms": (min(member_s) * 1e3, max(member_s) * 1e3),
        "bare_spread_ms": (min(bare_s) * 1e3, max(bare_s) * 1e3),
        "ratio": statistics.median(ratios),
        "ratio_quartiles": (quartiles[0], quartiles[2]),
        "ideas_per_step": ideas_per_step,
        "member_ideas_per_s": ideas_per_step / member_step,
        "bare_ideas_per_s": ideas_per_step / bare_step,
        "steps_timed": blocks * steps_per_block,
        "profile": _profile(member, 2 if quick else 10),
        "threads": torch.get_num_threads(),
    }


def markdown(r: dict) -> str:
    ok = r["ratio"] <= TARGET
    extra = sorted((p for p in r["profile"]["phases"] if not p["in_bare"]), key=lambda p: -p["ms_per_step"])
    reason = (
        f"member − bare = {r['member_ms'] - r['bare_ms']:.2f} ms/step; work the bare loop does not do takes "
        f"{sum(p['ms_per_step'] for p in extra):.2f} ms/step under cProfile: "
        + ", ".join(f"{p['what'].split(' (')[0]} {p['ms_per_step']:.2f}" for p in extra)
    )
    table = md_table(
        ["implementation", "CPU ms/step (median)", "range over blocks", "ideas/s", "member / bare", "target", "status"],
        [
            [
                "`Member.train_epochs` (grpo preset, in-process archive)",
                f"{r['member_ms']:.3f}",
                f"{r['member_spread_ms'][0]:.3f}–{r['member_spread_ms'][1]:.3f}",
                f"{r['member_ideas_per_s']:,.0f}",
                f"{r['ratio']:.2f}× (quartiles {r['ratio_quartiles'][0]:.2f}–{r['ratio_quartiles'][1]:.2f})",
                f"≤ {TARGET:.2f}×",
                met(ok, reason),
            ],
            [
                "bare torch loop (`benchmarks.step_floor.BareGRPO`)",
                f"{r['bare_ms']:.3f}",
                f"{r['bare_spread_ms'][0]:.3f}–{r['bare_spread_ms'][1]:.3f}",
                f"{r['bare_ideas_per_s']:,.0f}",
                "1.00×",
                "",
                "",
            ],
        ],
    )
    prof = r["profile"]
    phases = md_table(
        ["where the member's step goes (cumulative)", "ms/step", "share of profiled time", "bare loop does it"],
        [
            [p["what"], f"{p['ms_per_step']:.3f}", f"{p['share']:.0%}", "yes" if p["in_bare"] else "no"]
            for p in prof["phases"]
        ],
    )
    top = md_table(
        ["top own-time cost", "calls/step", "ms/step", "share"],
        [[f"`{t['function']}`", f"{t['calls_per_step']:.1f}", f"{t['ms_per_step']:.3f}", f"{t['share']:.0%}"]
         for t in prof["top"]],
    )  # fmt: skip
    return "\n\n".join(
        [
            f"One GRPO step of P × G = {r['ideas_per_step']} ideas, {r['threads']} torch thread, "
            f"{r['steps_timed']} steps each, member and bare loop timed alternately in blocks of one epoch, "
            "in the thread's CPU time; member / bare is the median of the blocks' ratios. "
            "The bare loop is the same arithmetic as plain torch: sample, old and reference log-probs "
            "(the frozen reference's heads computed once, as the member does), "
            "`IdeaEnv.reward`, group advantages, clipped surrogate + k3 KL, Adam.",
            table,
            f"cProfile of the member's step ({prof['total_ms_per_step']:.2f} ms/step under the profiler, "
            "which inflates Python-side costs):",
            phases,
            top,
        ]
    )
