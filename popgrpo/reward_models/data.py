"""Preference data for reward models, from executed ideas of a reference policy.

The **reference policy** is the initial Gaussian policy of a run config (the policy every
member starts from), sampled at a few temperatures (factors on its standard deviation). Its
ideas are executed in the idea environment (the stochastic reward ``Q·B + ε·B``, a few
times each, averaged) and paired; a pair's label says which idea's executions paid more
(:func:`popgrpo.core.reward_model.make_pairs`). Training pairs come from one half of the
ideas, test pairs from the other; **shifted** pairs come from a policy trained by GRPO (the
distribution an RL policy drifts to). Only training labels are corrupted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from popgrpo.algorithms.rollouts import init_generator
from popgrpo.config import Config
from popgrpo.core.reward_model import PreferencePairs, corrupt_labels, make_pairs
from popgrpo.core.seeding import torch_generator
from popgrpo.envs.idea import IdeaEnv
from popgrpo.policies import make_policy

__all__ = ["STREAM_RM", "build_pairs", "execute", "policy_ideas", "pretraining_set"]

# The RM directory's streams: (STREAM_RM, purpose) from the RM config's seed.
STREAM_RM = 10
PURPOSE_REFERENCE, PURPOSE_PAIRS, PURPOSE_SHIFTED, PURPOSE_PRETRAIN, PURPOSE_CORRUPT = range(5)


def policy_ideas(
    config: Config,
    weights: Mapping[str, torch.Tensor] | None,
    n: int,
    generator: torch.Generator,
    temperatures: Sequence[float] = (1.0,),
) -> torch.Tensor:
    """``n`` ideas ``[n, d]`` of ``config``'s Gaussian policy with ``weights`` (None: its initial
    weights), spread evenly over its prompts and over ``temperatures`` (each a factor on the
    policy's standard deviation, as sampling an LM at several temperatures)."""
    env = IdeaEnv(config.env)
    policy = make_policy(config.policy, env.idea_dim, init_generator(config, 0))
    if weights is not None:
        policy.load_state_dict(dict(weights))
    prompts = torch.arange(config.policy.n_prompts)
    per_prompt = math.ceil(n / (len(prompts) * len(temperatures)))
    with torch.no_grad():
        mean, log_std = policy(prompts)
        ideas = [
            policy.ideas_from_noise(mean, log_std + math.log(t), policy.draw_noise(len(prompts), per_prompt, generator))
            for t in temperatures
        ]
    ideas = torch.cat([i.reshape(-1, env.idea_dim) for i in ideas])
    return ideas[torch.randperm(ideas.shape[0], generator=generator)[:n]].contiguous()


def execute(env: IdeaEnv, ideas: torch.Tensor, executions: int, generator: torch.Generator) -> torch.Tensor:
    """``[N, d]`` → ``[N]``: each idea executed ``executions`` times, its mean reward."""
    return torch.stack([env.reward(ideas, generator) for _ in range(executions)]).mean(0)


def pretraining_set(dim: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Unlabelled ideas of norms spread over 0–12 and the pre-training targets: ``(x [n, d],
    [‖x‖/4, x/‖x‖] [n, d + 1])``. No reward enters: the featurizer learns the geometry of the
    idea space, as a language model's pre-training knows nothing of the preference task."""
    direction = torch.randn(n, dim, generator=generator)
    direction = direction / direction.norm(dim=1, keepdim=True).clamp_min(1e-6)
    norm = 12.0 * torch.rand(n, 1, generator=generator)
    x = direction * norm
    return x, torch.cat([norm / 4.0, direction], dim=1)


def build_pairs(
    config: Config,
    *,
    seed: int,
    reference_ideas: int,
    train_pairs: int,
    test_pairs: int,
    corruption: float,
    executions: int = 1,
    temperatures: Sequence[float] = (1.0,),
    shifted_weights: Mapping[str, torch.Tensor] | None = None,
    shifted_pairs: int = 0,
) -> dict[str, PreferencePairs]:
    """``{"train", "test"[, "shifted"]}`` preference pairs from executed ideas (module docstring);
    ``train`` has ``round(corruption · train_pairs)`` labels swapped."""
    env = IdeaEnv(config.env)
    gen = torch_generator(seed, STREAM_RM, PURPOSE_REFERENCE)
    ideas = policy_ideas(config, None, reference_ideas, gen, temperatures)
    rewards = execute(env, ideas, executions, torch_generator(seed, STREAM_RM, PURPOSE_REFERENCE, 1))
    half = reference_ideas // 2
    pair_gen = torch_generator(seed, STREAM_RM, PURPOSE_PAIRS)
    train = make_pairs(ideas[:half], rewards[:half], train_pairs, pair_gen)
    out = {
        "train": corrupt_labels(train, corruption, torch_generator(seed, STREAM_RM, PURPOSE_CORRUPT)),
        "test": make_pairs(ideas[half:], rewards[half:], test_pairs, pair_gen),
    }
    if shifted_weights is not None and shifted_pairs:
        gen = torch_generator(seed, STREAM_RM, PURPOSE_SHIFTED)
        shifted = policy_ideas(config, shifted_weights, reference_ideas, gen)
        out["shifted"] = make_pairs(shifted, execute(env, shifted, executions, gen), shifted_pairs, gen)
    return out
