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
features (archive, novelty,   the idea                          its sentence embedding
behaviour, reward models)
complexity                    ``env.complexity`` (‖x‖)          length in tokens
environment reward            ``env.execute`` / ``env.reward``  the reward callables, with reasons
                                                                (``env.score``)
============================  ===============================  ==================================

The environment's reward is the default **reward source** of a member
(:meth:`Rollouts.environment_reward`); a learned proxy is another :class:`RewardSource`.
:class:`VectorRollouts` is what the vectorised path (:mod:`popgrpo.algorithms.packed`) needs
beyond :class:`Rollouts`: the prompts, the frozen reference and a policy it can call with
stacked parameters.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import torch

from popgrpo.algorithms.step import Identities, Samples
from popgrpo.config import Config
from popgrpo.core.grpo import masked_aggregate
from popgrpo.core.seeding import STREAM_INIT, torch_generator
from popgrpo.core.tensor_lists import int_list
from popgrpo.envs import Environment, TextEnvironment
from popgrpo.envs.text import embedding_thread
from popgrpo.policies import make_policy

if TYPE_CHECKING:
    from popgrpo.algorithms.engine_rollouts import RolloutService
    from popgrpo.policies.causal_lm import CausalLMPolicy, Rollout

__all__ = [
    "EnvironmentReward",
    "IdeaRollouts",
    "ReparameterisedPolicy",
    "RewardSource",
    "Rewards",
    "Rollouts",
    "TextRollouts",
    "TrainablePolicy",
    "VectorPolicy",
    "VectorRollouts",
    "init_generator",
]

IdeasT = TypeVar("IdeasT")  # what a step's ideas are: a [P, G, d] tensor, or a Rollout of completions
IdeasT_co = TypeVar("IdeasT_co", covariant=True)

_NO_LOGP = torch.empty(0)  # samples drawn for evaluation carry no log-probs


def init_generator(config: Config, member_id: int) -> torch.Generator:
    """The stream a member's initial weights are drawn from: shared unless ``population.shared_init`` is off."""
    key = (STREAM_INIT,) if config.population.shared_init else (STREAM_INIT, member_id)
    return torch_generator(config.run.seed, *key)


class Rewards(NamedTuple):
    """A reward source's answer for ``N`` ideas."""

    values: torch.Tensor  # [N] float32 CPU; NaN/inf marks a bad reward
    reasons: Counter[str] | None = None  # "source:reason" → count, where the source says why
    # [N] the environment reward of the same ideas when ``values`` come from a learned proxy
    # (the control reward, logged, never trained on); None: ``values`` are the environment reward.
    control: torch.Tensor | None = None
    # [N] the noise-free expectation of the environment reward, where the environment knows it
    # (IdeaEnv: Q·p_exec), logged as control_expected_reward; None elsewhere.
    expected: torch.Tensor | None = None
    # [N] bool: the idea's execution succeeded (the sandbox said ``ok``); None where the source
    # does not know (vector ideas without ``execute``). A float with NaN where only some ideas
    # were executed (a proxy's ``control_fraction``).
    success: torch.Tensor | None = None


class RewardSource(Protocol):
    """``(samples, features, generator) → Rewards``: what a step's ``N`` ideas are worth.

    ``features`` is ``[N, e]``, what the rollouts say of each idea (:meth:`Rollouts.describe`:
    the idea itself, or a completion's embedding). The environment's reward is the default
    (:meth:`Rollouts.environment_reward`); a learned proxy plugs in here.
    """

    def __call__(self, samples: Samples[Any], features: torch.Tensor, generator: torch.Generator, /) -> Rewards: ...


class EnvironmentReward(Protocol):
    """A :class:`RewardSource` that can execute a subset of the ideas (:meth:`Rollouts.environment_reward`).

    With ``select`` (``[k]`` indices into the ``N`` ideas, prompt-major) only those ideas are
    executed, and the ``[k]`` rewards come back in that order (``expected`` stays ``[N]``).
    """

    def __call__(
        self,
        samples: Samples[Any],
        features: torch.Tensor,
        generator: torch.Generator,
        /,
        select: torch.Tensor | None = None,
    ) -> Rewards: ...


