"""What ``popgrpo reproduce --study discovery`` runs: population mechanisms against best-of-K.

Every arm is one popgrpo run of K = 5 members on the same preset (``pop_grpo`` on the
collapse landscape, ``paper_pop_grpo`` on the calibrated one), so every arm samples and
executes the same ideas and takes the same gradient steps: a population of K against K
independent GRPO runs (``scheduler.enabled=false``: no selection, merge or mutation) with the
same members, seeds and budget. No mechanism here spends a sample on selection (they rank
members by the round's training metrics); the soup arms also evaluate their merged model every
round (``eval.merged``), executing held-out ideas outside the samples counted. The report checks
that the ideas sampled are equal across the arms of a cell and says so.

A *unit* is (landscape instance, seed): ``env.peak_seed`` picks the landscape's peak
directions, ``run.seed`` everything else, and both arms of a paired comparison share them. A
*cell* is (landscape, intensity), intensity being GRPO updates per epoch
(``grpo.steps_per_epoch``; main paper's regime map).

Two designs:

* :data:`TUNING`: what ``--study discovery-tuning`` runs on the tuning seeds and a tuning
  landscape instance that the confirmatory study never uses: every mechanism with a small
  grid of its parameters and the ingredient arms, at intensities 1 and 4. Mechanisms are
  chosen and tuned on these runs only.
* the confirmatory design, read from the pre-registration
  (``popgrpo/research/study/preregistration/discovery.json``, committed before the confirmatory runs):
  which arms, instances, intensities, seeds, metrics, margins and threshold.

Everything here is pure (no Ray, no files but the pre-registration's JSON).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from popgrpo.research.study.plan import Trial, landscape_overrides, landscape_preset

__all__ = [
    "CONTROL",
    "PREREGISTRATION",
    "TUNING",
    "DiscoveryDesign",
    "build_discovery_plan",
    "load_preregistration",
]

CONTROL = "best-of-K GRPO"

# Every arm the study knows: label -> overrides on the landscape's pop_grpo preset.
ARMS: dict[str, tuple[str, ...]] = {
    CONTROL: ("scheduler.enabled=false",),
    "soup (Pop-GRPO)": (),
    "soup + svd": ("scheduler.population=soup_svd",),
    "truncation": ("scheduler.population=truncation",),
    "truncation 0.4": ("scheduler.population=truncation", "scheduler.truncation_fraction=0.4"),
    "repulsion": ("scheduler.population=repulsion",),
    "repulsion 1.0": ("scheduler.population=repulsion", "scheduler.repulsion_strength=1.0"),
    "repulsion 1.0 wide": (
        "scheduler.population=repulsion",
        "scheduler.repulsion_strength=1.0",
        "scheduler.repulsion_bandwidth=0.2",
    ),
    "frontier": ("scheduler.population=frontier",),
    "frontier 0.4": ("scheduler.population=frontier", "scheduler.truncation_fraction=0.4"),
    # Ingredient arms: what a mechanism's parts do without the population's coupling.
    "perturb + reset": ("scheduler.population=independent",),
    "reset only": ("scheduler.population=independent", "scheduler.mutate=none"),
}
# A population of one (K = 1, the soup of itself plus perturbation and reset) is a fifth of
# the compute of the arms above: the tuning phase runs it to see what perturbation does to a
# single run, never as a compute-matched comparison.
K1_ARM = "Pop-GRPO, K = 1"
K1_OVERRIDES = ("population.size=1", "scheduler.top_m=1")

LANDSCAPE_PRESET = "pop_grpo"


@dataclass(frozen=True)
class DiscoveryDesign:
    """One study's design: which arms, on which landscapes and instances, at which intensities, for which seeds."""

    phase: str  # "tuning" or "confirmatory"
    arms: tuple[str, ...]
    landscapes: tuple[str, ...]
    instances: tuple[int, ...]  # env.peak_seed values
    intensities: tuple[int, ...]  # grpo.steps_per_epoch
    seeds: tuple[int, ...]
    epochs: int
    threshold: float  # eval.discovery_threshold: the fraction of a peak's height that counts as reaching it
    extra_arms: tuple[str, ...] = ()  # arms run but not compute-matched (K1_ARM)
    metrics: dict[str, dict] = field(
        default_factory=dict[str, dict]
    )  # name -> {"better": "higher"|"lower", "margin": m}

    def to_json(self) -> dict:
        return {
            "phase": self.phase,
            "arms": list(self.arms),
            "landscapes": list(self.landscapes),
            "instances": list(self.instances),
            "intensities": list(self.intensities),
            "seeds": list(self.seeds),
            "epochs": self.epochs,
            "threshold": self.threshold,
            "extra_arms": list(self.extra_arms),
            "metrics": self.metrics,
        }

    @classmethod
    def from_json(cls, data: dict) -> DiscoveryDesign:
        unknown = [a for a in data["arms"] if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {unknown}: the study knows {sorted(ARMS)}")
        if CONTROL not in data["arms"]:
            raise ValueError(f"the design has no {CONTROL!r} arm to compare with")
        return cls(
            phase=str(data["phase"]),
            arms=tuple(data["arms"]),
            landscapes=tuple(data["landscapes"]),
            instances=tuple(int(i) for i in data["instances"]),
            intensities=tuple(int(i) for i in data["intensities"]),
            seeds=tuple(int(s) for s in data["seeds"]),
            epochs=int(data["epochs"]),
            threshold=float(data["threshold"]),
            extra_arms=tuple(data.get("extra_arms", ())),
            metrics=dict(data.get("metrics", {})),
        )


# Tuning: seeds and a landscape instance the confirmatory study never uses.
TUNING = DiscoveryDesign(
    phase="tuning",
    arms=tuple(a for a in ARMS if a not in ("frontier 0.4", "repulsion 1.0 wide")),
    landscapes=("collapse", "paper"),
    instances=(1000,),
    intensities=(1, 4),
    seeds=(7001, 7002, 7003, 7004),
    epochs=120,
    threshold=0.8,
    extra_arms=(K1_ARM,),
)

PREREGISTRATION = "discovery.json"


def load_preregistration(path: str | Path | None = None) -> tuple[DiscoveryDesign, str]:
    """The confirmatory design and the SHA-256 of the file it came from (the report quotes it).

    ``path``: a pre-registration JSON (default: the committed
    ``popgrpo/research/study/preregistration/discovery.json``)."""
    if path is None:
        text = (
            resources.files("popgrpo.research.study").joinpath("preregistration").joinpath(PREREGISTRATION).read_text()
        )
    else:
        text = Path(path).read_text()
    data = json.loads(text)
    design = DiscoveryDesign.from_json(data["design"])
    if design.phase != "confirmatory":
        raise ValueError(f"{path or PREREGISTRATION}: its design is a {design.phase!r} phase, not confirmatory")
    return design, hashlib.sha256(text.encode()).hexdigest()


def quick_design(design: DiscoveryDesign, seeds: tuple[int, ...] | None = None) -> DiscoveryDesign:
    """``--quick``: the design's arms on both landscapes, one instance, intensity 1, two seeds,
    30 epochs: every code path of the study in a few minutes, no conclusions."""
    return DiscoveryDesign(
        phase=design.phase,
        arms=design.arms,
        landscapes=design.landscapes,
        instances=design.instances[:1],
        intensities=design.intensities[:1],
        seeds=seeds or design.seeds[:2],
        epochs=30,
        threshold=design.threshold,
        extra_arms=(),
        metrics=design.metrics,
    )


def _arm_overrides(arm: str) -> tuple[str, ...]:
    if arm == K1_ARM:
        return K1_OVERRIDES
    return ARMS[arm]


def build_discovery_plan(design: DiscoveryDesign) -> list[dict]:
    """Every trial of ``design`` as ``plan.json`` holds it: ``key``, ``preset``, ``overrides``,
    ``seed`` (what :func:`popgrpo.research.study.run.run_trial` needs) and the cell it serves
    (``arm``, ``landscape``, ``instance``, ``intensity``)."""
    trials = []
    for landscape in design.landscapes:
        preset = landscape_preset(LANDSCAPE_PRESET, landscape)
        landscape_settings = landscape_overrides(landscape)
        for instance in design.instances:
            for intensity in design.intensities:
                for arm in (*design.arms, *design.extra_arms):
                    overrides = (
                        *landscape_settings,
                        f"run.epochs={design.epochs}",
                        f"env.peak_seed={instance}",
                        f"grpo.steps_per_epoch={intensity}",
                        f"eval.discovery_threshold={design.threshold}",
                        *_arm_overrides(arm),
                    )
                    for seed in design.seeds:
                        trial = Trial(preset, overrides, seed)
                        trials.append(
                            {
                                **trial.to_json(),
                                "arm": arm,
                                "landscape": landscape,
                                "instance": instance,
                                "intensity": intensity,
                            }
                        )
    keys = [t["key"] for t in trials]
    if len(set(keys)) != len(keys):  # two arms that resolve to one config would share a run
        raise ValueError("two trials of the design resolve to the same config")
    return trials
