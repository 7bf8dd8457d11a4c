"""What ``popgrpo reproduce`` runs: the main paper's §5–6 studies as a list of trials.

A *trial* is one training run (a preset, a few overrides, a seed). A *study* is a table or
figure of the paper, made of trials labelled by method or by the ablated value. Trials with
the same resolved config are run once and shared: MaxEnt-GRPO at H* = 1 is both a Table 1 row
and a point of the entropy-target ablation.

Everything here is pure (no Ray, no files), so the plan can be listed and tested alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TypeVar

from popgrpo.config import Config, load_config, preset_path
from popgrpo.registry import STUDY_LANDSCAPES

__all__ = [
    "ABLATIONS",
    "CONTROLS",
    "LANDSCAPES",
    "MERGE_STRATEGIES",
    "METHODS",
    "PAPER_MULTISEED",
    "PAPER_TABLE1",
    "REGIME_INTENSITIES",
    "REGIME_METHODS",
    "SEEDS",
    "Membership",
    "Trial",
    "build_plan",
    "design_with_options",
    "landscape_overrides",
    "landscape_preset",
]

SEEDS = (42, 142, 242, 342, 442)  # main paper §5: n = 5, seeds 42–442
QUICK_SEEDS = (42, 142)
EPOCHS, QUICK_EPOCHS = 120, 30

# Table 1 rows: label -> preset. "combined" is the paper's §7 proposal (jobs/configs/combined.yaml).
METHODS = {
    "GRPO": "grpo",
    "QD-GRPO": "qd_grpo",
    "MaxEnt-GRPO": "maxent_grpo",
    "Pop-GRPO": "pop_grpo",
    "Combined (§7)": "combined",
}

# Main paper Table 1 (last 10 epochs, one seed).
PAPER_TABLE1 = {
    "GRPO": {"mean_reward": 0.0716, "max_reward": 0.8412, "diversity": 0.9675, "complexity": 3.4332},
    "QD-GRPO": {"mean_reward": 0.0814, "max_reward": 0.8122, "diversity": 0.9433, "complexity": 3.4306},
    "MaxEnt-GRPO": {"mean_reward": 0.0082, "max_reward": 0.4420, "diversity": 0.9944, "complexity": 28.861},
    "Pop-GRPO": {"mean_reward": 0.0865, "max_reward": 0.9588, "diversity": 0.9969, "complexity": 3.7482},
}
# Main paper §6.4 (n = 5, mean ± std): the only multi-seed numbers it prints.
PAPER_MULTISEED = {
    ("Pop-GRPO", "diversity"): (0.9969, 0.0016),
    ("MaxEnt-GRPO", "complexity"): (29.17, 0.22),
    ("GRPO", "diversity"): (0.9507, 0.0264),
}


def _archive_bonus(beta: float) -> list[str]:
    # The paper's default pair is β_new = 0.5, β_imp = 0.3: β_imp = 0.6·β_new throughout.
    return [f"qd.beta_new={beta}", f"qd.beta_imp={round(0.6 * beta, 6)}"]


def _population(k: int) -> list[str]:
    return [f"population.size={k}", f"scheduler.top_m={min(3, k)}"]


# study -> (preset, the ablated quantity's name, values, overrides for a value); main paper §6.5
ABLATIONS = {
    "entropy_target": (
        "maxent_grpo",
        "H*",
        (0.0, 0.5, 1.0, 2.0, 4.0),
        lambda h: [f"maxent.entropy.target={h}"],
    ),
    # The same H* values read as the full 16-d entropy (maxent.entropy.per_dimension false),
    # presumably the paper's reading; popgrpo's default counts per dimension.
    "entropy_target_joint": (
        "maxent_grpo",
        "H* (joint)",
        (0.0, 0.5, 1.0, 2.0, 4.0),
        lambda h: [f"maxent.entropy.target={h}", "maxent.entropy.per_dimension=false"],
    ),
    "archive_bonus": ("qd_grpo", "β", (0.0, 0.1, 0.3, 0.5, 1.0, 2.0), _archive_bonus),
    "population_size": ("pop_grpo", "K", (1, 2, 3, 5, 8), _population),
}


# The merge ablation: the scheduler's merge and mutation on the Pop-GRPO setting (docs/MERGING.md).
MERGE_STRATEGIES = {
    "soup": [],
    "weighted_soup": ["scheduler.merge=weighted_soup"],
    "greedy_soup": ["scheduler.merge=greedy_soup"],
    "wise_ft": ["scheduler.merge=wise_ft"],
    "task_arithmetic": ["scheduler.merge=task_arithmetic"],
    "soup + svd (scale)": ["scheduler.mutate=svd", "scheduler.svd_mode=scale"],
    "soup + svd (add)": ["scheduler.mutate=svd", "scheduler.svd_mode=add"],
}


# Compute-matched controls of Pop-GRPO (preset pop_grpo, K = 5): a population draws K times the
# ideas of one policy, so its best member is compared with the best of K independent GRPO runs
# (the same population with the scheduler off: no selection, merge or mutation), scored the
# same way; each with one shared initial model (as fine-tuning one pretrained model) and with
# independent initial weights.
CONTROLS = {
    "Pop-GRPO": [],
    "Pop-GRPO, own inits": ["population.shared_init=false"],
    "best-of-K GRPO": ["scheduler.enabled=false"],
    "best-of-K GRPO, own inits": ["scheduler.enabled=false", "population.shared_init=false"],
}


# The regime map: the main claims as a function of training intensity (GRPO updates per epoch)
# at a fixed number of epochs. Each method at each intensity, every seed; value = intensity.
REGIME_INTENSITIES = (1, 2, 4, 8)
REGIME_METHODS = {
    "GRPO": ("grpo", []),
    "QD-GRPO": ("qd_grpo", []),
    "MaxEnt-GRPO": ("maxent_grpo", []),
    "Pop-GRPO": ("pop_grpo", []),
    "best-of-K GRPO": ("pop_grpo", CONTROLS["best-of-K GRPO"]),
}

# The landscapes the paper study runs on: today's presets, or the calibrated paper_* presets that
# `popgrpo calibrate` writes (docs/studies/reproduce.md, "Calibrating the open choices"). Every
# study landscape (these, stepping_stones, a plugin's) is an entry of STUDY_LANDSCAPES.
LANDSCAPES = ("collapse", "paper")


D = TypeVar("D")


def design_with_options(
    study: str,
    design: D,
    quick_design: Callable[[D, tuple[int, ...] | None], D],
    options: tuple[bool, Iterable[int] | None, int | None, str],
    tuning_seeds: Iterable[int],
    confirmatory: bool,
) -> D:
    """A discovery study's ``design`` (a dataclass with ``seeds`` and ``epochs``) with ``reproduce``'s
    ``options`` (``--quick``, ``--seeds``, ``--epochs``, ``--landscape``) applied: ``--quick`` is the
    study's ``quick_design``. A study of several landscapes refuses ``--landscape``; a confirmatory
    run (not ``--quick``) refuses the tuning seeds."""
    quick, seeds, epochs, landscape = options
    if landscape != "collapse":
        raise ValueError(f"--study {study} runs its design's landscapes: drop --landscape")
    if quick:
        design = quick_design(design, tuple(seeds) if seeds else None)
    elif seeds:
        design = replace(design, seeds=tuple(seeds))  # pyright: ignore[reportArgumentType]  # D is a dataclass
    if epochs:
        design = replace(design, epochs=epochs)  # pyright: ignore[reportArgumentType]
    shared = sorted(set(design.seeds) & set(tuning_seeds))  # pyright: ignore[reportAttributeAccessIssue]
    if confirmatory and not quick and shared:
        raise ValueError(f"--seeds {shared} are tuning seeds: confirm on others")
    return design


def landscape_preset(preset: str, landscape: str) -> str:
    """The preset of ``preset``'s method on ``landscape`` (:data:`popgrpo.registry.STUDY_LANDSCAPES`;
    its overrides: :func:`landscape_overrides`); a clear error when it was never calibrated."""
    name = STUDY_LANDSCAPES.get(landscape).preset(preset)
    if not preset_path(name).exists():
        raise ValueError(f"no preset {name!r}: run `popgrpo calibrate` first (it writes the paper_* presets)")
    return name


def landscape_overrides(landscape: str) -> tuple[str, ...]:
    """The config overrides that make a method's preset run on ``landscape`` (after its preset)."""
    return tuple(STUDY_LANDSCAPES.get(landscape).overrides)


