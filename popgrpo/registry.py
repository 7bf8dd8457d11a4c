"""The named choices of a run's config, open to plugins.

Every config field that names an implementation (``env.kind``, ``env.landscape``, ``policy.kind``,
``reward.source``, ``run.loggers``, ``scheduler.merge``, ``scheduler.mutate``,
``scheduler.objectives``, ``scheduler.population``, ``reward.proxy.combine``,
``policy.causal_lm.rollout.engine``, ``explore.advantage``, ``explore.policy_loss``) takes its allowed values from a
:class:`Registry` below. The config validates a name against it when it loads (an unknown
name is a :class:`~popgrpo.config.ConfigError` listing the choices); the code that builds the
thing asks :meth:`Registry.get` for it.

A registry maps a name to an object, or to a ``"module:attr"`` string that is imported on the
first :meth:`~Registry.get`. The strings let the config know every built-in name without
importing torch or Ray. Registering a name twice is an error naming both registrations,
unless ``replace=True``.

Plugins: an installed distribution declares an entry point in the group ``popgrpo.plugins``
(``[project.entry-points."popgrpo.plugins"]``) naming a module, imported for the
registrations it makes, or a callable, called with no arguments. They are loaded once, on the
first :meth:`~Registry.names` or :meth:`~Registry.get` of any registry. A plugin that fails to
load warns once and is left out; an unknown-choice error then names it.

The built-ins are registered at the end of this module, through the same ``register`` calls a
plugin makes, not through popgrpo's own entry points: entry-point metadata exists only once
popgrpo is installed and is stale after an edit to an editable install's pyproject, while a
source checkout or ``PYTHONPATH=.`` must still know ``soup``. See docs/guides/extend.md.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar, cast, overload

__all__ = [
    "ADVANTAGES",
    "ENVIRONMENTS",
    "GROUP_TRAINERS",
    "LANDSCAPES",
    "LOGGERS",
    "MERGES",
    "MUTATIONS",
    "PLUGIN_GROUP",
    "POLICIES",
    "POLICY_LOSSES",
    "POPULATION_STEPS",
    "PROXY_COMBINES",
    "REGISTRIES",
    "REWARD_SOURCES",
    "ROLLOUT_ENGINES",
    "SELECTION_STATISTICS",
    "STUDIES",
    "STUDY_LANDSCAPES",
    "TEXT_IDEAS",
    "VECTOR_IDEAS",
    "DuplicateChoice",
    "MetricColumn",
    "Registry",
    "UnknownChoice",
    "failed_plugins",
    "ideas_of",
    "load_plugins",
]

T = TypeVar("T")
VECTOR_IDEAS, TEXT_IDEAS = "vector", "text"  # the values of the ``ideas`` trait (Registry.trait)
_SHOWN_CHARS = 80  # of an unknown name, in the error that names it
PLUGIN_GROUP = "popgrpo.plugins"


class UnknownChoice(ValueError):
    """A name no entry of a registry answers to; the message lists the choices."""


class DuplicateChoice(ValueError):
    """A second registration of a name (without ``replace=True``)."""


@dataclass(frozen=True)
class _Entry:
    target: object  # the registered object, or a "module:attr" string imported on first use
    origin: str  # where it came from: "module:attr", plus the plugin that registered it
    builtin: bool
    traits: Mapping[str, str] = field(default_factory=dict)  # light facts, read without importing target


@dataclass
class _Loading:
    """Who is registering now, and what plugin loading has done (one per process)."""

    builtin: bool = True  # the built-ins at the end of this module are registering
    plugin: str | None = None  # the plugin entry point being loaded
    loaded: bool = False  # plugins loaded (or being loaded)
    failed: list[str] = field(default_factory=list)  # the plugins that raised


_state = _Loading()


class Registry(Generic[T]):
    """Names → implementations of one kind of choice (``kind``), backing config ``field``.

    Args:
        kind: what the entries are, for messages (``"environment"``).
        field: the config field(s) whose values name entries (``"env.kind"``).
        protocol: what an entry must be, for docs and messages.
    """

    def __init__(self, kind: str, field: str, protocol: str) -> None:
        self.kind, self.field, self.protocol = kind, field, protocol
        self._entries: dict[str, _Entry] = {}
        self._resolved: dict[str, T] = {}

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.field!r}, {sorted(self._entries)})"

    @overload
    def register(self, name: str, obj: None = None, *, replace: bool = False, **traits: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, obj: T | str, *, replace: bool = False, **traits: str) -> T | str: ...
    def register(self, name: str, obj: T | str | None = None, *, replace: bool = False, **traits: str) -> Any:
        """Register ``obj`` (or a lazy ``"module:attr"``) under ``name``; without ``obj``, a decorator.

        ``traits`` are string facts about the entry that the config reads without importing it
        (:meth:`trait`): e.g. ``ideas="text"`` for a policy or environment of completions.

        Raises:
            DuplicateChoice: ``name`` is registered already and ``replace`` is false.
        """
        if obj is None:

            def decorator(target: T) -> T:
                self.register(name, target, replace=replace, **traits)
                return target

            return decorator
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} names are non-empty strings, got {name!r}")
        if isinstance(obj, str) and obj.count(":") != 1:
            raise ValueError(f"{self.kind} {name!r}: a lazy target is 'module:attr', got {obj!r}")
        entry = _Entry(obj, _origin(obj), _state.builtin, dict(traits))
        old = self._entries.get(name)
        if old is not None and not replace:
            raise DuplicateChoice(
                f"{self.field}: {self.kind} {name!r} is registered twice: first by {old.origin}, "
                f"then by {entry.origin} (pass replace=True to override it)"
            )
        self._entries[name] = entry
        self._resolved.pop(name, None)
        return obj

    def names(self) -> list[str]:
        """Every registered name, sorted (plugins loaded first)."""
        load_plugins()
        return sorted(self._entries)

    def builtin_names(self) -> list[str]:
        """The names popgrpo itself registers, in registration order (no plugins loaded)."""
        return [n for n, e in self._entries.items() if e.builtin]

    def origin(self, name: str) -> str:
        """Where ``name``'s entry comes from (``"module:attr"``, and the plugin)."""
        self.check(name)
        return self._entries[name].origin

    def trait(self, name: str, trait: str, default: str) -> str:
        """The ``trait`` ``name`` was registered with, else ``default`` (the target is not imported)."""
        self.check(name)
        return self._entries[name].traits.get(trait, default)

    def check(self, name: str) -> str:
        """``name`` itself when registered; else :class:`UnknownChoice` (what the config validates with)."""
        load_plugins()
        if name not in self._entries:
            raise self.unknown(name)
        return name

    def get(self, name: str) -> T:
        """The implementation registered as ``name``, importing a lazy target now.

        Raises:
            UnknownChoice: no entry is called ``name``; the message names the field, close
                matches and every choice.
        """
        self.check(name)
        if name not in self._resolved:
            target = self._entries[name].target
            if isinstance(target, str):
                module, _, attr = target.partition(":")
                target = getattr(importlib.import_module(module), attr)
            self._resolved[name] = cast(T, target)
        return self._resolved[name]

    def unknown(self, name: object) -> UnknownChoice:
        """The error for a name that is not registered (one line)."""
        choices = sorted(self._entries)
        # A config is hostile input: a huge value neither floods the one-line message nor
        # costs difflib's quadratic time.
        close = (
            difflib.get_close_matches(name, choices, n=3) if isinstance(name, str) and len(name) <= _SHOWN_CHARS else []
        )
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        shown = repr(name)
        if len(shown) > _SHOWN_CHARS:
            shown = shown[: _SHOWN_CHARS - 3] + "..."
        text = f"{self.field}: unknown {self.kind} {shown}{hint}; choices: {', '.join(choices)}"
        if _state.failed:
            text += f" (plugins that failed to load: {'; '.join(_state.failed)})"
        return UnknownChoice(text)

    # Mapping-like reads, so a registry can stand where a dict of choices stood.
    def __contains__(self, name: object) -> bool:
        load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        load_plugins()
        return len(self._entries)

    def __getitem__(self, name: str) -> T:
        return self.get(name)


