"""Where a member's policy meets its environment: what differs between vector ideas and text.

A :class:`~popgrpo.algorithms.member.Member` runs the same GRPO step whatever it trains; the
parts that depend on what an idea *is* live behind the :class:`Rollouts` protocol:

============================  ===============================  ==================================
                              :class:`IdeaRollouts`            :class:`TextRollouts`
============================  ===============================  ==================================
policy                        Gaussian over ``R^d``             causal LM + LoRA adapters
sample                        ``[P, G, d]`` ideas, ``[P, G]``    completions of drawn prompts,
                              log-probs                         ``[N, T]`` token log-probs
reference (KL)                a frozen copy of the initial      the base model, adapters off
                              policy
loss reduction                mean over ideas                   masked token aggregate
                                                                (``loss_normalisation``)
what the archive stores       the idea                          its sentence embedding
complexity                    ``env.complexity`` (‖x‖)          length in tokens
execution reward              ``env.reward(ideas, generator)``  the reward callables, with reasons
============================  ===============================  ==================================

The execution reward is the default **reward source** of a member
(:attr:`Rollouts.execution_reward`); a learned proxy is another callable of the same shape.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from typing import NamedTuple, Protocol

import torch

from popgrpo.algorithms.step import Samples
from popgrpo.config import Config
from popgrpo.core.grpo import masked_aggregate
from popgrpo.core.merge import soup
from popgrpo.core.seeding import STREAM_INIT, torch_generator
from popgrpo.envs import Environment, TextEnvironment, make_env
from popgrpo.policies import make_policy

__all__ = [
    "IdeaRollouts",
    "RewardSource",
    "Rewards",
    "Rollouts",
    "TextRollouts",
    "init_generator",
    "initial_weights",
    "make_rollouts",
    "round0_weights",
]


_NO_LOGP = torch.empty(0)  # samples drawn for evaluation carry no log-probs


class Rewards(NamedTuple):
    """A reward source's answer for ``N`` ideas."""

    values: torch.Tensor  # [N] float32 CPU; NaN/inf marks a bad reward
    reasons: Counter | None = None  # "source:reason" → count, where the source says why
    # [N] the execution reward of the same ideas when ``values`` come from a learned proxy
    # (the control reward, logged, never trained on); None: ``values`` are the execution reward.
    control: torch.Tensor | None = None
    # [N] the noise-free expectation of the execution reward, where the environment knows it
    # (IdeaEnv: Q·p_exec), logged as control_expected_reward; None elsewhere.
    expected: torch.Tensor | None = None
    # [N] bool: the idea's execution succeeded (the sandbox said ``ok``); None where the source
    # does not know (vector ideas).
    success: torch.Tensor | None = None


class RewardSource(Protocol):
    """``(samples, flat, generator) → Rewards``: what a step's ideas are worth.

    ``flat`` is ``[N, e]``, what the archive stores for each idea (the idea, or the embedding of
    a completion). The environment's execution reward is the default
    (:attr:`Rollouts.execution_reward`); a learned proxy plugs in here.
    """

    def __call__(self, samples: Samples, flat: torch.Tensor, generator: torch.Generator) -> Rewards: ...


