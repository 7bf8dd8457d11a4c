"""Held-out evaluation of weights: pass@k and best@k (WiSE-FT §3.1), reward, diversity.

The scheduler has the executor evaluate weights that no member holds: greedy soup's candidate
soups and the merged model of each round (``Executor.evaluate``: in its own process for the
in-process executor, on the run's evaluator actor on Ray). A scratch policy loads the
weights, samples ``eval.samples`` ideas for each of the ``policy.n_prompts`` prompts, and the
environment rewards them. Draws come from a dedicated
stream keyed by (round, purpose), never from a member's stream, so evaluating changes no
training number; every candidate of one round sees the same draws (common random numbers),
so greedy soup compares soups, not noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from popgrpo.algorithms.policy_kinds import make_rollouts
from popgrpo.algorithms.rollouts import Rollouts
from popgrpo.config import Config, EvalConfig
from popgrpo.core.metrics import group_pass_best_at_k, pairwise_diversity
from popgrpo.core.seeding import STREAM_EVAL, torch_generator
from popgrpo.core.selection import pop_score
from popgrpo.envs import Environment, TextEnvironment

__all__ = ["PURPOSE_GREEDY", "PURPOSE_MERGED", "WeightsEvaluator", "evaluate_weights"]

PURPOSE_GREEDY = 0  # greedy soup's held-out score of each candidate
PURPOSE_MERGED = 1  # the merged model's reported pass@k / best@k (draws greedy soup never saw)


@torch.no_grad()
def evaluate_weights(
    weights: Mapping[str, torch.Tensor], rollouts: Rollouts[Any], cfg: EvalConfig, generator: torch.Generator
) -> dict[str, float]:
    """Load ``weights`` into ``rollouts``' (scratch) policy, sample and reward ``[P, n]`` ideas; return metrics.

    ``n = cfg.samples`` ideas for each of the task's ``P`` prompts (the policy's prompts for
    vector ideas, the text environment's prompts for a language model), each prompt one
    "problem" of WiSE-FT §3.1. An idea succeeds when its reward is ``>= cfg.success_threshold``.
    Returns ``n, k, threshold``; ``pass_at_1``, ``pass_at_k`` and ``best_at_k`` (unbiased per
    prompt, averaged over prompts: :func:`~popgrpo.core.metrics.group_pass_best_at_k`);
    ``reward_mean`` and ``reward_max`` over all ideas, ``diversity`` (mean pairwise cosine
    distance of what the archive would store: the ideas, or the completions' embeddings) and
    ``pop_score = diversity · (1 + reward_max)``. NaN/inf rewards are left out.
    """
    rollouts.policy.load_state_dict(dict(weights))
    samples = rollouts.sample_every_prompt(cfg.samples, generator)
    features, _ = rollouts.describe(samples)
    rewards = rollouts.environment_reward(samples, features, generator).values
    return _metrics(rewards.reshape(samples.n_prompts, samples.group_size).double(), features, cfg)


def _metrics(rewards: torch.Tensor, features: torch.Tensor, cfg: EvalConfig) -> dict[str, float]:
    """pass@1/k, best@k, reward, diversity and pop score of ``rewards [P, n]`` for ideas' ``features [P·n, e]``."""
    pass_1, _ = group_pass_best_at_k(rewards, cfg.success_threshold, 1)
    pass_k, best_k = group_pass_best_at_k(rewards, cfg.success_threshold, cfg.k)
    good = rewards[torch.isfinite(rewards)]
    reward_mean = float(good.mean()) if good.numel() else math.nan
    reward_max = float(good.max()) if good.numel() else math.nan
    diversity = pairwise_diversity(features)
    return {
        "n": cfg.samples,
        "k": cfg.k,
        "threshold": cfg.success_threshold,
        "pass_at_1": pass_1,
        "pass_at_k": pass_k,
        "best_at_k": best_k,
        "reward_mean": reward_mean,
        "reward_max": reward_max,
        "diversity": diversity,
        "pop_score": pop_score(diversity, reward_max),
    }


class WeightsEvaluator:
    """A run's evaluator: one environment and one scratch CPU policy for the whole run.

    ``evaluator(weights, round_index, purpose)`` runs :func:`evaluate_weights` with the stream
    ``(run.seed, STREAM_EVAL, round_index, purpose)``, created afresh for every call.
    """

    def __init__(self, config: Config, env: Environment | TextEnvironment | None = None) -> None:
        self.config = config
        # Scratch rollouts on the CPU (a language model is loaded here): every evaluation
        # overwrites their weights, and the global torch RNG stays untouched.
        self.rollouts = make_rollouts(config, 0, env)
        self.env = self.rollouts.env

    def __call__(self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int) -> dict[str, float]:
        generator = torch_generator(self.config.run.seed, STREAM_EVAL, round_index, purpose)
        return evaluate_weights(weights, self.rollouts, self.config.eval, generator)
