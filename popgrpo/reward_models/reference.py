"""The reference policy of the reward-model studies: its run config (:func:`load_base`) and
best-of-N re-ranking of its ideas by a proxy (:func:`best_of_n_curve`, ``popgrpo rm bon``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from popgrpo.config import ConfigError

if TYPE_CHECKING:
    from popgrpo.config import Config
    from popgrpo.reward_models.config import RMTrainConfig

__all__ = ["best_of_n_curve", "load_base"]


def load_base(rm_cfg: RMTrainConfig) -> Config:
    """The run config whose environment and initial policy are the reference policy: a Gaussian
    policy in the idea environment, or a causal LM in the text environment."""
    from popgrpo.config import load_config, resolve_config_path

    base = load_config(resolve_config_path(rm_cfg.base), [f"run.seed={rm_cfg.seed}"])
    if (base.env.kind, base.policy.kind) not in (("idea", "gaussian"), ("text", "causal_lm")):
        raise ConfigError(
            f"base: {rm_cfg.base} is a {base.env.kind}/{base.policy.kind} config; `rm train` builds preference "
            "data in the idea environment (env.kind=idea, policy.kind=gaussian) or the text environment "
            "(env.kind=text, policy.kind=causal_lm)"
        )
    return base


def best_of_n_curve(
    rm_dir: str | Path, combine: str, n_models: int | None, ns: list[int], groups: int, seed: int, index: int = 0
) -> list[dict]:
    """Best-of-N by a proxy over the reference policy's ideas: per N, the control reward
    (noise-free expected reward) of the chosen idea, mean over ``groups`` draws, and KL ≈ log N − (N−1)/N."""

    from popgrpo.core.reward_model import best_of_n, best_of_n_kl
    from popgrpo.core.seeding import torch_generator
    from popgrpo.envs.idea import IdeaEnv
    from popgrpo.reward_models.config import RMTrainConfig
    from popgrpo.reward_models.data import STREAM_RM, policy_ideas
    from popgrpo.reward_models.proxy import ProxyReward, load_proxy_models
    from popgrpo.reward_models.store import RMDirError, load_manifest

    manifest = load_manifest(rm_dir)
    if manifest.get("features", "idea") != "idea":
        raise RMDirError(
            f"RM directory {rm_dir}: its RMs score {manifest['features']}; best-of-N reads the idea "
            "environment's noise-free expected reward, so it needs RMs over ideas"
        )
    base = load_base(RMTrainConfig.model_validate(manifest["config"]))
    proxy = ProxyReward(load_proxy_models(rm_dir, combine, n_models, index), execution=None)
    env = IdeaEnv(base.env)
    n_max = max(ns)
    ideas = policy_ideas(base, None, groups * n_max, torch_generator(seed, STREAM_RM, 20))
    scores = proxy.scores(ideas).reshape(groups, n_max)
    expected = env.expected_reward(ideas).reshape(groups, n_max)
    out = []
    for n in ns:
        chosen = best_of_n(scores[:, :n], expected[:, :n])
        out.append(
            {
                "n": n,
                "kl": best_of_n_kl(n),
                "control": float(chosen.mean()),
                "control_se": float(chosen.std() / groups**0.5),
            }
        )
    return out
