"""Held-out evaluation of weights, in the driver: pass@k and best@k (WiSE-FT §3.1), reward, diversity.

The scheduler evaluates weights that no member holds: greedy soup's candidate soups and the
merged model of each round. Only the top-M weights ever reach the driver, so this runs on
them there: a scratch policy loads the weights, samples ``eval.samples`` ideas for each of the
``policy.n_prompts`` prompts, and the environment rewards them. Draws come from a dedicated
stream keyed by (round, purpose), never from a member's stream, so evaluating changes no
training number; every candidate of one round sees the same draws (common random numbers),
so greedy soup compares soups, not noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from popgrpo.config import Config, EvalConfig
from popgrpo.core.metrics import group_pass_best_at_k, pairwise_diversity
from popgrpo.core.seeding import STREAM_EVAL, torch_generator
from popgrpo.core.selection import pop_score
from popgrpo.envs import Environment, make_env
from popgrpo.policies import Policy, make_policy

__all__ = ["PURPOSE_GREEDY", "PURPOSE_MERGED", "WeightsEvaluator", "evaluate_lm_weights", "evaluate_weights"]

PURPOSE_GREEDY = 0  # greedy soup's held-out score of each candidate
PURPOSE_MERGED = 1  # the merged model's reported pass@k / best@k (draws greedy soup never saw)


@torch.no_grad()
def evaluate_weights(
    weights: Mapping[str, torch.Tensor], policy: Policy, env: Environment, cfg: EvalConfig, generator: torch.Generator
) -> dict:
    """Load ``weights`` into ``policy`` (scratch), sample and reward ``[P, n]`` ideas; return metrics.

    ``n = cfg.samples`` ideas per prompt, each prompt one "problem" of WiSE-FT §3.1. An idea
    succeeds when its reward is ``>= cfg.success_threshold``. Returns ``n, k, threshold``;
    ``pass_at_1``, ``pass_at_k`` and ``best_at_k`` (unbiased per prompt, averaged over prompts:
    :func:`~popgrpo.core.metrics.group_pass_best_at_k`); ``reward_mean`` and ``reward_max``
    over all ideas, ``diversity`` (mean pairwise cosine distance of all ideas) and
    ``pop_score = diversity · (1 + reward_max)``. NaN/inf rewards are left out.
    """
    policy.load_state_dict(dict(weights))
    prompts = torch.arange(policy.n_prompts)
    ideas = policy.sample(prompts, cfg.samples, generator)  # [P, n, d]
    flat = ideas.reshape(-1, ideas.shape[-1]).cpu()
    rewards = env.reward(flat, generator).reshape(ideas.shape[0], ideas.shape[1]).to(torch.float64)
    return _metrics(rewards, flat, cfg)


def _metrics(rewards: torch.Tensor, flat: torch.Tensor, cfg: EvalConfig) -> dict:
    """pass@1/k, best@k, reward, diversity and pop score of ``rewards [P, n]`` for ideas ``flat [P·n, d]``."""
    pass_1, _ = group_pass_best_at_k(rewards, cfg.success_threshold, 1)
    pass_k, best_k = group_pass_best_at_k(rewards, cfg.success_threshold, cfg.k)
    good = rewards[torch.isfinite(rewards)]
    reward_mean = float(good.mean()) if good.numel() else math.nan
    reward_max = float(good.max()) if good.numel() else math.nan
    diversity = pairwise_diversity(flat)
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


@torch.no_grad()
def evaluate_lm_weights(
    weights: Mapping[str, torch.Tensor], policy, env, cfg: EvalConfig, generator: torch.Generator
) -> dict:
    """:func:`evaluate_weights` for a language model: ``weights`` are LoRA adapters loaded into
    ``policy`` (a :class:`~popgrpo.policies.causal_lm.CausalLMPolicy`), each of the text
    environment's prompts is one problem with ``cfg.samples`` completions, and diversity is the
    mean pairwise cosine distance of the completions' embeddings."""
    policy.load_state_dict(dict(weights))
    rollout = policy.rollout(env.prompts, cfg.samples, generator)
    prompt_of = [p for p in env.prompts for _ in range(cfg.samples)]
    rewards, _ = env.reward(prompt_of, rollout.completions)
    return _metrics(rewards.reshape(len(env.prompts), cfg.samples).double(), env.embed(rollout.completions), cfg)


class WeightsEvaluator:
    """The driver's evaluator: one environment and one scratch CPU policy for the whole run.

    ``evaluator(weights, round_index, purpose)`` runs :func:`evaluate_weights` with the stream
    ``(run.seed, STREAM_EVAL, round_index, purpose)``, created afresh for every call.
    """

    def __init__(self, config: Config, env: Environment | None = None) -> None:
        self.config = config
        self.env = env if env is not None else make_env(config.env)
        # A fixed generator: the initial values are overwritten by every evaluation's weights,
        # and the global torch RNG stays untouched. A language model is loaded here, on the CPU.
        self.is_lm = config.policy.kind == "causal_lm"
        idea_dim = 0 if self.is_lm else self.env.idea_dim
        self.policy = make_policy(config.policy, idea_dim, torch.Generator().manual_seed(0))

    def __call__(self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int) -> dict:
        generator = torch_generator(self.config.run.seed, STREAM_EVAL, round_index, purpose)
        evaluate = evaluate_lm_weights if self.is_lm else evaluate_weights
        return evaluate(weights, self.policy, self.env, self.config.eval, generator)
