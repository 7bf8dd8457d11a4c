"""A member's reward source from an RM directory: single RM, ENS or WARM (``reward.*`` in the config).

The proxy scores what the archive stores for each idea (``features``: the idea, or a completion's
sentence embedding). The execution reward is still drawn for the same ideas, with the member's
generator, and returned as the **control** reward: the member logs it (metrics
``control_reward_*``) but never trains on it, so reward hacking — the proxy rising while the
control falls — is visible in every run.

Executing every idea for the control costs what the proxy was meant to save. With
``reward.proxy.control_fraction`` = f < 1 each step executes only ``max(1, round(f·N))`` of its
``N`` ideas, drawn uniformly from the member's generator (seeded: same seed, same subset); the
others' control is NaN, so ``control_reward_*`` are estimates on that subset and the metrics
column ``control_share`` says how large it was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from popgrpo.algorithms.rollouts import EnvironmentReward, Rewards, RewardSource
from popgrpo.core.reward_model import RewardModel, ensemble_scores, weight_average
from popgrpo.registry import POLICIES, PROXY_COMBINES, TEXT_IDEAS, ideas_of
from popgrpo.reward_models.store import RMDirError, build_model, load_manifest, load_states

__all__ = [
    "ProxyReward",
    "check_proxy",
    "ens_models",
    "load_proxy_models",
    "proxy_reward_source",
    "single_models",
    "warm_models",
]


def load_proxy_models(
    rm_dir: str | Path, combine: str, n_models: int | None = None, index: int = 0
) -> list[RewardModel]:
    """The RMs whose scores make the proxy, as ``combine`` (a name in
    :data:`popgrpo.registry.PROXY_COMBINES`) says: :func:`single_models`, :func:`ens_models`,
    :func:`warm_models` or a plugin's. Raises :class:`RMDirError`."""
    return PROXY_COMBINES.get(combine)(rm_dir, n_models, index)


def single_models(rm_dir: str | Path, n_models: int | None = None, index: int = 0) -> list[RewardModel]:
    """``combine=single``: RM number ``index`` alone."""
    del n_models
    manifest = load_manifest(rm_dir)
    files = [m["file"] for m in manifest["models"]]
    if index >= len(files):
        raise RMDirError(f"reward.proxy.index={index}: the RM directory {rm_dir} holds {len(files)} RMs")
    return [build_model(manifest, load_states(rm_dir, [files[index]])[0])]


def _first_states(rm_dir: str | Path, n_models: int | None) -> tuple[dict, list[dict]]:
    """The manifest and the state dicts of the first ``n_models`` RMs (None: all)."""
    manifest = load_manifest(rm_dir)
    files = [m["file"] for m in manifest["models"]]
    n = len(files) if n_models is None else n_models
    if n > len(files):
        raise RMDirError(f"reward.proxy.n_models={n}: the RM directory {rm_dir} holds {len(files)} RMs")
    return manifest, load_states(rm_dir, files[:n])


def ens_models(rm_dir: str | Path, n_models: int | None = None, index: int = 0) -> list[RewardModel]:
    """``combine=ens``: the first ``n_models`` RMs, whose scores are averaged (prediction ensembling)."""
    del index
    manifest, states = _first_states(rm_dir, n_models)
    return [build_model(manifest, s) for s in states]


def warm_models(rm_dir: str | Path, n_models: int | None = None, index: int = 0) -> list[RewardModel]:
    """``combine=warm``: one RM, the weight average of the first ``n_models`` (WARM)."""
    del index
    manifest, states = _first_states(rm_dir, n_models)
    return [build_model(manifest, weight_average(states))]


class ProxyReward:
    """``(samples, features, generator) → Rewards``: the proxy's scores, the execution reward as control.

    Args:
        models: the RMs; their scores are averaged (one model: its scores).
        execution: the environment's reward source, drawn for the control; with
            ``control_fraction`` < 1 it is called with ``select=`` the indices of the ideas to
            execute (:meth:`popgrpo.algorithms.rollouts.Rollouts.environment_reward`). None
            for a proxy that only :meth:`scores` (best-of-N selection); calling it then raises.
        control_fraction: share of each step's ideas executed for the control (module docstring).
    """

    def __init__(
        self, models: Sequence[RewardModel], execution: EnvironmentReward | None, control_fraction: float = 1.0
    ) -> None:
        if not 0.0 < control_fraction <= 1.0:
            raise ValueError(f"control_fraction must lie in (0, 1], got {control_fraction}")
        self.models = [m.eval().requires_grad_(False) for m in models]
        self.execution = execution
        self.control_fraction = control_fraction

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """``[N, e]`` features → ``[N]`` proxy scores."""
        with torch.no_grad():
            return ensemble_scores([m(features.float()) for m in self.models]).float()

    def control_subset(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``[k]`` sorted indices of the ideas whose control is drawn, ``k = max(1, round(f·n))``."""
        k = max(1, round(self.control_fraction * n))
        return torch.randperm(n, generator=generator)[:k].sort().values

    def __call__(self, samples, features: torch.Tensor, generator: torch.Generator) -> Rewards:
        execution = self.execution
        if execution is None:
            raise ValueError("this ProxyReward only scores: it was built without an execution reward for the control")
        if self.control_fraction >= 1.0:
            control = execution(samples, features, generator)
            return Rewards(
                self.scores(features),
                control.reasons,
                control=control.values,
                expected=control.expected,
                success=control.success,
            )
        select = self.control_subset(features.shape[0], generator)
        part = execution(samples, features, generator, select=select)
        values = torch.full((features.shape[0],), math.nan, dtype=torch.float32)
        values[select] = part.values.float()
        success = None
        if part.success is not None:  # known for the executed ideas only
            success = torch.full((features.shape[0],), math.nan, dtype=torch.float32)
            success[select] = part.success.float()
        return Rewards(self.scores(features), part.reasons, control=values, expected=part.expected, success=success)


def check_proxy(config) -> None:
    """Raise :class:`RMDirError` when ``config``'s proxy cannot be built (run before anything starts)."""
    if config.reward.source != "proxy":
        return
    proxy = config.reward.proxy
    manifest = load_manifest(proxy.dir)
    models = load_proxy_models(proxy.dir, proxy.combine, proxy.n_models, proxy.index)
    del models
    features = manifest.get("features", "idea")
    text = ideas_of(POLICIES, config.policy.kind) == TEXT_IDEAS
    wanted = f"embedding:{config.env.text.embedding_model}" if text else "idea"
    if features != wanted:
        raise RMDirError(f"RM directory {proxy.dir}: its RMs score {features}; this run's members need {wanted}")
    if features == "idea" and manifest["in_dim"] != config.env.dim:
        raise RMDirError(
            f"RM directory {proxy.dir}: its RMs score {manifest['in_dim']}-d ideas, env.dim is {config.env.dim}"
        )


def proxy_reward_source(config, execution: EnvironmentReward) -> RewardSource:
    """``reward.source=proxy``: a :class:`ProxyReward` over the execution reward (its control)."""
    proxy = config.reward.proxy
    models = load_proxy_models(proxy.dir, proxy.combine, proxy.n_models, proxy.index)
    return ProxyReward(models, execution, proxy.control_fraction)