def _origin(obj: object) -> str:
    where = obj if isinstance(obj, str) else f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', obj)}"
    return f"{where} (plugin {_state.plugin})" if _state.plugin else where


# ---- plugins ----------------------------------------------------------------------------------
def load_plugins() -> None:
    """Load every ``popgrpo.plugins`` entry point once (later calls return at once).

    A plugin that raises is skipped with one :class:`RuntimeWarning` naming it and the error;
    :func:`failed_plugins` lists them, and unknown-choice errors mention them.
    """
    if _state.loaded:
        return
    _state.loaded = True  # before loading: a plugin that asks for names() must not recurse
    _state.builtin = False
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: (e.name, e.value)):
        label = f"{ep.dist.name if ep.dist else '?'}:{ep.name} = {ep.value}"
        _state.plugin = label
        try:
            loaded = ep.load()
            if ep.attr is not None and callable(loaded):
                loaded()
        except Exception as error:  # a broken plugin must not break popgrpo
            message = f"{label} ({type(error).__name__}: {error})".replace("\n", " ")
            _state.failed.append(message)
            warnings.warn(f"popgrpo plugin failed to load: {message}", RuntimeWarning, stacklevel=2)
        finally:
            _state.plugin = None


def failed_plugins() -> list[str]:
    """``"dist:entry-point = target (Error: message)"`` of each plugin that failed to load."""
    load_plugins()
    return list(_state.failed)


