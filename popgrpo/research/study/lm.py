"""``popgrpo reproduce --study lm``: the collapse study on real programs (issue 18, docs/RESULTS_LM.md).

The main paper's methods — GRPO, QD-GRPO, MaxEnt-GRPO, Pop-GRPO and the combined method of
its §7 — trained on a causal LM pre-trained here (``popgrpo lm pretrain``) and the program
task of ``jobs/configs/lm_programs.yaml`` (reward ``Q·B`` from executing the program in the
sandbox), beside a **no-update control**: the same sampling, scoring and metrics with a
learning rate of 1e-12, so the weights stay where pre-training left them. What a method
changes is read against the control, seed by seed: the epoch's prompts and the sampled
programs move with the prompt styles drawn, and without the control that drift reads as
learning (docs/RESULTS_LM.md, the pilot). Pop-GRPO has a second, compute-matched control:
the best of K independent GRPO runs (:data:`BEST_OF_K`, docs/RESULTS_LM.md §3.5).

Everything here is pure (no Ray, no files): the trials are run by
:func:`popgrpo.research.study.run.reproduce` as Ray Tune trials, with its plan/resume, and read back
by :mod:`popgrpo.research.study.lm_report`.
"""

from __future__ import annotations

from dataclasses import dataclass

from popgrpo.research.study.plan import Membership, Trial

__all__ = ["BEST_OF_K", "CONTROL", "FULL", "LM_METHODS", "POPULATIONS", "QUICK", "LMStudy", "build_lm_plan"]

PRESET = "lm_programs"
CONTROL = "no update (control)"
# Pop-GRPO's compute-matched control, as the idea-landscape studies' (popgrpo.research.study.plan.CONTROLS):
# Pop-GRPO's population with the scheduler off, i.e. K independent GRPO members with the same
# samples and updates each and no selection, merge or mutation; scored by its best member.
BEST_OF_K = "best-of-K GRPO"

_ONE = ("population.size=1", "scheduler.enabled=false")
_POP = ("population.size=2", "scheduler.enabled=true", "scheduler.top_m=2")
_QD = ("qd.enabled=true", "qd.beta_new=0.5", "qd.beta_imp=0.3")  # the main paper's pair
# MaxEnt-GRPO as jobs/configs/maxent_grpo.yaml: entropy target, novelty reward, complexity bins.
# The entropy here is the mean token entropy of the completions (nats per token); the
# pre-trained model's is about 0.6, so the target 1.0 asks for more than it has.
_MAXENT = (
    "maxent.entropy.enabled=true",
    "maxent.entropy.target=1.0",
    "maxent.novelty.enabled=true",
    "maxent.novelty.coef=0.3",
    "maxent.complexity_bins=3",
)

# label -> overrides of the lm_programs preset. The combined method is Pop-GRPO of MaxEnt
# (entropy bonus) members with archive bonuses, as jobs/configs/combined.yaml.
LM_METHODS: dict[str, tuple[str, ...]] = {
    CONTROL: (*_ONE, "grpo.lr=1e-12"),
    "GRPO": _ONE,
    "QD-GRPO": (*_ONE, *_QD),
    "MaxEnt-GRPO": (*_ONE, *_MAXENT),
    "Pop-GRPO": _POP,
    BEST_OF_K: (*_POP, "scheduler.enabled=false"),
    "Combined (§7)": (*_POP, *_QD, "maxent.entropy.enabled=true", "maxent.entropy.target=1.0"),
}

# The arms the report also scores by their best member: Pop-GRPO and its best-of-K control (same K).
POPULATIONS = ("Pop-GRPO", BEST_OF_K)


@dataclass(frozen=True)
class LMStudy:
    """One size of the study: the regime every trial shares, and how long and how often."""

    seeds: tuple[int, ...]
    epochs: int
    interval_epochs: int  # Pop-GRPO's round length T (and the reporting interval)
    regime: tuple[str, ...]  # overrides every trial shares (task, sampling, step size)
    window: int  # epochs averaged at the end (and at the start) for the tables and claims


# The regime (docs/RESULTS_LM.md §3: chosen with a no-update control beside GRPO): two prompt
# styles, both in every step, 8 programs each (16 per step), lr 4e-3 with LoRA r = 8 and the
# KL to the start at 0.01. Measured on one seed, 48 steps: GRPO's mean reward rose above the
# control's and its diversity and token entropy fell; 8 programs per step at the same lr, or
# lr 8e-3, broke the model (programs stopped running) within 40 steps.
FULL = LMStudy(
    seeds=(42, 142, 242),
    epochs=8,
    interval_epochs=2,
    regime=(
        'env.text.prompts=["# loop\\n","# function\\n"]',
        "policy.causal_lm.prompts_per_step=2",
        "policy.causal_lm.max_new_tokens=80",
        "grpo.group_size=8",
        "grpo.steps_per_epoch=4",
        "grpo.lr=0.004",
        "grpo.kl_coef=0.01",
        "eval.k=4",
    ),
    window=2,
)
# For tests and a first look: any model (the tiny one of `popgrpo lm tiny` / `lm pretrain --quick`).
QUICK = LMStudy(
    seeds=(42, 142),
    epochs=2,
    interval_epochs=1,
    regime=(
        'env.text.prompts=["# loop\\n","# function\\n"]',
        "policy.causal_lm.prompts_per_step=1",
        "policy.causal_lm.max_new_tokens=12",
        "grpo.group_size=4",
        "grpo.steps_per_epoch=1",
        "grpo.lr=0.004",
        "eval.k=2",
        "eval.samples=4",
    ),
    window=1,
)


def build_lm_plan(study: LMStudy, model: str, seeds: tuple[int, ...] | None = None) -> list[Trial]:
    """One trial per method and seed (``seeds`` overrides the study's), all on ``model``."""
    common = (
        f"policy.causal_lm.model={model}",
        f"run.epochs={study.epochs}",
        f"scheduler.interval_epochs={study.interval_epochs}",
        "run.loggers=[]",
        "run.name=lm_study",
        *study.regime,
    )
    trials = []
    for seed in seeds or study.seeds:
        for label, overrides in LM_METHODS.items():
            trial = Trial(PRESET, (*common, *overrides), seed)
            trial.memberships.append(Membership("lm", label))
            trials.append(trial)
    return trials