@dataclass(frozen=True)
class Membership:
    study: str  # "table1", "controls", "merge_strategy" or an ABLATIONS key
    label: str  # method name, or the ablated value as text
    value: float | None = None  # the ablated value (None in table1)


@dataclass
class Trial:
    """One training run, and every study cell it serves."""

    preset: str
    overrides: tuple[str, ...]
    seed: int
    memberships: list[Membership] = field(default_factory=list)

    def config(self) -> Config:
        return load_config(preset_path(self.preset), [*self.overrides, f"run.seed={self.seed}"])

    @cached_property  # preset, overrides and seed never change; memberships do not enter the key
    def key(self) -> str:
        """Stable id from the resolved config: same config, same key, one run."""
        digest = hashlib.sha256(self.config().model_dump_json().encode()).hexdigest()[:10]
        return f"{self.preset}-s{self.seed}-{digest}"

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "preset": self.preset,
            "overrides": list(self.overrides),
            "seed": self.seed,
            "memberships": [m.__dict__ for m in self.memberships],
        }


def build_plan(
    quick: bool = False,
    seeds: tuple[int, ...] | None = None,
    epochs: int | None = None,
    landscape: str = "collapse",
    regime: bool = False,
) -> list[Trial]:
    """Every trial of Table 1, the multi-seed runs, the compute-matched controls of Pop-GRPO,
    the paper's three ablations and the merge-strategy ablation, deduplicated.

    ``quick``: 30 epochs and seeds 42, 142 (for CI and a first look); the full plan is the
    paper's 120 epochs and five seeds. ``landscape``: ``collapse`` (today's presets) or
    ``paper`` (the calibrated ``paper_*`` presets). ``regime`` adds the regime map
    (:data:`REGIME_INTENSITIES` × :data:`REGIME_METHODS`); ``popgrpo reproduce`` asks for it in
    the full study, not in ``--quick``.
    """
    seeds = seeds or (QUICK_SEEDS if quick else SEEDS)
    epochs = epochs or (QUICK_EPOCHS if quick else EPOCHS)
    common = (f"run.epochs={epochs}",)
    by_key: dict[str, Trial] = {}

    def add(preset: str, overrides: list[str], seed: int, membership: Membership) -> None:
        trial = Trial(landscape_preset(preset, landscape), (*common, *overrides), seed)
        trial = by_key.setdefault(trial.key, trial)
        trial.memberships.append(membership)

    for seed in seeds:
        for label, preset in METHODS.items():
            add(preset, [], seed, Membership("table1", label))
        for label, overrides in CONTROLS.items():
            add("pop_grpo", overrides, seed, Membership("controls", label))
        for study, (preset, _, values, overrides_for) in ABLATIONS.items():
            for value in values:
                add(preset, overrides_for(value), seed, Membership(study, f"{value:g}", float(value)))
        for index, (label, overrides) in enumerate(MERGE_STRATEGIES.items()):
            add("pop_grpo", overrides, seed, Membership("merge_strategy", label, float(index)))
        for intensity in REGIME_INTENSITIES if regime else ():
            for label, (preset, overrides) in REGIME_METHODS.items():
                steps = f"grpo.steps_per_epoch={intensity}"
                add(preset, [*overrides, steps], seed, Membership("regime", label, float(intensity)))
    return list(by_key.values())