# ---- the registries ---------------------------------------------------------------------------
ENVIRONMENTS: Registry[Callable[..., Any]] = Registry(
    "environment", "env.kind", "(env: EnvConfig, device) -> Environment | TextEnvironment"
)
LANDSCAPES: Registry[Callable[..., Any]] = Registry(
    "landscape family", "env.landscape", "(env: EnvConfig) -> Peaks (popgrpo.envs.landscapes)"
)
POLICIES: Registry[Callable[..., Any]] = Registry(
    "policy",
    "policy.kind",
    "(policy: PolicyConfig, idea_dim: int, generator: torch.Generator | None) -> Policy; a PolicyKind "
    "(popgrpo.algorithms.policy_kinds) also says how its members sample, start and train together",
)
REWARD_SOURCES: Registry[Callable[..., Any]] = Registry(
    "reward source", "reward.source", "(config: Config, execution: RewardSource) -> RewardSource"
)
LOGGERS: Registry[Callable[..., Any]] = Registry(
    "logger", "run.loggers", "(run_dir: Path, config: Config, resume_epoch: int | None) -> RunLogger"
)
MERGES: Registry[Callable[..., Any]] = Registry(
    "merge", "scheduler.merge", "(inputs: MergeInputs) -> (merged weights, lineage description)"
)
MUTATIONS: Registry[Callable[..., Any]] = Registry(
    "mutation", "scheduler.mutate", "(scheduler: SchedulerConfig) -> (WeightMutation | None, lineage description)"
)
POPULATION_STEPS: Registry[Callable[..., Any]] = Registry(
    "population mechanism", "scheduler.population", "(inputs: PopulationInputs) -> PopulationDecision"
)
SELECTION_STATISTICS: Registry[Callable[[Sequence[Mapping[str, float]]], list[float]]] = Registry(
    "selection statistic", "scheduler.objectives", "(rows: one metrics row per member) -> one score per member"
)
PROXY_COMBINES: Registry[Callable[..., Any]] = Registry(
    "proxy combine", "reward.proxy.combine", "(rm_dir, n_models: int | None, index: int) -> list[RewardModel]"
)
ROLLOUT_ENGINES: Registry[Callable[..., Any]] = Registry(
    "rollout engine",
    "policy.causal_lm.rollout.engine",
    "(cfg: CausalLMConfig, device: torch.device) -> RolloutEngine (popgrpo.policies.engines)",
)
ADVANTAGES: Registry[Callable[..., Any]] = Registry(
    "advantage estimator",
    "explore.advantage",
    "(returns: [P, g] one group's or bin's shaped returns, config: Config) -> [P, g] advantages",
)
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry(
    "policy loss",
    "explore.policy_loss",
    "(logp, old_logp, advantages, mask, config: Config, generator) -> per-token (per-idea) loss terms, reduced by the member",
)
# Not a config field's choices: the name a PolicyKind gives for how one actor's members train
# together (popgrpo.algorithms.policy_kinds.PolicyKind.trainer).
GROUP_TRAINERS: Registry[Callable[..., Any]] = Registry(
    "group trainer", "PolicyKind.trainer", "(members: Sequence[Member]) -> GroupTrainer (train_epochs)"
)
# Not a config field's choices: the studies `popgrpo reproduce --study` runs and `popgrpo report`
# redraws (popgrpo.research.study.kinds.StudyKind).
STUDIES: Registry[Any] = Registry(
    "study", "popgrpo reproduce --study", "StudyKind (popgrpo.research.study.kinds): plan, default --out, report"
)
# Not a config field's choices: the landscapes a study runs its methods on (`--landscape`,
# a discovery design's landscapes; popgrpo.research.study.discovery_landscapes.StudyLandscape).
STUDY_LANDSCAPES: Registry[Any] = Registry(
    "study landscape",
    "a study's landscapes",
    "StudyLandscape (popgrpo.research.study.discovery_landscapes): preset, overrides",
)
REGISTRIES: tuple[Registry[Any], ...] = (
    ENVIRONMENTS,
    LANDSCAPES,
    POLICIES,
    REWARD_SOURCES,
    LOGGERS,
    MERGES,
    MUTATIONS,
    POPULATION_STEPS,
    SELECTION_STATISTICS,
    PROXY_COMBINES,
    ROLLOUT_ENGINES,
    ADVANTAGES,
    POLICY_LOSSES,
)


