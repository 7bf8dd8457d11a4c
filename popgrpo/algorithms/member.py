"""One population member: a policy trained by GRPO with optional QD and MaxEnt shapers.

The four methods of the main paper are one loop with switches, not four copies:

* GRPO: group-relative advantages, clipped surrogate, KL to the frozen initial policy.
* QD-GRPO (``qd.enabled``): archive bonuses ``β_new·1[new] + β_imp·1[improved]`` added to
  rewards before normalising (eq. 3).
* MaxEnt-GRPO (``maxent.*``): entropy bonus ``α·H`` with α by dual descent (eq. 4), novelty
  reward ``γ·kNN`` (eq. 5), normalisation within complexity bins (eq. 6).
* Pop-GRPO: several members plus the scheduler (:mod:`popgrpo.runtime.scheduler`), which
  calls :meth:`Member.adopt` with the merged model after each round; the member adds its
  own mutation (Gaussian, or CycleQD's SVD mutation of its task vector).

Any combination is allowed (e.g. a population of MaxEnt members with archive bonuses). The
step's formulas are the pure functions of :mod:`popgrpo.algorithms.step`; what depends on what
an idea is (a vector, or a language model's completion) is the member's
:mod:`~popgrpo.algorithms.rollouts`; where rewards come from is its reward source. A member
knows nothing about Ray: the executors in :mod:`popgrpo.runtime` hold members and call these
methods.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import torch

from popgrpo.algorithms.archive_service import ArchiveService, EpochInserts
from popgrpo.algorithms.code_metrics import epoch_code
from popgrpo.algorithms.discovery import epoch_discovery
from popgrpo.algorithms.merges import WeightMutation
from popgrpo.algorithms.policy_kinds import make_rollouts
from popgrpo.algorithms.rollouts import RewardSource, Rollouts, TextRollouts
from popgrpo.algorithms.step import (
    NO_ARCHIVE_ANSWER,
    Samples,
    Scores,
    StepBatch,
    StepStats,
    epoch_means,
    grpo_loss,
    shape_returns,
    step_advantages,
    zero_bad,
)
from popgrpo.columns import CONTROL_COLUMNS, REASONS_COLUMN
from popgrpo.config import Config
from popgrpo.core.entropy import AdaptiveAlpha
from popgrpo.core.exploration import count_bonus, unlikeliness_rewards, weight_positive
from popgrpo.core.merge import GaussianMutation
from popgrpo.core.repulsion import group_best, repulsion_penalty
from popgrpo.core.seeding import STREAM_MEMBER, STREAM_PERTURB, torch_generator
from popgrpo.core.trees import map_leaves
from popgrpo.envs import Environment, TextEnvironment
from popgrpo.registry import ADVANTAGES, POLICY_LOSSES, REWARD_SOURCES

if TYPE_CHECKING:
    from popgrpo.algorithms.engine_rollouts import RolloutService

__all__ = ["BadRewardError", "Member", "PendingStep", "make_optimizer", "resolve_device"]

log = logging.getLogger(__name__)

IdeasT = TypeVar("IdeasT")


class BadRewardError(RuntimeError):
    """Too many NaN/inf rewards in one batch: the environment is broken, stop the run."""


def make_optimizer(params: Iterable[torch.Tensor], config: Config) -> torch.optim.Adam:
    """Adam over ``params`` with ``grpo.lr``, in the implementation ``grpo.adam`` names.

    torch has no fused kernel for some devices and dtypes; there the fused choice falls back
    to ``foreach`` (the same update).
    """
    tensors = list(params)
    impl, lr = config.grpo.adam, config.grpo.lr
    if impl == "fused":
        try:
            return torch.optim.Adam(tensors, lr=lr, fused=True)
        except (RuntimeError, TypeError) as error:
            log.info("fused Adam unavailable here (%s); using foreach", error)
            impl = "foreach"
    return torch.optim.Adam(tensors, lr=lr, foreach=impl == "foreach")


@dataclass(frozen=True, kw_only=True)
class PendingStep(Generic[IdeasT]):
    """A step between its rewards and the archive's answer (:meth:`Member.score_begin` → :meth:`Member.score_end`)."""

    samples: Samples[IdeasT]
    scores: Scores
    request: object  # the archive's handle for the sent insert (EpochInserts.submit); None: deferred
    # The features still being computed (score_begin's defer_features): scores.features is empty
    # until Member.join_features puts them in, after the update.
    features_later: Future[torch.Tensor] | None = None


