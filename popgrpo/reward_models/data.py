"""Preference data for reward models, from executed outputs of a reference policy.

The **reference policy** is the initial policy of a run config (the policy every member
starts from), sampled at a few temperatures. Its outputs are executed (the environment's
reward, a few times each, averaged) and paired; a pair's label says which output's executions
paid more (:func:`popgrpo.core.reward_model.make_pairs`). Training pairs come from one half of
the outputs, test pairs from the other; **shifted** pairs come from a policy trained by GRPO
(the distribution an RL policy drifts to). Only training labels are corrupted.

What an RM scores is what the archive stores for an output, and two :class:`ReferenceData`
say how to get it, behind the one :func:`build_pairs`:

* :class:`IdeaReference` (``env.kind=idea``, Gaussian policy): the idea ``x ∈ R^d`` itself,
  sampled at factors on the policy's standard deviation, executed in ``IdeaEnv``; the
  featurizer pre-trains on the geometry of the idea space (each idea's norm and direction).
* :class:`TextReference` (``env.kind=text``, causal LM): the sentence embedding the text
  environment computes for a completion, sampled at factors on the LM's sampling temperature,
  executed by the environment's reward callables; the featurizer pre-trains on reconstructing
  the embeddings of further, never executed, completions (an auto-encoder: reward-free).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from popgrpo.algorithms.rollouts import init_generator
from popgrpo.config import Config
from popgrpo.core.reward_model import PreferencePairs, corrupt_labels, make_pairs
from popgrpo.core.seeding import torch_generator
from popgrpo.envs import TextEnvironment, make_env
from popgrpo.envs.idea import IdeaEnv
from popgrpo.policies import make_policy
from popgrpo.policies.gaussian import PromptGaussianPolicy
from popgrpo.registry import POLICIES, TEXT_IDEAS, ideas_of

__all__ = [
    "STREAM_RM",
    "IdeaReference",
    "ReferenceData",
    "TextReference",
    "build_pairs",
    "execute",
    "policy_ideas",
    "pretraining_set",
    "reference_data",
]

# The RM directory's streams: (STREAM_RM, purpose) from the RM config's seed.
STREAM_RM = 10
PURPOSE_REFERENCE, PURPOSE_PAIRS, PURPOSE_SHIFTED, PURPOSE_PRETRAIN, PURPOSE_CORRUPT = range(5)


class ReferenceData(Protocol):
    """A reference policy's outputs, their executed rewards, and the features an RM scores."""

    features: str  # what the RMs score, recorded in the manifest: "idea" or "embedding:<model>"

    def sample(
        self,
        weights: Mapping[str, torch.Tensor] | None,
        n: int,
        generator: torch.Generator,
        temperatures: Sequence[float] = (1.0,),
    ) -> tuple[Any, torch.Tensor]:
        """``n`` outputs of the policy with ``weights`` (None: its initial weights), spread evenly
        over its prompts and ``temperatures``, shuffled: ``(outputs, features [n, e])``."""
        ...

    def execute(self, outputs: Any, executions: int, generator: torch.Generator) -> torch.Tensor:
        """``[n]``: each output executed ``executions`` times, its mean reward (NaN: a bad reward)."""
        ...

    def pretraining_set(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Reward-free pre-training data of the featurizer: ``(inputs [n, e], targets [n, t])``."""
        ...


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
    if not isinstance(policy, PromptGaussianPolicy):
        raise TypeError(f"vector ideas need policy.kind=gaussian, not {config.policy.kind!r}")
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


class IdeaReference:
    """Vector ideas of ``config``'s Gaussian policy in the idea environment (module docstring)."""

    features = "idea"

    def __init__(self, config: Config) -> None:
        self.config = config
        self.env = IdeaEnv(config.env)

    def sample(
        self,
        weights: Mapping[str, torch.Tensor] | None,
        n: int,
        generator: torch.Generator,
        temperatures: Sequence[float] = (1.0,),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ideas = policy_ideas(self.config, weights, n, generator, temperatures)
        return ideas, ideas

    def execute(self, outputs: torch.Tensor, executions: int, generator: torch.Generator) -> torch.Tensor:
        return execute(self.env, outputs, executions, generator)

    def pretraining_set(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return pretraining_set(self.config.env.dim, n, generator)


@dataclasses.dataclass(frozen=True)
class Completions:
    """Completions of a language model: ``prompts[i]`` was completed by ``completions[i]``."""

    prompts: list[str]
    completions: list[str]

    def take(self, index: torch.Tensor) -> Completions:
        return Completions([self.prompts[i] for i in index.tolist()], [self.completions[i] for i in index.tolist()])


class TextReference:
    """Completions of ``config``'s causal LM in the text environment, scored as the sentence
    embeddings the environment computes (module docstring). The LM is loaded once, on CPU."""

    def __init__(self, config: Config) -> None:
        from popgrpo.policies.causal_lm import CausalLMPolicy

        self.config = config
        env = make_env(config.env)
        if not isinstance(env, TextEnvironment):
            raise TypeError(f"completions need a text environment, not env.kind={config.env.kind!r}")
        self.env: TextEnvironment = env
        self.features = f"embedding:{config.env.text.embedding_model}"
        self.policy = CausalLMPolicy(config.policy.causal_lm, "cpu", init_generator(config, 0))
        self._initial = self.policy.state_dict()

    def completions(
        self,
        weights: Mapping[str, torch.Tensor] | None,
        n: int,
        generator: torch.Generator,
        temperatures: Sequence[float] = (1.0,),
    ) -> Completions:
        """``n`` completions, an equal share at each factor on the LM's sampling temperature, shuffled."""
        self.policy.load_state_dict(dict(weights) if weights is not None else self._initial)
        lm_cfg = self.config.policy.causal_lm
        per_prompt = math.ceil(n / (len(self.env.prompts) * len(temperatures)))
        prompts: list[str] = []
        completions: list[str] = []
        try:
            for t in temperatures:
                self.policy.cfg = lm_cfg.model_copy(update={"temperature": lm_cfg.temperature * t})
                rollout = self.policy.rollout(self.env.prompts, per_prompt, generator)
                prompts += [p for p in rollout.prompts for _ in range(rollout.group_size)]
                completions += rollout.completions
        finally:
            self.policy.cfg = lm_cfg
        order = torch.randperm(len(completions), generator=generator)[:n]
        return Completions(prompts, completions).take(order)

    def sample(
        self,
        weights: Mapping[str, torch.Tensor] | None,
        n: int,
        generator: torch.Generator,
        temperatures: Sequence[float] = (1.0,),
    ) -> tuple[Completions, torch.Tensor]:
        outputs = self.completions(weights, n, generator, temperatures)
        return outputs, self.env.embed(outputs.completions)

    def execute(self, outputs: Completions, executions: int, generator: torch.Generator) -> torch.Tensor:
        runs = [self.env.reward(outputs.prompts, outputs.completions)[0] for _ in range(executions)]
        return torch.stack(runs).mean(0)

    def pretraining_set(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        embeddings = self.sample(None, n, generator, (0.5, 1.0, 1.5))[1]
        return embeddings, embeddings


def reference_data(config: Config) -> ReferenceData:
    """The :class:`ReferenceData` of ``config``: completions for a policy of text ideas, else vector ideas."""
    return TextReference(config) if ideas_of(POLICIES, config.policy.kind) == TEXT_IDEAS else IdeaReference(config)


def _pairs(features: torch.Tensor, rewards: torch.Tensor, n: int, generator: torch.Generator) -> PreferencePairs:
    """Pairs among the outputs with a finite reward (a bad reward says nothing of preference)."""
    finite = torch.isfinite(rewards)
    return make_pairs(features[finite], rewards[finite], n, generator)


def build_pairs(
    reference: ReferenceData,
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
    """``{"train", "test"[, "shifted"]}`` preference pairs from executed outputs of ``reference``
    (module docstring); ``train`` has ``round(corruption · len(train))`` labels swapped."""
    gen = torch_generator(seed, STREAM_RM, PURPOSE_REFERENCE)
    outputs, features = reference.sample(None, reference_ideas, gen, temperatures)
    rewards = reference.execute(outputs, executions, torch_generator(seed, STREAM_RM, PURPOSE_REFERENCE, 1))
    half = reference_ideas // 2
    pair_gen = torch_generator(seed, STREAM_RM, PURPOSE_PAIRS)
    train = _pairs(features[:half], rewards[:half], train_pairs, pair_gen)
    out = {
        "train": corrupt_labels(train, corruption, torch_generator(seed, STREAM_RM, PURPOSE_CORRUPT)),
        "test": _pairs(features[half:], rewards[half:], test_pairs, pair_gen),
    }
    if shifted_weights is not None and shifted_pairs:
        gen = torch_generator(seed, STREAM_RM, PURPOSE_SHIFTED)
        outputs, features = reference.sample(shifted_weights, reference_ideas, gen)
        out["shifted"] = _pairs(features, reference.execute(outputs, executions, gen), shifted_pairs, gen)
    return out