class Rollouts(Protocol):
    """A member's policy, reference and environment, seen from the GRPO step."""

    policy: object  # the trainable policy: parameters(), state_dict(), load_state_dict(), to()
    env: object

    def sample(self, generator: torch.Generator) -> Samples:
        """One step's ideas with their sampling and reference log-probs (no gradient)."""

    def sample_every_prompt(self, n: int, generator: torch.Generator) -> Samples:
        """``n`` ideas for each of the task's prompts (held-out evaluation; no log-probs)."""

    def log_prob_and_entropy(self, samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs of ``samples`` under the current policy (same shape as ``samples.old_logp``)
        and the policy's entropy reduced to a scalar, from one pass, with gradient."""

    def reduce(self, values: torch.Tensor, samples: Samples) -> torch.Tensor:
        """Per-idea or per-token loss terms → one scalar."""

    def expand(self, advantages: torch.Tensor, samples: Samples) -> torch.Tensor:
        """``[P, G]`` advantages, shaped to broadcast against the log-probs."""

    def describe(self, samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flat [N, e] CPU, complexity [P, G])``: what the archive stores, and each idea's complexity."""

    def behaviour(self, flat: torch.Tensor) -> torch.Tensor:
        """``[N, e]`` → ``[N, 2]`` descriptors in [0, 1]: the archive cell of each idea."""

    def identities(self, samples: Samples, flat: torch.Tensor) -> list | torch.Tensor:
        """What makes an idea itself (the ``distinct`` metric): ``N`` hashable values, equal exactly
        when two ideas are the same, or an ``[N, e]`` tensor whose equal rows are equal ideas.
        ``flat`` is :meth:`describe`'s ``[N, e]``, for rollouts whose ideas are those rows."""

    def execution_reward(
        self, samples: Samples, flat: torch.Tensor, generator: torch.Generator, select: torch.Tensor | None = None
    ) -> Rewards:
        """The environment's (execution) reward: the default :class:`RewardSource`. With ``select``
        (``[k]`` indices into the ``N`` ideas, prompt-major) only those ideas are executed, and the
        ``[k]`` rewards come back in that order."""

    def round0(self) -> dict[str, torch.Tensor]:
        """θ_0: this member's initial weights (the svd mutation's task-vector base)."""


def init_generator(config: Config, member_id: int) -> torch.Generator:
    """The stream a member's initial weights are drawn from: shared unless ``shared_init`` is off."""
    key = (STREAM_INIT,) if config.population.shared_init else (STREAM_INIT, member_id)
    return torch_generator(config.run.seed, *key)


def initial_weights(config: Config, member_id: int = 0) -> dict[str, torch.Tensor]:
    """The weights a member starts from (a language model's: its initial adapters).

    For ``policy.kind=causal_lm`` this loads the model in this process.
    """
    idea_dim = make_env(config.env).idea_dim if config.policy.kind == "gaussian" else 0
    policy = make_policy(config.policy, idea_dim, init_generator(config, member_id))
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def round0_weights(config: Config, member_ids: list[int] | None = None) -> dict[str, torch.Tensor]:
    """θ_0, the early checkpoint of WiSE-FT and the base of task vectors: the round-0 weights.

    With ``population.shared_init`` (the default) every member starts there. Otherwise it is
    the uniform soup of the given members' own initial weights (all members when None).
    """
    if config.population.shared_init:
        return initial_weights(config, 0)
    ids = range(config.population.size) if member_ids is None else member_ids
    return soup([initial_weights(config, k) for k in ids])


class IdeaRollouts:
    """Vector ideas: a prompt-conditioned Gaussian policy over an :class:`~popgrpo.envs.Environment`."""

    def __init__(self, config: Config, member_id: int, env: Environment, device: torch.device) -> None:
        self.config = config
        self.member_id = member_id
        self.env = env
        self.policy = make_policy(config.policy, env.idea_dim, init_generator(config, member_id)).to(device)
        self.reference = copy.deepcopy(self.policy).requires_grad_(False)
        self.prompts = torch.arange(config.policy.n_prompts, device=device)
        # The reference is frozen and the prompts are fixed, so its mean and log-std heads
        # ([P, d] each) are computed once: each step's reference log-probs need only the ideas.
        with torch.no_grad():
            self.reference_heads = self.reference(self.prompts)
        # maxent.entropy.per_dimension: the policy's entropy is per dimension; ×d gives the joint one.
        self.entropy_scale = 1 if config.maxent.entropy.per_dimension else env.idea_dim
        self._round0: dict[str, torch.Tensor] | None = None

    def sample(self, generator: torch.Generator) -> Samples:
        with torch.no_grad():  # one forward samples and scores
            ideas, old_logp = self.policy.sample_with_log_prob(self.prompts, self.config.grpo.group_size, generator)
            ref_logp = self.reference.log_prob_from(*self.reference_heads, ideas)
        return Samples(ideas, old_logp, ref_logp, len(self.prompts), self.config.grpo.group_size)

    @torch.no_grad()
    def sample_every_prompt(self, n: int, generator: torch.Generator) -> Samples:
        ideas = self.policy.sample(self.prompts, n, generator)
        return Samples(ideas, _NO_LOGP, _NO_LOGP, len(self.prompts), n)

    def log_prob_and_entropy(self, samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
        logp, entropy = self.policy.log_prob_and_entropy(self.prompts, samples.ideas)
        entropy = entropy.mean()
        return logp, entropy if self.entropy_scale == 1 else entropy * self.entropy_scale

    def reduce(self, values: torch.Tensor, samples: Samples) -> torch.Tensor:
        return values.mean()

    def expand(self, advantages: torch.Tensor, samples: Samples) -> torch.Tensor:
        return advantages

    def describe(self, samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
        P, G = samples.n_prompts, samples.group_size
        flat = samples.ideas.reshape(P * G, -1).cpu()
        return flat, self.env.complexity(flat).reshape(P, G)

    def behaviour(self, flat: torch.Tensor) -> torch.Tensor:
        return self.env.behaviour(flat)

    def identities(self, samples: Samples, flat: torch.Tensor) -> torch.Tensor:
        # The vectors themselves (describe's rows): the epoch compares all its rows at once (distinct_share).
        return flat

    def execution_reward(
        self, samples: Samples, flat: torch.Tensor, generator: torch.Generator, select: torch.Tensor | None = None
    ) -> Rewards:
        # The environment's reward with its noise-free expectation, where it offers one (Environment).
        execute = getattr(self.env, "execute", None)
        if execute is None:
            return Rewards(self.env.reward(flat if select is None else flat[select], generator).float())
        if select is None:
            values, expected, success = execute(flat, generator)
            return Rewards(values.float(), expected=expected.float(), success=success)
        values, expected, success = execute(flat[select], generator)
        if hasattr(self.env, "expected_reward"):  # the expectation needs no execution: every idea's
            expected = self.env.expected_reward(flat)
        else:
            expected = torch.full((flat.shape[0],), math.nan).index_put_((select,), expected)
        return Rewards(values.float(), expected=expected.float(), success=success)

    def round0(self) -> dict[str, torch.Tensor]:
        if self._round0 is None:  # built on first use: only the svd mutation needs it
            self._round0 = initial_weights(self.config, self.member_id)
        return self._round0


class TextRollouts:
    """Text: a causal LM's LoRA adapters over a :class:`~popgrpo.envs.TextEnvironment`.

    Each step draws ``prompts_per_step`` prompts from the member's own stream (without
    replacement when there are enough). The loss is on tokens: every token of a completion
    shares its advantage, and per-token terms (surrogate, k3 KL, entropy) are reduced by
    ``policy.causal_lm.loss_normalisation`` (:func:`~popgrpo.core.grpo.masked_aggregate`).
    """

    def __init__(self, config: Config, member_id: int, env: TextEnvironment, device: torch.device) -> None:
        from popgrpo.policies.causal_lm import CausalLMPolicy

        self.config = config
        self.env = env
        self.policy = CausalLMPolicy(config.policy.causal_lm, device, init_generator(config, member_id))
        self._round0 = self.policy.state_dict()
        self.normalisation = config.policy.causal_lm.loss_normalisation

    def _draw_prompts(self, generator: torch.Generator) -> list[str]:
        pool = self.env.prompts
        n = self.config.policy.causal_lm.prompts_per_step
        if n <= len(pool):
            index = torch.randperm(len(pool), generator=generator)[:n]
        else:
            index = torch.randint(len(pool), (n,), generator=generator)
        return [pool[i] for i in index.tolist()]

    def sample(self, generator: torch.Generator) -> Samples:
        prompts = self._draw_prompts(generator)
        rollout = self.policy.rollout(prompts, self.config.grpo.group_size, generator)
        with torch.no_grad():
            # With one update per batch the update's own log-probs, detached, are the sampling
            # policy's (the weights have not changed), so that forward pass is not done twice
            # (TRL skips it the same way): ``old_logp`` None, the loss uses ``logp.detach()``.
            old_logp = self.policy.token_log_probs(rollout)[0] if self.config.grpo.updates_per_batch > 1 else None
            ref_logp = self.policy.reference_log_probs(rollout)
        return Samples(rollout, old_logp, ref_logp, len(prompts), rollout.group_size)

    @torch.no_grad()
    def sample_every_prompt(self, n: int, generator: torch.Generator) -> Samples:
        rollout = self.policy.rollout(self.env.prompts, n, generator)
        return Samples(rollout, _NO_LOGP, _NO_LOGP, len(self.env.prompts), n)

    def log_prob_and_entropy(self, samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
        logp, token_entropy = self.policy.token_log_probs(samples.ideas, with_entropy=True)
        return logp, self.reduce(token_entropy, samples)

    def reduce(self, values: torch.Tensor, samples: Samples) -> torch.Tensor:
        return masked_aggregate(values, samples.ideas.completion_mask, self.normalisation)

    def expand(self, advantages: torch.Tensor, samples: Samples) -> torch.Tensor:
        return advantages.reshape(-1)[:, None]  # [N, 1]: each token takes its completion's advantage

    def describe(self, samples: Samples) -> tuple[torch.Tensor, torch.Tensor]:
        rollout = samples.ideas
        embeddings = self.env.embed(rollout.completions)  # what the archive stores and novelty compares
        return embeddings, rollout.lengths.float().cpu().reshape(samples.n_prompts, samples.group_size)

    def behaviour(self, flat: torch.Tensor) -> torch.Tensor:
        return self.env.behaviour(flat)

    def identities(self, samples: Samples, flat: torch.Tensor) -> list:
        return list(samples.ideas.completions)  # the program's text, whatever prompt it answered

    def execution_reward(
        self, samples: Samples, flat: torch.Tensor, generator: torch.Generator, select: torch.Tensor | None = None
    ) -> Rewards:
        rollout = samples.ideas
        prompt_of = [p for p in rollout.prompts for _ in range(rollout.group_size)]
        completions = rollout.completions
        if select is not None:
            prompt_of = [prompt_of[i] for i in select.tolist()]
            completions = [completions[i] for i in select.tolist()]
        values, reasons, success = self.env.score(prompt_of, completions)
        return Rewards(values.float(), reasons, success=success)

    def round0(self) -> dict[str, torch.Tensor]:
        return self._round0


def make_rollouts(config: Config, member_id: int, env=None, device: str | torch.device = "cpu") -> Rollouts:
    """The rollouts ``policy.kind`` needs, over ``env`` (built from ``config.env`` when None)."""
    device = torch.device(device)
    if config.policy.kind == "causal_lm":
        return TextRollouts(config, member_id, env if env is not None else make_env(config.env, device), device)
    return IdeaRollouts(config, member_id, env if env is not None else make_env(config.env), device)