class Member:
    """A GRPO learner with its own policy, optimiser, α and random stream.

    Args:
        member_id: index k in the population (0-based); picks the member's seed stream.
        config: the validated run config.
        archive: where archive statuses and novelty scores come from (private or shared).
        env: the environment; built from ``config.env`` when omitted.
        device: where the policy computes (the environment, the archive and the advantages
            work on the CPU).
        reward_source: what ideas are worth; when omitted, what ``reward.source`` says: the
            environment's reward, or a learned proxy
            (the factory :data:`popgrpo.registry.REWARD_SOURCES` registers under that name).
        rollout_service: the shared rollout worker a language-model member generates on
            (``policy.causal_lm.rollout``); None: its own model.
        shared: what this member holds with the other members of its actor
            (:meth:`popgrpo.algorithms.policy_kinds.PolicyKind.shared`: a shared base model); None: nothing.
    """

    def __init__(
        self,
        member_id: int,
        config: Config,
        archive: ArchiveService,
        env: Environment | TextEnvironment | None = None,
        device: str | torch.device = "cpu",
        reward_source: RewardSource | None = None,
        rollout_service: RolloutService | None = None,
        shared: object | None = None,
    ) -> None:
        self.member_id = member_id
        self.config = config
        self.device = torch.device(device)
        self.rollouts: Rollouts[Any] = make_rollouts(config, member_id, env, self.device, rollout_service, shared)
        self.env = self.rollouts.env
        self.policy = self.rollouts.policy
        if reward_source is None:
            # The registry holds factories of any signature; reward.source's is (config, environment reward).
            self.reward_source: RewardSource = REWARD_SOURCES.get(config.reward.source)(
                config, self.rollouts.environment_reward
            )
        else:
            self.reward_source = reward_source
        self.archive = archive
        self.inserts = EpochInserts(archive, self.rollouts.behaviour, deferred=self.defers_archive_inserts)
        if isinstance(self.rollouts, TextRollouts):
            # Rewards start as each completion is generated when they are the environment's own.
            self.rollouts.prefetch_rewards = (
                self.rollouts.overlap
                and reward_source is None
                and config.reward.source == "execution"
                and bool(getattr(self.rollouts.env, "can_prefetch", False))  # TextEnv's, not every TextEnvironment's
                and callable(getattr(self.rollouts.env, "prefetch", None))
            )
        self.optimizer = make_optimizer(self.policy.parameters(), config)
        ent = config.maxent.entropy
        self.alpha = AdaptiveAlpha(ent.target, ent.alpha_init, ent.alpha_lr)
        self.generator = torch_generator(config.run.seed, STREAM_MEMBER, member_id)
        self.epochs_done = 0
        self.bad_rewards_total = 0
        self.repel: torch.Tensor | None = None  # [M, B] behaviours the returns are pushed from (adopt)
        # The last epoch's steps' ([N, e] features, [P, G] rewards), for behaviour_descriptors.
        self._last_epoch: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def defers_archive_inserts(self) -> bool:
        """True when no step needs the archive's answer before its update (no QD bonus, no
        novelty): the epoch's inserts then wait for its end (:class:`EpochInserts`)."""
        return not (self.config.qd.enabled or self.config.maxent.novelty.enabled)

    # ---- training ---------------------------------------------------------------------
    def train_epochs(self, n_epochs: int) -> list[dict[str, Any]]:
        """Run ``n_epochs`` epochs; return one metrics row per epoch (:data:`popgrpo.columns.METRIC_COLUMNS`)."""
        rows: list[dict[str, Any]] = []
        for _ in range(n_epochs):
            steps = [self.step() for _ in range(self.config.grpo.steps_per_epoch)]
            rows.append(self.end_epoch(steps))
        return rows

    def features_can_wait(self) -> bool:
        """True when nothing needs a step's features before its update: a text member
        (policy.causal_lm.overlap) trained on the environment's own reward, with deferred archive
        inserts, no repulsion and no outcome-count bonus. Its embeddings then run beside the update."""
        rollouts = self.rollouts
        return (
            isinstance(rollouts, TextRollouts)
            and rollouts.overlap
            and self.config.reward.source == "execution"
            and self.defers_archive_inserts
            and self.repel is None
            and self.config.explore.count_bonus == 0
        )

    def step(self) -> StepStats:
        """One GRPO step: sample, score (reward, archive, advantages), update."""
        samples = self.rollouts.sample(self.generator)
        pending = self.score_begin(samples, defer_features=self.features_can_wait())
        batch = self.score_end(pending)
        logp, entropy, kl = None, None, None
        for _ in range(self.config.grpo.updates_per_batch):
            logp, entropy = self.rollouts.log_prob_and_entropy(samples)
            loss, kl = self.loss(batch, logp, entropy)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # pyright: ignore[reportUnknownMemberType]  # torch leaves backward's parameters unannotated
            self.optimizer.step()  # pyright: ignore[reportUnknownMemberType]  # torch leaves step's closure unannotated
        assert entropy is not None and kl is not None, "grpo.updates_per_batch is at least 1"
        if pending.features_later is not None:
            batch = self.join_features(batch, pending.features_later)
        return self.finish_step(batch, entropy, kl)

    def join_features(self, batch: StepBatch[IdeasT], features: Future[torch.Tensor]) -> StepBatch[IdeasT]:
        """Put a step's deferred features into its batch, and hand them to the (deferred) archive inserts."""
        values = features.result()
        scores = batch.scores
        self.inserts.submit(values, scores.rewards, scores.finite, self.config.maxent.novelty.enabled)
        return dataclasses.replace(batch, scores=dataclasses.replace(scores, features=values))

    # A step's parts that do not touch the policy's parameters: PackedMembers
    # (popgrpo.algorithms.packed) calls them around one vectorised policy pass for several members.
    def score_begin(self, samples: Samples[IdeasT], defer_features: bool = False) -> PendingStep[IdeasT]:
        """Rewards of a step's ideas from the reward source, and the archive request sent (not awaited).

        ``defer_features`` (only where :meth:`features_can_wait`): the features are left
        computing; the pending step carries their Future, the archive insert waits for
        :meth:`join_features`, and the reward source gets an empty ``[0]`` tensor for them.
        """
        later: Future[torch.Tensor] | None = None
        if defer_features:
            assert isinstance(self.rollouts, TextRollouts) and self.features_can_wait()
            later, complexity = self.rollouts.describe_later(cast(Samples[Any], samples))
            features = torch.empty(0)
        else:
            features, complexity = self.rollouts.describe(samples)
        answer = self.reward_source(samples, features, self.generator)
        shape = (samples.n_prompts, samples.group_size)
        rewards = answer.values.reshape(shape)
        finite = torch.isfinite(rewards)
        n_bad = 0 if bool(finite.all()) else int((~finite).sum())
        if n_bad:
            self._count_bad_rewards(n_bad, rewards.numel())
        request = None if later else self.inserts.submit(features, rewards, finite, self.config.maxent.novelty.enabled)
        scores = Scores(
            features=features,
            complexity=complexity,
            rewards=rewards,
            finite=finite,
            n_bad=n_bad,
            reasons=answer.reasons,
            control=None if answer.control is None else answer.control.reshape(shape),
            expected=answer.expected,  # [N]: the epoch averages them over all ideas
            success=answer.success,
        )
        return PendingStep(samples=samples, scores=scores, request=request, features_later=later)

    def score_end(self, pending: PendingStep[IdeasT]) -> StepBatch[IdeasT]:
        """The returns: the unlikeliness reward, the archive bonus and novelty (when the archive
        answered this step), the outcome-count bonus and the repulsion penalty; then the
        advantages (``explore.advantage``) and W-REINFORCE's weight on the positive ones."""
        cfg, scores = self.config, pending.scores
        explore = cfg.explore
        returns = zero_bad(scores.rewards, scores.finite) if scores.n_bad else scores.rewards
        if explore.unlikeliness > 0:
            returns = unlikeliness_rewards(returns, self._idea_logp(pending.samples), explore.unlikeliness)
        archive = NO_ARCHIVE_ANSWER
        answer = self.inserts.result(pending.request)
        if answer is not None:
            returns, archive = shape_returns(
                returns,
                *answer,
                beta_new=cfg.qd.beta_new if cfg.qd.enabled else None,
                beta_imp=cfg.qd.beta_imp,
                novelty_coef=cfg.maxent.novelty.coef,
            )
        if explore.count_bonus > 0:  # the counts are the archive's: pooled when it is shared
            counts = self.archive.count(
                self.rollouts.behaviour(scores.features).numpy(), scores.finite.reshape(-1).numpy()
            )
            bonus = torch.as_tensor(count_bonus(counts, explore.count_bonus), dtype=returns.dtype)
            returns = returns + bonus.reshape(returns.shape) * scores.finite
        if self.repel is not None:  # scheduler.population=repulsion
            penalty = repulsion_penalty(
                self.rollouts.behaviour(scores.features),
                self.repel,
                cfg.scheduler.repulsion_strength,
                cfg.scheduler.repulsion_bandwidth,
            )
            returns = returns - penalty.reshape(returns.shape)
        estimator = ADVANTAGES.get(explore.advantage)
        advantages = step_advantages(
            returns,
            scores.complexity,
            scores.finite,
            scores.n_bad,
            cfg.maxent.complexity_bins,
            cfg.grpo.adv_eps,
            estimate=lambda group: estimator(group, cfg),
        )
        advantages = weight_positive(advantages, explore.positive_weight)
        return StepBatch(samples=pending.samples, scores=scores, archive=archive, advantages=advantages.to(self.device))

    def loss(
        self, batch: StepBatch[Any], logp: torch.Tensor, entropy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 4 for the current log-probs and (reduced) entropy of ``batch``'s samples; returns (loss, kl).

        The policy-gradient term is ``explore.policy_loss``'s (the clipped surrogate by default);
        its tokens are a text member's completion tokens, a vector member's ideas."""
        cfg, samples = self.config, batch.samples
        policy_loss = POLICY_LOSSES.get(cfg.explore.policy_loss)
        completion_mask: torch.Tensor | None = getattr(samples.ideas, "completion_mask", None)  # text rollouts'

        def terms(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(logp) if completion_mask is None else completion_mask
            return policy_loss(logp, old_logp, advantages, mask, cfg, self.generator)

        return grpo_loss(
            logp,
            logp.detach() if samples.old_logp is None else samples.old_logp,
            samples.ref_logp,
            self.rollouts.expand(batch.advantages, samples),
            entropy,
            clip=cfg.grpo.clip,
            kl_coef=cfg.grpo.kl_coef,
            alpha=self.alpha.value if cfg.maxent.entropy.enabled else None,
            reduce=lambda values: self.rollouts.reduce(values, samples),
            rollout_logp=samples.rollout_logp,
            tis_cap=cfg.policy.causal_lm.rollout.tis_cap,
            terms=terms,
        )

    def _idea_logp(self, samples: Samples[Any]) -> torch.Tensor:
        """``[P, G]`` each idea's log-likelihood under the sampling policy (CPU): a vector idea's
        own, a completion's mean over its tokens (what the unlikeliness reward ranks)."""
        old = samples.old_logp
        if old is None:  # the config refuses the unlikeliness reward where it would be
            raise ValueError("explore.unlikeliness needs the sampling policy's log-probs (grpo.updates_per_batch >= 2)")
        mask: torch.Tensor | None = getattr(samples.ideas, "completion_mask", None)
        per_idea = old if mask is None else (old * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        return per_idea.detach().reshape(samples.n_prompts, samples.group_size).cpu()

    def finish_step(self, batch: StepBatch[Any], entropy: torch.Tensor, kl: torch.Tensor) -> StepStats:
        """Dual step on α, and what the epoch's metrics need of this step."""
        if self.config.maxent.entropy.enabled:
            self.alpha.update(float(entropy.detach()))
        return StepStats(
            scores=batch.scores,
            archive=batch.archive,
            entropy=entropy.detach().cpu(),  # the epoch's row is reduced on the CPU (popgrpo.algorithms.step)
            kl=kl.detach().cpu(),
            identities=self.rollouts.identities(batch.samples, batch.scores.features),
            groups=getattr(batch.samples.ideas, "prompts", None),  # a text rollout's prompts
        )

    def end_epoch(self, steps: list[StepStats]) -> dict[str, Any]:
        """Close an epoch: the deferred archive inserts, then the epoch's metrics row."""
        self._last_epoch = [(s.scores.features, s.scores.rewards) for s in steps]
        counts = self.inserts.end_epoch()
        if counts is None:
            counts = sum(s.archive.new for s in steps), sum(s.archive.improved for s in steps)
        stats = self.inserts.stats()
        means = epoch_means(steps, self.config.eval.success_threshold, self.config.eval.k)
        quantiles = {key: means.pop(key) for key in [k for k in means if k.startswith("complexity_p")]}
        control = {key: means.pop(key) for key in CONTROL_COLUMNS}
        row: dict[str, Any] = {
            "epoch": self.epochs_done,
            "member": self.member_id,
            **means,
            "alpha": self.alpha.value,
            "archive_new": int(counts[0]),
            "archive_improved": int(counts[1]),
            "archive_coverage": stats["coverage"],
            "archive_qd_score": stats["qd_score"],
            "bad_rewards": int(sum(s.scores.n_bad for s in steps)),
            "ideas": int(sum(s.scores.rewards.numel() for s in steps)),
            **quantiles,
            **control,
            **epoch_discovery(steps, self.env, self.config.eval.discovery_threshold),
            **epoch_code(steps, self.env),
        }
        reasons = [s.scores.reasons for s in steps if s.scores.reasons is not None]
        if reasons:
            total = sum(reasons, Counter[str]())
            row[REASONS_COLUMN] = json.dumps(dict(sorted(total.items())))
        self.epochs_done += 1
        return row

    def _count_bad_rewards(self, n_bad: int, n_total: int) -> None:
        self.bad_rewards_total += n_bad
        fraction = n_bad / n_total
        limit = self.config.grpo.max_bad_reward_fraction
        if fraction > limit:
            raise BadRewardError(
                f"member {self.member_id}: {n_bad}/{n_total} rewards were NaN/inf "
                f"({fraction:.0%} > grpo.max_bad_reward_fraction={limit:.0%}); the environment's "
                "reward is broken"
            )
        log.warning("member %d: %d NaN/inf rewards left out of this update", self.member_id, n_bad)

    # ---- weights, for the scheduler ----------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """CPU copies, whatever the member's device: they go to checkpoints and the object store."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.policy.state_dict().items()}

    def adopt(
        self,
        base: Mapping[str, torch.Tensor] | None,
        mutation: WeightMutation | float | None,
        round_index: int,
        reset_optimizer: bool = True,
        repel: Sequence[Sequence[float]] | None = None,
        repel_keep: bool = False,
    ) -> dict[str, Any]:
        """Continue from ``base`` (the merged model; None: this member's own weights) plus its own mutation.

        ``mutation`` is a :class:`~popgrpo.algorithms.merges.WeightMutation` (e.g.
        :class:`~popgrpo.core.merge.SvdMutation`), a float σ_p for the main paper's Gaussian
        perturbation, or None for none. A mutation that ``needs_base`` (svd: its task vector)
        gets this member's round-0 weights. The mutation stream is keyed by (member, round), so
        it does not depend on which process or executor performs it. With ``reset_optimizer``
        (the main paper's round) Adam's moments, which belong to the old weights, are reset; α,
        the reference policy and the novelty memory stay. ``repel`` (``[M][B]`` behaviour
        descriptors, :mod:`popgrpo.core.repulsion`) lowers the returns near them until the next
        adoption; with ``repel_keep`` they are added to the centres this member already holds
        (its own history, ``scheduler.repulsion_from=self``) instead of replacing them. Returns the mutation's description (:func:`~popgrpo.core.merge.mutate`; empty
        for Gaussian and for none).
        """
        new = torch.tensor(repel, dtype=torch.float64).reshape(len(repel), -1) if repel else None
        if repel_keep and self.repel is not None:
            self.repel = self.repel if new is None else torch.cat([self.repel, new])
        else:
            self.repel = new
        if isinstance(mutation, float | int):
            mutation = GaussianMutation(sigma=float(mutation))
        info: dict[str, Any] = {}
        if base is not None or mutation is not None:
            start = self.get_weights() if base is None else base
            if mutation is None:
                weights = dict(start)
            else:
                generator = torch_generator(self.config.run.seed, STREAM_PERTURB, self.member_id, round_index)
                round0 = self.rollouts.round0() if mutation.needs_base else None
                weights, info = mutation.apply(start, generator, round0)
            self.policy.load_state_dict(weights)
        if reset_optimizer:
            self.optimizer = make_optimizer(self.policy.parameters(), self.config)
        return info

    def behaviour_descriptors(self) -> list[list[float]]:
        """``[P][B]``: where each group of this member's last epoch found its best idea
        (:func:`~popgrpo.core.repulsion.group_best`); ``[]`` before any epoch."""
        if not self._last_epoch:
            return []
        features = torch.cat([f for f, _ in self._last_epoch])
        rewards = torch.stack([r for _, r in self._last_epoch])  # [S, P, G]
        behaviours = self.rollouts.behaviour(features).reshape(*rewards.shape, -1)
        return group_best(behaviours, rewards)

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit for bit: weights, Adam, α, RNG, counters.

        The reference policy is not included: it is rebuilt from the run seed.
        """
        return {
            "member_id": self.member_id,
            "policy": self.get_weights(),
            "optimizer": _to_cpu(self.optimizer.state_dict()),
            "alpha": self.alpha.value,
            "generator": self.generator.get_state(),
            "epochs_done": self.epochs_done,
            "bad_rewards_total": self.bad_rewards_total,
            **({} if self.repel is None else {"repel": self.repel.clone()}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["member_id"] != self.member_id:
            raise ValueError(f"checkpoint of member {state['member_id']} loaded into member {self.member_id}")
        self.policy.load_state_dict(state["policy"])
        self.optimizer = make_optimizer(self.policy.parameters(), self.config)
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # Adam would share the given tensors
        self.alpha.value = float(state["alpha"])
        self.generator.set_state(state["generator"])
        self.epochs_done = int(state["epochs_done"])
        self.bad_rewards_total = int(state["bad_rewards_total"])
        repel = state.get("repel")
        self.repel = None if repel is None else torch.as_tensor(repel, dtype=torch.float64).clone()
        self.inserts.discard()  # an interrupted epoch's deferred inserts belong to the state being replaced


def _to_cpu(obj: object) -> object:
    """``obj`` with every tensor inside it copied to the CPU (checkpoints load on any machine).

    Always a copy: ``Tensor.cpu()`` returns the tensor itself when it is on the CPU already,
    and Adam updates its moments and step counter in place, so a state that shared them would
    change as training goes on (a snapshot must not).
    """
    return map_leaves(obj, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))


def resolve_device(setting: str, has_gpu: bool) -> tuple[torch.device, str | None]:
    """The device a member computes on, and a warning when that is not what was asked for.

    ``setting`` is ``policy.device``; ``has_gpu`` says whether the member was given a GPU (on
    Ray: the actor's ``ray.get_gpu_ids()``; in-process: ``population.resources.num_gpus > 0``).
    """
    cuda = torch.cuda.is_available()
    if setting == "cuda":
        if not cuda:
            raise RuntimeError("policy.device=cuda but CUDA is not available to this process (torch CPU build?)")
        return torch.device("cuda"), None
    if setting == "auto" and has_gpu:
        if cuda:
            return torch.device("cuda"), None
        return torch.device("cpu"), "a GPU was reserved for this member but CUDA is not available; computing on CPU"
    return torch.device("cpu"), None
