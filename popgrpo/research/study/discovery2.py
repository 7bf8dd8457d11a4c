"""What ``popgrpo reproduce --study discovery2-tuning`` and ``--study discovery2`` run: the second
discovery study (issue 46, docs/DISCOVERY2_PREREGISTRATION.md).

Every arm is one popgrpo run of K = 5 members on a landscape family's ``pop_grpo`` preset with
the arm's overrides, so every arm samples and executes the same ideas and takes the same gradient
steps as the control, K independent GRPO runs (``scheduler.enabled=false``). A *unit* is a
landscape instance (``env.peak_seed``); a trial is (arm, family, instance, seed), and the report
infers at the instance level (per arm and instance, the mean over its seeds).

The design is machine-readable JSON under ``popgrpo/research/study/preregistration/``:

* ``discovery2_tuning.json``: the tuning design (tuning instances and seeds only); its arms hold
  each mechanism's tuning grid. Its report sizes the confirmation from shrunken effect sizes.
* ``discovery2.json``: the confirmatory design, written by the lead after tuning and committed
  before the first confirmatory trial; :func:`load_preregistration` reads and validates it (at
  least 8 instances per family, none and no seed shared with tuning, a margin per judged metric,
  the entropy-matched arm's target, random search's tuned widths). Until it is committed,
  ``--study discovery2`` stops with exit 2.

Both have one schema (:class:`Design2`). Each arm's overrides are checked by the config loader on
every family (:func:`check_arms`): an override the schema does not know fails the design.

Random search (:mod:`popgrpo.research.study.discovery_random`'s searches) is an arm of the report,
not a trial: per unit, as many ideas as a run of the family sampled, at a width per metric tuned
on the tuning instances and seeds (in the confirmatory design: the widths it pre-registers).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

from popgrpo.research.study.discovery_plan import CONTROL, LANDSCAPE_PRESET

__all__ = [
    "BESIDE",
    "CONTROL",
    "ENTROPY_MATCHED",
    "PREREGISTRATION",
    "PRIMARY",
    "SECONDARY",
    "TUNING_FILE",
    "Design2",
    "arm_overrides",
    "build_plan",
    "check_arms",
    "design_plan",
    "discovery2_plan",
    "discovery2_tuning_plan",
    "load_preregistration",
    "load_tuning",
    "quick_design",
]

PREREGISTRATION = "discovery2.json"
TUNING_FILE = "discovery2_tuning.json"
PREREGISTRATION_PATH = f"popgrpo/research/study/preregistration/{PREREGISTRATION}"

ENTROPY_MATCHED = "entropy-matched GRPO"
"""The arm that is the control plus an entropy target (``maxent.entropy``) set from tuning: the
design's ``entropy_target`` of the trial's family, which :func:`build_plan` appends."""

PRIMARY = ("far_coverage", "best_quality")
SECONDARY = ("coverage", "far_peaks", "peak_fraction_mean", "best_expected")
BESIDE = ("entropy", "spread", "diversity")
"""Per-trial columns reported beside the judged metrics when the trials table has them (not judged)."""

# Settings the design owns: an arm may not override them.
_DESIGN_KEYS = ("population.size", "run.seed", "run.epochs", "env.peak_seed", "grpo.steps_per_epoch", "env.landscape")
MIN_CONFIRMATORY_INSTANCES = 8
QUICK_EPOCHS = 8


@dataclass(frozen=True)
class Design2:
    """One phase of the second discovery study: arms (label → overrides), families, units, metrics."""

    phase: str  # "tuning" or "confirmatory"
    arms: dict[str, tuple[str, ...]]
    families: tuple[str, ...]
    primary_family: str
    instances: tuple[int, ...]
    seeds: tuple[int, ...]
    steps_per_epoch: int
    epochs: int
    threshold: float  # eval.discovery_threshold, and the height threshold of the coverage metrics
    metrics: dict[str, dict]  # name -> {"tier": "primary"|"secondary", "margin": m or None (tuning)}
    coupling: tuple[tuple[str, str], ...] = ()  # (coupled arm, the same mechanism uncoupled)
    entropy_target: dict[str, float] | None = None  # family -> the entropy-matched arm's maxent.entropy.target
    random_widths: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> metric -> width
    power_family: int = 60  # tuning: the primary claims the power calculation's α is divided among
    quick_arms: tuple[str, ...] = ()  # --quick's arms (the control first)

    def to_json(self) -> dict:
        return {
            "phase": self.phase,
            "arms": {a: list(o) for a, o in self.arms.items()},
            "families": list(self.families),
            "primary_family": self.primary_family,
            "instances": list(self.instances),
            "seeds": list(self.seeds),
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.epochs,
            "threshold": self.threshold,
            "metrics": self.metrics,
            "coupling": [list(p) for p in self.coupling],
            "entropy_target": self.entropy_target,
            "random_widths": self.random_widths,
            "power_family": self.power_family,
            "quick_arms": list(self.quick_arms),
        }

    @classmethod
    def from_json(cls, data: dict, quick: bool = False) -> Design2:
        """The design of ``data`` (a design file's ``design``), its structure validated (ValueError);
        ``quick``: a ``--quick`` plan's design, which runs fewer instances than a confirmation needs."""
        try:
            design = cls(
                phase=str(data["phase"]),
                arms={str(a): tuple(str(o) for o in overrides) for a, overrides in data["arms"].items()},
                families=tuple(str(f) for f in data["families"]),
                primary_family=str(data["primary_family"]),
                instances=tuple(int(i) for i in data["instances"]),
                seeds=tuple(int(s) for s in data["seeds"]),
                steps_per_epoch=int(data["steps_per_epoch"]),
                epochs=int(data["epochs"]),
                threshold=float(data["threshold"]),
                metrics={str(m): dict(spec) for m, spec in data["metrics"].items()},
                coupling=tuple((str(p[0]), str(p[1])) for p in data.get("coupling", ())),
                entropy_target=_per_family(data.get("entropy_target"), data["families"]),
                random_widths={
                    str(f): {str(m): float(w) for m, w in per.items()}
                    for f, per in (data.get("random_widths") or {}).items()
                },
                power_family=int(data.get("power_family", 60)),
                quick_arms=tuple(str(a) for a in data.get("quick_arms", ())),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed design: {type(exc).__name__}: {exc}") from None
        design.validate(quick)
        return design

    def validate(self, quick: bool = False) -> None:
        """Structure every phase needs (ValueError); :func:`check_arms` checks the overrides themselves.
        ``quick``: a ``--quick`` design, exempt from the confirmatory minimum of instances."""
        from popgrpo.registry import STUDY_LANDSCAPES

        if self.phase not in ("tuning", "confirmatory"):
            raise ValueError(f"phase {self.phase!r}: tuning or confirmatory")
        if self.arms.get(CONTROL) != ("scheduler.enabled=false",):
            raise ValueError(f"the design's {CONTROL!r} arm must be exactly ['scheduler.enabled=false']")
        for family in self.families:
            if family not in STUDY_LANDSCAPES:
                raise ValueError(f"family {family!r} is not a study landscape ({', '.join(STUDY_LANDSCAPES.names())})")
        from popgrpo.research.study.discovery import COVERAGE_THRESHOLD

        if self.threshold != COVERAGE_THRESHOLD:  # the summaries' coverage metrics are at that height
            raise ValueError(f"threshold {self.threshold:g}: the coverage metrics are at {COVERAGE_THRESHOLD:g}")
        if self.primary_family not in self.families:
            raise ValueError(f"primary_family {self.primary_family!r} is not one of the families")
        for arm, overrides in self.arms.items():
            owned = [o for o in overrides if o.split("=", 1)[0] in _DESIGN_KEYS]
            if owned:
                raise ValueError(f"arm {arm!r} sets {owned}: the design owns those settings")
        for metric in (*PRIMARY, *SECONDARY):
            if metric not in self.metrics:
                raise ValueError(f"the design has no metric {metric!r}")
        for metric, spec in self.metrics.items():
            if spec.get("tier") not in ("primary", "secondary"):
                raise ValueError(f"metric {metric!r}: tier must be primary or secondary")
        for pair in self.coupling:
            missing = [a for a in pair if a not in self.arms]
            if missing:
                raise ValueError(f"coupling pair {list(pair)} names arm(s) {missing} the design does not run")
        for arm in self.quick_arms:
            if arm not in self.arms:
                raise ValueError(f"quick arm {arm!r} is not an arm of the design")
        if len(set(self.instances)) != len(self.instances) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("an instance or a seed is repeated")
        if ENTROPY_MATCHED in self.arms:
            missing = [f for f in self.families if f not in (self.entropy_target or {})]
            if missing:
                raise ValueError(f"the {ENTROPY_MATCHED!r} arm needs the design's entropy_target for {missing}")
            if set(self.arms[ENTROPY_MATCHED]) != {"scheduler.enabled=false", "maxent.entropy.enabled=true"}:
                raise ValueError(
                    f"the {ENTROPY_MATCHED!r} arm must be exactly the control with maxent.entropy.enabled=true "
                    "(its maxent.entropy.target is the design's entropy_target of each family)"
                )
        if self.phase == "confirmatory":
            self._validate_confirmatory(quick)

    def _validate_confirmatory(self, quick: bool) -> None:
        if not quick and len(self.instances) < MIN_CONFIRMATORY_INSTANCES:
            raise ValueError(
                f"a confirmatory design needs at least {MIN_CONFIRMATORY_INSTANCES} instances per family, "
                f"has {len(self.instances)}"
            )
        tuning = load_tuning()
        shared_instances = sorted(set(self.instances) & set(tuning.instances))
        shared_seeds = sorted(set(self.seeds) & set(tuning.seeds))
        if shared_instances or shared_seeds:
            raise ValueError(f"instances {shared_instances} / seeds {shared_seeds} are tuning's: confirm on others")
        for metric, spec in self.metrics.items():
            margin = spec.get("margin")
            if not isinstance(margin, int | float) or margin <= 0:
                raise ValueError(f"metric {metric!r}: a confirmatory design needs a margin > 0 (got {margin!r})")
        for family in self.families:
            widths = self.random_widths.get(family, {})
            missing = [m for m in self.metrics if m not in widths]
            if missing:
                raise ValueError(f"random_widths[{family!r}] has no tuned width for {missing}")


def _per_family(value, families) -> dict[str, float] | None:
    """A design's ``entropy_target``: one number for every family, or a family -> number mapping."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return {str(f): float(value) for f in families}
    return {str(f): float(v) for f, v in value.items()}


def arm_overrides(design: Design2, arm: str, family: str) -> tuple[str, ...]:
    """The overrides ``arm`` runs with on ``family``: its own, and the entropy-matched arm's target."""
    overrides = design.arms[arm]
    if arm == ENTROPY_MATCHED and design.entropy_target is not None:
        overrides = (*overrides, f"maxent.entropy.target={design.entropy_target[family]}")
    return overrides


def check_arms(design: Design2) -> None:
    """Load every arm's config on every family of ``design`` (the config loader's validation; its
    error names the arm and family), and refuse a weight-averaging (soup) arm that evaluates its
    merged model outside the counted samples (it needs ``eval.merged=false``)."""
    from popgrpo.config import load_config, preset_path
    from popgrpo.research.study.plan import landscape_overrides, landscape_preset

    for family in design.families:
        preset = preset_path(landscape_preset(LANDSCAPE_PRESET, family))
        for arm in design.arms:
            try:
                config = load_config(preset, [*landscape_overrides(family), *arm_overrides(design, arm, family)])
            except Exception as exc:  # the loader's ConfigError or a validation error
                raise ValueError(f"arm {arm!r} on {family}: {str(exc).splitlines()[0]}") from None
            sched = config.scheduler
            if sched.enabled and sched.population in ("soup", "soup_svd") and config.eval.merged:
                raise ValueError(f"arm {arm!r} averages weights and evaluates the merge: add eval.merged=false")


def _read(name: str, path: str | Path | None) -> str:
    if path is not None:
        return Path(path).read_text()
    return resources.files("popgrpo.research.study").joinpath("preregistration").joinpath(name).read_text()


def load_tuning(path: str | Path | None = None) -> Design2:
    """The tuning design (default: the committed ``discovery2_tuning.json``)."""
    design = Design2.from_json(json.loads(_read(TUNING_FILE, path))["design"])
    if design.phase != "tuning":
        raise ValueError(f"{path or TUNING_FILE}: a {design.phase} design, not the tuning one")
    return design


def load_preregistration(path: str | Path | None = None) -> tuple[Design2, str]:
    """The confirmatory design and the SHA-256 of its file (the verdicts quote it).

    ``path``: a design file (default: the committed ``discovery2.json``; a ValueError saying it is
    not committed yet while it is absent)."""
    if (
        path is None
        and not resources.files("popgrpo.research.study")
        .joinpath("preregistration")
        .joinpath(PREREGISTRATION)
        .is_file()
    ):
        raise ValueError(
            f"the pre-registration {PREREGISTRATION_PATH} is not committed yet: run --study discovery2-tuning, "
            "then commit the confirmatory design before the first confirmatory trial"
        )
    text = _read(PREREGISTRATION, path)
    design = Design2.from_json(json.loads(text)["design"])
    if design.phase != "confirmatory":
        raise ValueError(f"{path or PREREGISTRATION}: a {design.phase} design, not confirmatory")
    return design, hashlib.sha256(text.encode()).hexdigest()


def quick_design(design: Design2, seeds: tuple[int, ...] | None = None) -> Design2:
    """``--quick``: the design's quick arms on every family, two units (the first instance with
    two seeds, or, for a design of one seed, its first two instances), :data:`QUICK_EPOCHS`
    epochs: every code path, the paired tests included, in minutes, no conclusions."""
    arms = design.quick_arms or (CONTROL, *[a for a in design.arms if a != CONTROL][:2])
    seeds = tuple(seeds or design.seeds[:2])
    return replace(
        design,
        arms={a: design.arms[a] for a in arms},
        instances=design.instances[: 1 if len(seeds) > 1 else 2],
        seeds=seeds,
        epochs=QUICK_EPOCHS,
        coupling=tuple(p for p in design.coupling if set(p) <= set(arms)),
    )


def build_plan(design: Design2) -> list[dict]:
    """Every trial of ``design``: (arm × family × instance × seed), each as ``plan.json`` holds it
    (``key``, ``preset``, ``overrides``, ``seed``, and ``arm``, ``landscape`` (the family),
    ``instance``, ``intensity``)."""
    from popgrpo.research.study.plan import Trial, landscape_overrides, landscape_preset

    trials = []
    for family in design.families:
        preset = landscape_preset(LANDSCAPE_PRESET, family)
        for instance in design.instances:
            for arm in design.arms:
                overrides = (
                    *landscape_overrides(family),
                    f"run.epochs={design.epochs}",
                    f"env.peak_seed={instance}",
                    f"grpo.steps_per_epoch={design.steps_per_epoch}",
                    f"eval.discovery_threshold={design.threshold}",
                    *arm_overrides(design, arm, family),
                )
                for seed in design.seeds:
                    labels = {"arm": arm, "landscape": family, "instance": instance}
                    trials.append(
                        {**Trial(preset, overrides, seed).to_json(), **labels, "intensity": design.steps_per_epoch}
                    )
    keys = [t["key"] for t in trials]
    if len(set(keys)) != len(keys):  # two arms that resolve to one config would share a run
        raise ValueError("two trials of the design resolve to the same config")
    return trials


def code_commit() -> str:
    """The commit of the code that builds the plan (``+dirty`` when the tree has changes; ``unknown``
    outside a git checkout)."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def design_plan(study: str, design: Design2, sha: str | None, quick: bool, seeds, epochs, landscape: str) -> dict:
    """plan.json of ``design`` (``sha``: its pre-registration's hash) with ``--quick``, ``--seeds`` and
    ``--epochs`` applied; every arm checked (:func:`check_arms`); the code commit and start time."""
    from popgrpo.research.study.plan import design_with_options

    confirmatory = design.phase == "confirmatory"
    tuning_seeds = load_tuning().seeds if confirmatory else ()
    design = design_with_options(
        study, design, quick_design, (quick, seeds, epochs, landscape), tuning_seeds, confirmatory
    )
    check_arms(design)
    return {
        "study": study,
        "quick": quick,
        "landscape": "both",  # run.reproduce: a plan over several landscapes
        "epochs": design.epochs,
        "design": design.to_json(),
        "preregistration_sha256": sha,
        "commit": code_commit(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "trials": build_plan(design),
    }


def discovery2_tuning_plan(study, quick, seeds, epochs, landscape, model) -> dict:
    """plan.json of ``--study discovery2-tuning`` (a StudyKind's ``plan``)."""
    del model
    return design_plan(study, load_tuning(), None, quick, seeds, epochs, landscape)


def discovery2_plan(study, quick, seeds, epochs, landscape, model) -> dict:
    """plan.json of ``--study discovery2``, the pre-registered confirmatory design."""
    del model
    design, sha = load_preregistration()
    return design_plan(study, design, sha, quick, seeds, epochs, landscape)