def ideas_of(registry: Registry[Any], name: str) -> str:
    """What the ``registry`` entry ``name`` samples or scores: :data:`VECTOR_IDEAS` (the default) or :data:`TEXT_IDEAS`."""
    return registry.trait(name, "ideas", VECTOR_IDEAS)


@dataclass(frozen=True)
class MetricColumn:
    """A selection statistic read from the members' metrics rows as it is (higher is better)."""

    column: str

    def __call__(self, rows: Sequence[Mapping[str, float]]) -> list[float]:
        return [float(r[self.column]) for r in rows]


def _execution_reward(config: object, execution: T) -> T:
    """``reward.source=execution``: the members train on the environment's own reward."""
    del config
    return execution


# ---- built-ins: registered like any plugin's, with lazy targets for torch-heavy modules --------
ENVIRONMENTS.register("idea", "popgrpo.envs.kinds:IDEA")
# ``ideas``: what a policy samples and an environment scores, "vector" (R^d ideas, the default of
# a plugin's entry) or "text" (completions); a run's policy and environment must agree.
# ``inputs="env.text"``: the kind reads its prompts and reward callables from env.text, so the
# config requires them there.
ENVIRONMENTS.register("text", "popgrpo.envs.kinds:TEXT", ideas=TEXT_IDEAS, inputs="env.text")
ENVIRONMENTS.register("code", "popgrpo.envs.kinds:CODE", ideas=TEXT_IDEAS)
LANDSCAPES.register("peaks", "popgrpo.envs.landscapes:gaussian_peaks")
LANDSCAPES.register("stepping_stones", "popgrpo.envs.landscapes:stepping_stones")
POLICIES.register("gaussian", "popgrpo.algorithms.policy_kinds:GAUSSIAN", ideas=VECTOR_IDEAS)
POLICIES.register("causal_lm", "popgrpo.algorithms.policy_kinds:CAUSAL_LM", ideas=TEXT_IDEAS)
REWARD_SOURCES.register("execution", _execution_reward)
REWARD_SOURCES.register("proxy", "popgrpo.reward_models.proxy:proxy_reward_source")
LOGGERS.register("tensorboard", "popgrpo.telemetry.loggers:tensorboard_logger")
LOGGERS.register("mlflow", "popgrpo.telemetry.loggers:mlflow_logger")
LOGGERS.register("wandb", "popgrpo.telemetry.loggers:wandb_logger")
for _name in ("soup", "weighted_soup", "greedy_soup", "wise_ft", "task_arithmetic"):
    MERGES.register(_name, f"popgrpo.algorithms.merges:{_name}_merge")
