"""Configs for tests, built as a run builds them (:func:`popgrpo.config.load_config`).

:func:`pop_grpo` and :func:`grpo` are those presets and :func:`defaults` the defaults (no preset), each with
``--set``-style overrides applied in order, a later one winning. The tuples name the small shapes
that several test files share; a test file names its own shape from them and adds, at each test,
the settings that test is about.
"""

from __future__ import annotations

from popgrpo.config import Config, load_config, preset_path

# Seeded and writing no logs: runs that tests compare number for number.
SEEDED = ("run.seed=42", "run.loggers=[]")

# Two members to a Ray actor at half a CPU each: four members fit the test Ray's 2 CPUs.
RAY_PAIRS = ("population.members_per_actor=2", "population.resources.num_cpus=0.5")

# Rounds of two one-step epochs, the merged weights scored on 8 samples (pass@4).
SHORT_ROUNDS = ("scheduler.interval_epochs=2", "grpo.steps_per_epoch=1", "eval.samples=8", "eval.k=4")

# Four members in pairs on Ray actors, the archive's QD and novelty on, a merge every 2 epochs:
# the shape of the Ray executor's tests, which add the epochs and steps they need.
RAY_POPULATION = (
    "population.size=4",
    *RAY_PAIRS,
    "scheduler.interval_epochs=2",
    "qd.enabled=true",
    "maxent.novelty.enabled=true",
)


def pop_grpo(*overrides: str) -> Config:
    """The ``pop_grpo`` preset with ``overrides``."""
    return load_config(preset_path("pop_grpo"), list(overrides))


def grpo(*overrides: str) -> Config:
    """The ``grpo`` preset with ``overrides``."""
    return load_config(preset_path("grpo"), list(overrides))


def defaults(*overrides: str) -> Config:
    """The defaults (no preset) with ``overrides``."""
    return load_config(None, list(overrides))