class TrainablePolicy(Protocol):
    """What a member does with any policy: optimise its parameters and move its weights."""

    def parameters(self) -> Iterable[torch.nn.Parameter]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], /) -> object: ...


@runtime_checkable
class VectorPolicy(Protocol):
    """A prompt-conditioned Gaussian-like policy over ``R^d`` (``nn.Module``), as vector ideas need it.

    :class:`~popgrpo.policies.gaussian.PromptGaussianPolicy` is one. ``P`` prompts, ``G`` ideas
    per prompt, ``d`` idea dimension.
    """

    def __call__(self, prompts: torch.Tensor, /) -> tuple[torch.Tensor, torch.Tensor]:
        """``[P]`` prompt ids → the heads: mean ``[P, d]`` and log-std ``[P, d]``."""
        ...

    def sample(self, prompts: torch.Tensor, group_size: int, generator: torch.Generator) -> torch.Tensor:
        """``[P]`` prompt ids → ``[P, G, d]`` ideas (no gradient)."""
        ...

    def sample_with_log_prob(
        self, prompts: torch.Tensor, group_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[P, G, d]`` ideas and their ``[P, G]`` log-probs from one pass (no gradient)."""
        ...

    def log_prob_and_entropy(self, prompts: torch.Tensor, ideas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[P, G]`` log-probs of ``ideas [P, G, d]`` and the ``[P, d]`` entropy, from one pass (with gradient)."""
        ...

    def log_prob_from(self, mean: torch.Tensor, log_std: torch.Tensor, ideas: torch.Tensor) -> torch.Tensor:
        """``[P, G]`` log-density of ``ideas [P, G, d]`` under heads ``[P, d]``."""
        ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], /) -> object: ...

    def to(self, device: torch.device, /) -> VectorPolicy: ...

    def requires_grad_(self, requires_grad: bool = True, /) -> VectorPolicy: ...


