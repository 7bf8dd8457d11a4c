"""A member's reward source from an RM directory: single RM, ENS or WARM (``reward.*`` in the config).

The proxy scores what the archive stores for each idea (``flat``: the idea, or a completion's
sentence embedding). The execution reward is still drawn for the same ideas, with the member's
generator, and returned as the **control** reward: the member logs it (metrics
``control_reward_*``) but never trains on it, so reward hacking — the proxy rising while the
control falls — is visible in every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from popgrpo.algorithms.rollouts import Rewards, RewardSource
from popgrpo.core.reward_model import RewardModel, ensemble_scores, weight_average
from popgrpo.reward_models.store import RMDirError, build_model, load_manifest, load_states

__all__ = ["ProxyReward", "check_proxy", "load_proxy_models", "make_reward_source"]


def load_proxy_models(
    rm_dir: str | Path, combine: str, n_models: int | None = None, index: int = 0
) -> list[RewardModel]:
    """The RMs whose scores make the proxy: one for ``single`` and ``warm`` (the weight average of
    the first ``n_models``), the first ``n_models`` for ``ens``. Raises :class:`RMDirError`."""
    manifest = load_manifest(rm_dir)
    files = [m["file"] for m in manifest["models"]]
    if combine == "single":
        if index >= len(files):
            raise RMDirError(f"reward.proxy.index={index}: the RM directory {rm_dir} holds {len(files)} RMs")
        return [build_model(manifest, load_states(rm_dir, [files[index]])[0])]
    n = len(files) if n_models is None else n_models
    if n > len(files):
        raise RMDirError(f"reward.proxy.n_models={n}: the RM directory {rm_dir} holds {len(files)} RMs")
    states = load_states(rm_dir, files[:n])
    if combine == "warm":
        return [build_model(manifest, weight_average(states))]
    if combine == "ens":
        return [build_model(manifest, s) for s in states]
    raise ValueError(f"unknown combine {combine!r}")


class ProxyReward:
    """``(samples, flat, generator) → Rewards``: the proxy's scores, the execution reward as control.

    Args:
        models: the RMs; their scores are averaged (one model: its scores).
        execution: the environment's reward source, drawn for the control.
    """

    def __init__(self, models: Sequence[RewardModel], execution: RewardSource) -> None:
        self.models = [m.eval().requires_grad_(False) for m in models]
        self.execution = execution

    def scores(self, flat: torch.Tensor) -> torch.Tensor:
        """``[N, e]`` → ``[N]`` proxy scores."""
        with torch.no_grad():
            return ensemble_scores([m(flat.float()) for m in self.models]).float()

    def __call__(self, samples, flat: torch.Tensor, generator: torch.Generator) -> Rewards:
        control = self.execution(samples, flat, generator)
        return Rewards(self.scores(flat), control.reasons, control=control.values, success=control.success)


def check_proxy(config) -> None:
    """Raise :class:`RMDirError` when ``config``'s proxy cannot be built (run before anything starts)."""
    if config.reward.source != "proxy":
        return
    proxy = config.reward.proxy
    manifest = load_manifest(proxy.dir)
    models = load_proxy_models(proxy.dir, proxy.combine, proxy.n_models, proxy.index)
    if config.policy.kind == "gaussian" and manifest["in_dim"] != config.env.dim:
        raise RMDirError(
            f"RM directory {proxy.dir}: its RMs score {manifest['in_dim']}-d ideas, env.dim is {config.env.dim}"
        )
    del models


def make_reward_source(config, execution: RewardSource) -> RewardSource:
    """What ``config.reward.source`` names: ``execution`` itself, or a :class:`ProxyReward` over it."""
    if config.reward.source == "execution":
        return execution
    proxy = config.reward.proxy
    return ProxyReward(load_proxy_models(proxy.dir, proxy.combine, proxy.n_models, proxy.index), execution)