MUTATIONS.register("gaussian", "popgrpo.algorithms.merges:gaussian_mutation")
MUTATIONS.register("svd", "popgrpo.algorithms.merges:svd_mutation")
MUTATIONS.register("none", "popgrpo.algorithms.merges:none_mutation")
for _name in ("soup", "soup_svd", "independent", "truncation", "repulsion", "frontier", "islands"):
    POPULATION_STEPS.register(_name, f"popgrpo.algorithms.population:{_name}_step")
# The explore section's choices (popgrpo.algorithms.exploration; docs/MECHANISMS.md).
for _name in ("group", "reinforce"):
    ADVANTAGES.register(_name, f"popgrpo.algorithms.exploration:{_name}_advantage")
# ``subsets="k"``: the estimator takes explore.k-subsets of a group, so k may not exceed its size.
for _name in ("passk", "maxk"):
    ADVANTAGES.register(_name, f"popgrpo.algorithms.exploration:{_name}_advantage", subsets="k")
for _name in ("clip", "clip_cov", "kl_cov"):
    POLICY_LOSSES.register(_name, f"popgrpo.algorithms.exploration:{_name}_loss")
# The main paper's S_k, then columns of the members' metrics rows (popgrpo.columns.METRIC_COLUMNS).
SELECTION_STATISTICS.register("pop_score", "popgrpo.core.selection:pop_scores")
for _name in ("reward_max", "reward_mean", "diversity", "complexity", "entropy", "novelty", "archive_coverage",
              "archive_qd_score", "archive_new", "pass_at_k", "best_at_k"):  # fmt: skip
    SELECTION_STATISTICS.register(_name, MetricColumn(_name))
for _name in ("single", "ens", "warm"):
    PROXY_COMBINES.register(_name, f"popgrpo.reward_models.proxy:{_name}_models")
GROUP_TRAINERS.register("packed", "popgrpo.algorithms.packed:PackedMembers")
GROUP_TRAINERS.register("shared_base", "popgrpo.algorithms.shared_members:SharedBaseMembers")
for _name, _attr in (("paper", "PAPER"), ("warm", "WARM"), ("lm", "LM"), ("discovery", "DISCOVERY"),
                     ("discovery-tuning", "DISCOVERY_TUNING"), ("discovery2", "DISCOVERY2"),
                     ("discovery2-tuning", "DISCOVERY2_TUNING"), ("code-run", "CODE_RUN")):  # fmt: skip
    STUDIES.register(_name, f"popgrpo.research.study.kinds:{_attr}")
for _name, _attr in (("collapse", "COLLAPSE"), ("paper", "PAPER"), ("stepping_stones", "STEPPING_STONES")):
    STUDY_LANDSCAPES.register(_name, f"popgrpo.research.study.discovery_landscapes:{_attr}")
ROLLOUT_ENGINES.register("hf", "popgrpo.policies.engines:hf_engine")
ROLLOUT_ENGINES.register("vllm", "popgrpo.policies.vllm_engine:vllm_engine")
_state.builtin = False