@runtime_checkable
class ReparameterisedPolicy(VectorPolicy, Protocol):
    """A :class:`VectorPolicy` whose sampling splits into its heads and noise: what packing needs."""

    def draw_noise(self, n_prompts: int, group_size: int, generator: torch.Generator) -> torch.Tensor:
        """``[P, G, d]`` standard normal draws from ``generator`` (its own device)."""
        ...

    def ideas_from_noise(self, mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Heads ``[P, d]`` and noise ``[P, G, d]`` → ideas ``[P, G, d]``."""
        ...


class Rollouts(Protocol[IdeasT]):
    """A member's policy, reference and environment, seen from the GRPO step.

    ``IdeasT`` is what :class:`~popgrpo.algorithms.step.Samples` carry: ``[P, G, d]`` vectors,
    or a :class:`~popgrpo.policies.causal_lm.Rollout` of ``N = P·G`` completions. ``P`` prompts,
    ``G`` ideas per prompt, ``e`` the width of an idea's features.
    """

    @property
    def policy(self) -> TrainablePolicy:
        """The trainable policy (the member's optimiser and weights)."""
        ...

    @property
    def env(self) -> Environment | TextEnvironment:
        """The environment the ideas are rewarded, placed and measured by."""
        ...

    def sample(self, generator: torch.Generator) -> Samples[IdeasT]:
        """One step's ideas with their sampling and reference log-probs (no gradient)."""
        ...

    def sample_every_prompt(self, n: int, generator: torch.Generator) -> Samples[IdeasT]:
        """``n`` ideas for each of the task's prompts (held-out evaluation; no log-probs)."""
        ...

    def log_prob_and_entropy(self, samples: Samples[IdeasT]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs of ``samples`` under the current policy (same shape as ``samples.ref_logp``)
        and the policy's entropy reduced to a scalar, from one pass, with gradient."""
        ...

    def reduce(self, values: torch.Tensor, samples: Samples[IdeasT]) -> torch.Tensor:
        """Per-idea ``[P, G]`` or per-token ``[N, T]`` loss terms → one scalar."""
        ...

    def expand(self, advantages: torch.Tensor, samples: Samples[IdeasT]) -> torch.Tensor:
        """``[P, G]`` advantages, shaped to broadcast against the log-probs."""
        ...

    def describe(self, samples: Samples[IdeasT]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features [N, e] CPU, complexity [P, G])``: what the archive stores, novelty and the
        reward models compare, and behaviours are computed from; and each idea's complexity."""
        ...

    def behaviour(self, features: torch.Tensor) -> torch.Tensor:
        """``[N, e]`` features → ``[N, 2]`` descriptors in [0, 1]: the archive cell of each idea."""
        ...

    def identities(self, samples: Samples[IdeasT], features: torch.Tensor) -> Identities:
        """What makes an idea itself (the ``distinct`` metric): ``N`` hashable values, equal exactly
        when two ideas are the same, or an ``[N, e]`` tensor whose equal rows are equal ideas.
        ``features`` is :meth:`describe`'s, for rollouts whose ideas are those rows."""
        ...

    def environment_reward(
        self,
        samples: Samples[IdeasT],
        features: torch.Tensor,
        generator: torch.Generator,
        /,
        select: torch.Tensor | None = None,
    ) -> Rewards:
        """The environment's reward of the ideas: the default :class:`RewardSource`
        (an :class:`EnvironmentReward`). With ``select`` (``[k]`` indices into the ``N`` ideas,
        prompt-major) only those ideas are executed, and the ``[k]`` rewards come back in that order."""
        ...

    def round0(self) -> dict[str, torch.Tensor]:
        """θ_0 of this member: its own initial weights (the svd mutation's task-vector base)."""
        ...


@runtime_checkable
class VectorRollouts(Rollouts[torch.Tensor], Protocol):
    """Rollouts of vector ideas from a :class:`VectorPolicy`, with what the packed path stacks.

    :class:`~popgrpo.algorithms.packed.PackedMembers` runs several members' policy work in one
    vectorised pass: it needs the (fixed) prompts, each member's frozen reference and how the
    policy's entropy is scaled, besides the policy itself.
    """

    @property
    def policy(self) -> VectorPolicy:
        """The trainable policy."""
        ...

    @property
    def prompts(self) -> torch.Tensor:
        """``[P]`` prompt ids, the same every step."""
        ...

    @property
    def reference(self) -> VectorPolicy:
        """The frozen reference policy of the KL term (same structure as :attr:`policy`)."""
        ...

    @property
    def entropy_scale(self) -> int:
        """Factor on the policy's mean per-dimension entropy: 1, or ``d`` for the joint entropy
        (``maxent.entropy.per_dimension`` off)."""
        ...


_Execute = Callable[[torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""An environment's optional ``execute(ideas [N, d], generator) → (rewards, expectations, success)``, each ``[N]``."""
_ExpectedReward = Callable[[torch.Tensor], torch.Tensor]
"""An environment's optional ``expected_reward(ideas [N, d]) → [N]``."""


class IdeaRollouts:
    """Vector ideas: a prompt-conditioned :class:`VectorPolicy` over an :class:`~popgrpo.envs.Environment`."""

    def __init__(self, config: Config, member_id: int, env: Environment, device: torch.device) -> None:
        self.config = config
        self.member_id = member_id
        self.env: Environment = env
        policy = make_policy(config.policy, env.idea_dim, init_generator(config, member_id))
        if not isinstance(policy, VectorPolicy):
            raise TypeError(f"policy.kind={config.policy.kind}: vector ideas need a VectorPolicy (an nn.Module)")
        self.policy: VectorPolicy = policy.to(device)
        self.reference: VectorPolicy = copy.deepcopy(self.policy).requires_grad_(False)
        self.prompts = torch.arange(config.policy.n_prompts, device=device)
        # The reference is frozen and the prompts are fixed, so its mean and log-std heads
        # ([P, d] each) are computed once: each step's reference log-probs need only the ideas.
        with torch.no_grad():
            self.reference_heads = self.reference(self.prompts)
        # maxent.entropy.per_dimension: the policy's entropy is per dimension; ×d gives the joint one.
        self.entropy_scale = 1 if config.maxent.entropy.per_dimension else env.idea_dim
        self._round0: dict[str, torch.Tensor] | None = None

    def sample(self, generator: torch.Generator) -> Samples[torch.Tensor]:
        with torch.no_grad():  # one forward samples and scores
            ideas, old_logp = self.policy.sample_with_log_prob(self.prompts, self.config.grpo.group_size, generator)
            ref_logp = self.reference.log_prob_from(*self.reference_heads, ideas)
        return Samples(
            ideas=ideas,
            old_logp=old_logp,
            ref_logp=ref_logp,
            n_prompts=len(self.prompts),
            group_size=self.config.grpo.group_size,
        )

    @torch.no_grad()
    def sample_every_prompt(self, n: int, generator: torch.Generator) -> Samples[torch.Tensor]:
        ideas = self.policy.sample(self.prompts, n, generator)
        return Samples(ideas=ideas, old_logp=_NO_LOGP, ref_logp=_NO_LOGP, n_prompts=len(self.prompts), group_size=n)

    def log_prob_and_entropy(self, samples: Samples[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logp, entropy = self.policy.log_prob_and_entropy(self.prompts, samples.ideas)
        entropy = entropy.mean()
        return logp, entropy if self.entropy_scale == 1 else entropy * self.entropy_scale

    def reduce(self, values: torch.Tensor, samples: Samples[torch.Tensor]) -> torch.Tensor:
        return values.mean()

    def expand(self, advantages: torch.Tensor, samples: Samples[torch.Tensor]) -> torch.Tensor:
        return advantages

    def describe(self, samples: Samples[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        P, G = samples.n_prompts, samples.group_size
        features = samples.ideas.reshape(P * G, -1).cpu()
        return features, self.env.complexity(features).reshape(P, G)

    def behaviour(self, features: torch.Tensor) -> torch.Tensor:
        return self.env.behaviour(features)

    def identities(self, samples: Samples[torch.Tensor], features: torch.Tensor) -> torch.Tensor:
        # The vectors themselves (describe's rows): the epoch compares all its rows at once (distinct_share).
        return features

    def environment_reward(
        self,
        samples: Samples[torch.Tensor],
        features: torch.Tensor,
        generator: torch.Generator,
        /,
        select: torch.Tensor | None = None,
    ) -> Rewards:
        # The environment's reward with its noise-free expectation, where it offers one (Environment's
        # optional methods, looked up on each call: a wrapper may add or replace them).
        execute: _Execute | None = getattr(self.env, "execute", None)
        if execute is None:
            return Rewards(self.env.reward(features if select is None else features[select], generator).float())
        if select is None:
            values, expected, success = execute(features, generator)
            return Rewards(values.float(), expected=expected.float(), success=success)
        values, expected, success = execute(features[select], generator)
        expected_reward: _ExpectedReward | None = getattr(self.env, "expected_reward", None)
        if expected_reward is not None:  # the expectation needs no execution: every idea's
            expected = expected_reward(features)
        else:
            expected = torch.full((features.shape[0],), math.nan).index_put_((select,), expected)
        return Rewards(values.float(), expected=expected.float(), success=success)

    def round0(self) -> dict[str, torch.Tensor]:
        if self._round0 is None:  # built on first use: only the svd mutation needs it
            policy = make_policy(self.config.policy, self.env.idea_dim, init_generator(self.config, self.member_id))
            self._round0 = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        return self._round0


def _text_policy(config: Config, member_id: int, device: torch.device, shared: object | None) -> CausalLMPolicy:
    """Member ``member_id``'s language model: its own, or its adapter on ``shared`` (a
    :class:`~popgrpo.policies.shared_base.SharedBase`), seeded from its init stream."""
    from popgrpo.policies.causal_lm import CausalLMPolicy
    from popgrpo.policies.shared_base import SharedBase

    generator = init_generator(config, member_id)
    if shared is None:
        return CausalLMPolicy(config.policy.causal_lm, device, generator)
    if not isinstance(shared, SharedBase):
        raise TypeError(f"text members share a SharedBase, got {type(shared).__name__}")
    return shared.member_policy(member_id, generator)


class TextRollouts:
    """Text: a causal LM's LoRA adapters over a :class:`~popgrpo.envs.TextEnvironment`.

    Each step draws ``prompts_per_step`` prompts from the member's own stream (without
    replacement when there are enough). The loss is on tokens: every token of a completion
    shares its advantage, and per-token terms (surrogate, k3 KL, entropy) are reduced by
    ``policy.causal_lm.loss_normalisation`` (:func:`~popgrpo.core.grpo.masked_aggregate`).
    With a ``rollout_service`` (the shared rollout worker) the completions come from it
    (:class:`~popgrpo.algorithms.engine_rollouts.EngineSampler`), with the engine's log-probs.
    """

    def __init__(
        self,
        config: Config,
        member_id: int,
        env: TextEnvironment,
        device: torch.device,
        rollout_service: RolloutService | None = None,
        shared: object | None = None,
    ) -> None:
        self.config = config
        self.env: TextEnvironment = env
        self.policy = _text_policy(config, member_id, device, shared)
        self._round0 = self.policy.state_dict()
        self.normalisation = config.policy.causal_lm.loss_normalisation
        self.engine = None
        if rollout_service is not None:
            from popgrpo.algorithms.engine_rollouts import EngineSampler

            self.engine = EngineSampler(rollout_service, member_id, self.policy)
        # When set, each step takes its prompts from here instead of drawing them (a benchmark
        # giving two trainers the same prompt sequence); the member's stream is not drawn from.
        self.prompt_schedule: Iterator[list[str]] | None = None
        # policy.causal_lm.overlap: embeddings start on the process's embedding thread as soon as
        # a step's completions exist; with prefetch_rewards (set by the member when its rewards
        # are the environment's) each completion's reward starts as soon as its row ends.
        self.overlap = config.policy.causal_lm.overlap
        self.prefetch_rewards = False
        self._embedding: dict[int, Future[torch.Tensor]] = {}  # id(rollout) → its embeddings

    def draw_prompts(self, generator: torch.Generator) -> list[str]:
        """A step's prompts: the schedule's next, or drawn from ``generator`` (the member's stream)."""
        if self.prompt_schedule is not None:
            return list(next(self.prompt_schedule))
        pool = self.env.prompts
        n = self.config.policy.causal_lm.prompts_per_step
        if n <= len(pool):
            index = torch.randperm(len(pool), generator=generator)[:n]
        else:
            index = torch.randint(len(pool), (n,), generator=generator)
        return [pool[i] for i in int_list(index)]

    def sample(self, generator: torch.Generator) -> Samples[Rollout]:
        prompts = self.draw_prompts(generator)
        G = self.config.grpo.group_size
        rollout_logp = None
        if self.engine is None:
            on_row_done: Callable[[int, str], None] | None = None
            if self.prefetch_rewards:  # each program starts as soon as its row is generated
                prefetch: Callable[[str, str], None] = getattr(self.env, "prefetch")  # noqa: B009  # checked by the member
                on_row_done = lambda row, text: prefetch(prompts[row // G], text)  # noqa: E731
            rollout = self.policy.rollout(prompts, G, generator, on_row_done=on_row_done)
        else:
            rollout, rollout_logp = self.engine.rollout(prompts, G, generator)
        if self.overlap:  # the embeddings run beside the reference pass (and the programs)
            self._embedding[id(rollout)] = embedding_thread().submit(self.env.embed, rollout.completions)
        with torch.no_grad():
            # With one update per batch the update's own log-probs, detached, are the sampling
            # policy's (the weights have not changed), so that forward pass is not done twice
            # (TRL skips it the same way): ``old_logp`` None, the loss uses ``logp.detach()``.
            old_logp = self.policy.token_log_probs(rollout)[0] if self.config.grpo.updates_per_batch > 1 else None
            ref_logp = self.policy.reference_log_probs(rollout)
        return Samples(
            ideas=rollout,
            old_logp=old_logp,
            ref_logp=ref_logp,
            n_prompts=len(prompts),
            group_size=rollout.group_size,
            rollout_logp=rollout_logp,
        )

    @torch.no_grad()
    def sample_every_prompt(self, n: int, generator: torch.Generator) -> Samples[Rollout]:
        rollout = self.policy.rollout(self.env.prompts, n, generator)
        return Samples(
            ideas=rollout, old_logp=_NO_LOGP, ref_logp=_NO_LOGP, n_prompts=len(self.env.prompts), group_size=n
        )

    def log_prob_and_entropy(self, samples: Samples[Rollout]) -> tuple[torch.Tensor, torch.Tensor]:
        logp, token_entropy = self.policy.token_log_probs(samples.ideas, with_entropy=True)
        assert token_entropy is not None  # with_entropy=True always computes it
        return logp, self.reduce(token_entropy, samples)

    def reduce(self, values: torch.Tensor, samples: Samples[Rollout]) -> torch.Tensor:
        return masked_aggregate(values, samples.ideas.completion_mask, self.normalisation)

    def expand(self, advantages: torch.Tensor, samples: Samples[Rollout]) -> torch.Tensor:
        return advantages.reshape(-1)[:, None]  # [N, 1]: each token takes its completion's advantage

    def describe(self, samples: Samples[Rollout]) -> tuple[torch.Tensor, torch.Tensor]:
        features, complexity = self.describe_later(samples)
        return features.result(), complexity

    def describe_later(self, samples: Samples[Rollout]) -> tuple[Future[torch.Tensor], torch.Tensor]:
        """:meth:`describe` with the embeddings as a Future (the ones :meth:`sample` started, or
        started now on the process's embedding thread; computed at once when overlap is off)."""
        rollout = samples.ideas
        complexity = rollout.lengths.float().cpu().reshape(samples.n_prompts, samples.group_size)
        started = self._embedding.pop(id(rollout), None)
        if started is None:
            if self.overlap:
                started = embedding_thread().submit(self.env.embed, rollout.completions)
            else:
                started = Future[torch.Tensor]()
                started.set_result(self.env.embed(rollout.completions))  # what the archive stores, novelty compares
        return started, complexity

    def behaviour(self, features: torch.Tensor) -> torch.Tensor:
        return self.env.behaviour(features)

    def identities(self, samples: Samples[Rollout], features: torch.Tensor) -> list[Hashable]:
        return list(samples.ideas.completions)  # the program's text, whatever prompt it answered

    def environment_reward(
        self,
        samples: Samples[Rollout],
        features: torch.Tensor,
        generator: torch.Generator,
        /,
        select: torch.Tensor | None = None,
    ) -> Rewards:
        rollout = samples.ideas
        prompt_of = [p for p in rollout.prompts for _ in range(rollout.group_size)]
        completions = rollout.completions
        if select is not None:
            prompt_of = [prompt_of[i] for i in int_list(select)]
            completions = [completions[i] for i in int_list(select)]
        values, reasons, success = self.env.score(prompt_of, completions)
        return Rewards(values.float(), reasons, success=success)

    def round0(self) -> dict[str, torch.Tensor]:
        return self._round0
