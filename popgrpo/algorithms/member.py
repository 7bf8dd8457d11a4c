"""One population member: a policy trained by GRPO with optional QD and MaxEnt shapers.

The four methods of the main paper are one loop with switches, not four copies:

* GRPO: group-relative advantages, clipped surrogate, KL to the frozen initial policy.
* QD-GRPO (``qd.enabled``): archive bonuses ``β_new·1[new] + β_imp·1[improved]`` added to
  rewards before normalising (eq. 3).
* MaxEnt-GRPO (``maxent.*``): entropy bonus ``α·H`` with α by dual descent (eq. 4), novelty
  reward ``γ·kNN`` (eq. 5), normalisation within complexity bins (eq. 6).
* Pop-GRPO: several members plus the scheduler (:mod:`popgrpo.runtime.scheduler`), which
  calls :meth:`Member.reseed` with the merged model after each round; the member adds its
  own mutation (Gaussian, or CycleQD's SVD mutation of its task vector).

Any combination is allowed (e.g. a population of MaxEnt members with archive bonuses).
A member knows nothing about Ray: the executors in :mod:`popgrpo.runtime` hold members
and call these methods.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from popgrpo.algorithms.archive_service import ArchiveService
from popgrpo.config import Config
from popgrpo.core.archive import STATUS_IMPROVED, STATUS_NEW
from popgrpo.core.entropy import AdaptiveAlpha
from popgrpo.core.grpo import binned_advantages, clipped_surrogate, group_advantages, kl_penalty
from popgrpo.core.merge import Mutation, mutate, soup
from popgrpo.core.metrics import group_pass_best_at_k_batches, pairwise_diversity_batches
from popgrpo.core.seeding import torch_generator
from popgrpo.envs import Environment, make_env
from popgrpo.policies import Policy, make_policy

__all__ = [
    "METRIC_COLUMNS",
    "STREAM_EVAL",
    "STREAM_MERGE",
    "BadRewardError",
    "Member",
    "initial_weights",
    "make_member",
    "make_optimizer",
    "resolve_device",
    "round0_weights",
]

log = logging.getLogger(__name__)

# Seed-stream keys (see popgrpo.core.seeding): each purpose gets its own stream.
_STREAM_INIT = 0  # shared initial weights
_STREAM_MEMBER = 1  # (1, k): member k's sampling and reward noise
_STREAM_PERTURB = 2  # (2, k, round): member k's perturbation (mutation) at a round
STREAM_MERGE = 3  # (3, round): the driver's merge draws (task_arithmetic's w)
STREAM_EVAL = 4  # (4, round, purpose): the driver's held-out evaluation draws

METRIC_COLUMNS = (
    "epoch",
    "member",
    "reward_mean",
    "reward_max",
    "diversity",
    "complexity",
    "entropy",
    "alpha",
    "kl",
    "novelty",
    "archive_new",
    "archive_improved",
    "archive_coverage",
    "archive_qd_score",
    "bad_rewards",
    "ideas",
    "pass_at_k",
    "best_at_k",
    *(f"complexity_p{q}" for q in (10, 25, 50, 75, 90)),
)
COMPLEXITY_QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90)  # of every idea of an epoch (paper Figure 3)


@dataclass
class StepBatch:
    """What a GRPO step scored: ``P`` prompts × ``G`` ideas (``flat`` is ``[P·G, d]`` on the CPU)."""

    ideas: torch.Tensor  # [P, G, d], member's device
    old_logp: torch.Tensor  # [P, G]
    ref_logp: torch.Tensor  # [P, G]
    flat: torch.Tensor
    rewards: torch.Tensor  # [P, G]
    complexity: torch.Tensor  # [P, G]
    finite: torch.Tensor  # [P, G] bool
    n_bad: int
    advantages: torch.Tensor | None  # [P, G], member's device (set once the archive has answered)
    info: dict


class BadRewardError(RuntimeError):
    """Too many NaN/inf rewards in one batch: the environment is broken, stop the run."""


def init_generator(config: Config, member_id: int) -> torch.Generator:
    """The stream a member's initial weights are drawn from: shared unless ``shared_init`` is off."""
    key = (_STREAM_INIT,) if config.population.shared_init else (_STREAM_INIT, member_id)
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


def make_optimizer(params, config: Config) -> torch.optim.Adam:
    """Adam over ``params`` with ``grpo.lr``, in the implementation ``grpo.adam`` names.

    torch has no fused kernel for some devices and dtypes; there the fused choice falls back
    to ``foreach`` (the same update).
    """
    params = list(params)
    impl, lr = config.grpo.adam, config.grpo.lr
    if impl == "fused":
        try:
            return torch.optim.Adam(params, lr=lr, fused=True)
        except (RuntimeError, TypeError) as error:
            log.info("fused Adam unavailable here (%s); using foreach", error)
            impl = "foreach"
    return torch.optim.Adam(params, lr=lr, foreach=impl == "foreach")


def make_member(
    member_id: int,
    config: Config,
    archive: ArchiveService,
    env: Environment | None = None,
    device: str | torch.device = "cpu",
) -> Member:
    """The member class ``policy.kind`` needs: :class:`Member`, or the language-model member."""
    if config.policy.kind == "causal_lm":
        from popgrpo.algorithms.lm_member import LMMember

        return LMMember(member_id, config, archive, env, device)
    return Member(member_id, config, archive, env, device)


class Member:
    """A GRPO learner with its own policy, optimiser, α and random stream.

    Args:
        member_id: index k in the population (0-based); picks the member's seed stream.
        config: the validated run config.
        archive: where archive statuses and novelty scores come from (private or shared).
        env: the environment; built from ``config.env`` when omitted.
    """

    def __init__(
        self,
        member_id: int,
        config: Config,
        archive: ArchiveService,
        env: Environment | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.member_id = member_id
        self.config = config
        self.archive = archive
        self.env = env if env is not None else make_env(config.env)
        self.device = torch.device(device)
        self.policy: Policy = make_policy(config.policy, self.env.idea_dim)
        self.policy.load_state_dict(initial_weights(config, member_id))
        self.policy.to(self.device)
        self.reference: Policy = copy.deepcopy(self.policy).requires_grad_(False)
        self.optimizer = make_optimizer(self.policy.parameters(), config)
        ent = config.maxent.entropy
        self.alpha = AdaptiveAlpha(ent.target, ent.alpha_init, ent.alpha_lr)
        self.generator = torch_generator(config.run.seed, _STREAM_MEMBER, member_id)
        self.prompts = torch.arange(config.policy.n_prompts, device=self.device)
        self.epochs_done = 0
        self.bad_rewards_total = 0
        self._round0: dict[str, torch.Tensor] | None = None  # θ_0 for the svd mutation, built when needed
        self._pending: list[StepBatch] = []  # this epoch's batches whose archive insert waits (see _archive_deferred)

    @property
    def _archive_deferred(self) -> bool:
        """True when no step needs the archive's answer before its update (no QD bonus, no novelty).

        The archive then only feeds the epoch's metrics, so the epoch's batches are inserted
        together at its end (:meth:`_flush_archive`): in-order statuses make that the same
        archive and the same new/improved counts as step by step (tested), for one insert,
        and one round trip to a remote archive, per epoch instead of one per step.
        """
        return not (self.config.qd.enabled or self.config.maxent.novelty.enabled)

    # ---- training ---------------------------------------------------------------------
    def train_epochs(self, n_epochs: int) -> list[dict]:
        """Run ``n_epochs`` epochs; return one metrics row per epoch (:data:`METRIC_COLUMNS`)."""
        rows = []
        for _ in range(n_epochs):
            steps = [self._step() for _ in range(self.config.grpo.steps_per_epoch)]
            rows.append(self._epoch_row(steps))
            self.epochs_done += 1
        return rows

    def _step(self) -> dict:
        """One GRPO step: sample, score (env, archive, advantages), update. Returns its statistics."""
        with torch.no_grad():  # one forward samples and scores: [P, G, d] ideas, [P, G] log-probs
            ideas, old_logp = self.policy.sample_with_log_prob(
                self.prompts, self.config.grpo.group_size, self.generator
            )
            ref_logp = self.reference.log_prob(self.prompts, ideas)
        batch = self._score(ideas, old_logp, ref_logp)
        for _ in range(self.config.grpo.updates_per_batch):
            logp, entropy = self.policy.log_prob_and_entropy(self.prompts, ideas)
            entropy = entropy.mean()
            loss, kl = self._loss(batch, logp, entropy)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        return self._finish_step(batch, entropy, kl)

    # The three parts of a step that do not touch the policy's parameters directly: shared
    # with PackedMembers (popgrpo.algorithms.packed), which batches the policy work of
    # several members into one vectorised pass.
    def _score(self, ideas: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor) -> StepBatch:
        """Rewards, archive statuses / novelty and advantages of a step's ideas ``[P, G, d]``.

        The environment, the archive and the advantages work on the CPU; only the loss runs on
        the member's device.
        """
        batch, request = self._score_begin(ideas, old_logp, ref_logp)
        return self._score_end(batch, self._archive_result(request))

    def _score_begin(self, ideas: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor):
        """Environment rewards, and the archive request sent (not awaited): ``(batch so far, request)``."""
        P, G = ideas.shape[:2]
        flat = ideas.reshape(P * G, -1).cpu()
        rewards = self.env.reward(flat, self.generator).reshape(P, G).float()
        complexity = self.env.complexity(flat).reshape(P, G)
        batch = StepBatch(ideas, old_logp, ref_logp, flat, rewards, complexity, torch.ones(0), 0, None, {})
        return batch, self._submit(batch)

    def _submit(self, batch: StepBatch):
        """Count bad rewards into ``batch``, then send the archive its request: the behaviours of
        ``batch.flat`` (what the archive stores and novelty compares), the rewards, which ideas to
        keep. Returns the request's handle, or None when the insert waits for the epoch's end."""
        rewards = batch.rewards
        batch.finite = torch.isfinite(rewards)
        batch.n_bad = 0 if bool(batch.finite.all()) else int((~batch.finite).sum())
        if batch.n_bad:
            self._handle_bad_rewards(batch.n_bad, rewards.numel())
        if self._archive_deferred:
            self._pending.append(batch)
            return None
        return self.archive.submit(
            self.env.behaviour(batch.flat).numpy(),
            rewards.reshape(-1).numpy(),
            batch.flat.numpy(),
            batch.finite.reshape(-1).numpy(),
            self.config.maxent.novelty.enabled,
        )

    def _archive_result(self, request):
        """The archive's answer to :meth:`_submit`'s request: ``(statuses, novelty)``, or None when deferred."""
        return None if request is None else self.archive.result(request)

    def _flush_archive(self) -> tuple[int, int]:
        """Insert the epoch's deferred batches in one call, in step order: ``(new, improved)`` counts."""
        if not self._pending:
            return 0, 0
        flat = torch.cat([b.flat for b in self._pending])
        statuses, _ = self.archive.step(
            self.env.behaviour(flat).numpy(),
            torch.cat([b.rewards.reshape(-1) for b in self._pending]).numpy(),
            flat.numpy(),
            torch.cat([b.finite.reshape(-1) for b in self._pending]).numpy(),
            False,
        )
        self._pending = []
        return int((statuses == STATUS_NEW).sum()), int((statuses == STATUS_IMPROVED).sum())

    def _score_end(self, batch: StepBatch, archive_result) -> StepBatch:
        """Archive bonus and novelty into the returns (``archive_result`` None: deferred), then the advantages."""
        if archive_result is None:
            returns = batch.rewards
            if batch.n_bad:
                returns = torch.where(batch.finite, returns, torch.zeros_like(returns))
        else:
            returns, batch.info = self._shape_returns(batch.rewards, batch.finite, *archive_result)
        batch.advantages = self._advantages(returns, batch.complexity, batch.finite, batch.n_bad).to(self.device)
        return batch

    def _loss(self, batch: StepBatch, logp: torch.Tensor, entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clipped surrogate + KL (k3) − α·H for log-probs ``[P, G]`` and mean entropy; returns (loss, kl)."""
        cfg = self.config
        kl = kl_penalty(logp, batch.ref_logp).mean()
        loss = clipped_surrogate(logp, batch.old_logp, batch.advantages, cfg.grpo.clip) + cfg.grpo.kl_coef * kl
        if cfg.maxent.entropy.enabled:
            loss = loss - self.alpha.value * entropy
        return loss, kl

    def _finish_step(self, batch: StepBatch, entropy: torch.Tensor, kl: torch.Tensor) -> dict:
        """Dual step on α, and what the epoch's metrics need of this step (reduced in :meth:`_epoch_row`)."""
        if self.config.maxent.entropy.enabled:
            self.alpha.update(float(entropy.detach()))
        return {
            "rewards": batch.rewards,
            "finite": batch.finite,
            "flat": batch.flat,
            "complexity": batch.complexity,
            "entropy": entropy.detach(),
            "kl": kl.detach(),
            "bad_rewards": batch.n_bad,
            **batch.info,
        }

    def _handle_bad_rewards(self, n_bad: int, n_total: int) -> None:
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

    def _shape_returns(
        self, rewards: torch.Tensor, finite: torch.Tensor, statuses: np.ndarray, novelty: np.ndarray | None
    ) -> tuple[torch.Tensor, dict]:
        """Reward plus archive bonus (eq. 3) and novelty (eq. 5); ``[P, G]``."""
        cfg = self.config
        returns = torch.where(finite, rewards, torch.zeros_like(rewards))
        status_t = torch.as_tensor(np.array(statuses)).reshape(rewards.shape)  # a copy: Ray's arrays are read-only
        if cfg.qd.enabled:
            returns = (
                returns + cfg.qd.beta_new * (status_t == STATUS_NEW) + cfg.qd.beta_imp * (status_t == STATUS_IMPROVED)
            )
        novelty_mean = math.nan
        if novelty is not None:
            novelty_t = torch.tensor(np.asarray(novelty), dtype=torch.float32).reshape(rewards.shape)
            returns = returns + cfg.maxent.novelty.coef * novelty_t
            novelty_mean = float(novelty_t.mean())
        info = {
            "archive_new": int((statuses == STATUS_NEW).sum()),
            "archive_improved": int((statuses == STATUS_IMPROVED).sum()),
            "novelty": novelty_mean,
        }
        return returns, info

    def _advantages(
        self, returns: torch.Tensor, complexity: torch.Tensor, finite: torch.Tensor, n_bad: int
    ) -> torch.Tensor:
        cfg = self.config
        if n_bad:
            # A bad idea takes its group's mean return, so it has exactly zero advantage.
            counts = finite.sum(dim=1, keepdim=True).clamp_min(1)
            group_mean = (returns * finite).sum(dim=1, keepdim=True) / counts
            returns = torch.where(finite, returns, group_mean.expand_as(returns))
        if cfg.maxent.complexity_bins > 1:
            adv = binned_advantages(returns, complexity, cfg.maxent.complexity_bins, cfg.grpo.adv_eps)
        else:
            adv = group_advantages(returns, cfg.grpo.adv_eps)
        return torch.where(finite, adv, torch.zeros_like(adv)) if n_bad else adv

    def _epoch_row(self, steps: list[dict]) -> dict:
        """The epoch's metrics row: per-step statistics (each step's batch on its own, as the paper
        reports them), averaged over the epoch's steps; all steps reduced together, not one by one."""
        cfg = self.config
        if self._archive_deferred:
            new, improved = self._flush_archive()
        else:
            new = sum(s["archive_new"] for s in steps)
            improved = sum(s["archive_improved"] for s in steps)
        stats = self.archive.stats()
        rewards = torch.stack([s["rewards"] for s in steps])  # [S, P, G]
        finite = torch.stack([s["finite"] for s in steps])
        complexity = torch.stack([s["complexity"] for s in steps])
        good = finite.flatten(1)
        reward_sum = torch.where(finite, rewards, torch.zeros((), dtype=rewards.dtype)).flatten(1).sum(1)
        step_mean = reward_sum / good.sum(1)  # a step with no finite reward: 0/0 = NaN
        step_max = torch.where(finite, rewards, torch.tensor(-math.inf)).flatten(1).amax(1)
        step_max = torch.where(good.any(1), step_max, torch.tensor(math.nan))
        pass_k, best_k = group_pass_best_at_k_batches(rewards, cfg.eval.success_threshold, cfg.eval.k)
        per_step = {  # [S] each; the row holds their means over the steps, NaN steps left out
            "reward_mean": step_mean,
            "reward_max": step_max,
            "diversity": pairwise_diversity_batches(torch.stack([s["flat"] for s in steps])),
            "complexity": complexity.flatten(1).mean(1),
            "entropy": torch.stack([s["entropy"] for s in steps]),
            "kl": torch.stack([s["kl"] for s in steps]),
            "novelty": torch.tensor([s.get("novelty", math.nan) for s in steps]),
            "pass_at_k": pass_k,
            "best_at_k": best_k,
        }
        means = dict(zip(per_step, _nanmean_rows(torch.stack([v.double() for v in per_step.values()])), strict=True))
        # numpy's quantile (linear interpolation, as torch.quantile) is 3× faster here on an epoch's values.
        quantiles = np.quantile(complexity.flatten().double().numpy(), COMPLEXITY_QUANTILES).tolist()
        return {
            "epoch": self.epochs_done,
            "member": self.member_id,
            **means,
            "alpha": self.alpha.value,
            "archive_new": int(new),
            "archive_improved": int(improved),
            "archive_coverage": stats["coverage"],
            "archive_qd_score": stats["qd_score"],
            "bad_rewards": int(sum(s["bad_rewards"] for s in steps)),
            "ideas": int(rewards.numel()),
            **{f"complexity_p{round(q * 100)}": v for q, v in zip(COMPLEXITY_QUANTILES, quantiles, strict=True)},
        }

    # ---- weights, for the scheduler ----------------------------------------------------
    def get_weights(self) -> dict[str, torch.Tensor]:
        """CPU copies, whatever the member's device: they go to checkpoints and the object store."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.policy.state_dict().items()}

    def reseed(self, base: Mapping[str, torch.Tensor], mutation: Mutation | float, round_index: int) -> dict:
        """Load the merged model ``base`` with this member's own mutation (Pop-GRPO re-seeding).

        ``mutation`` is a :class:`~popgrpo.core.merge.Mutation`, or a float σ_p for the main
        paper's Gaussian perturbation. The svd mutation's task vector is relative to this
        member's round-0 weights. The mutation stream is keyed by (member, round), so it does
        not depend on which process or executor performs it. Adam's moments belong to the old
        weights and are reset; α, the reference policy and the novelty memory stay. Returns
        the mutation's description (:func:`~popgrpo.core.merge.mutate`; empty for Gaussian).
        """
        if not isinstance(mutation, Mutation):
            mutation = Mutation("gaussian", sigma=float(mutation))
        generator = torch_generator(self.config.run.seed, _STREAM_PERTURB, self.member_id, round_index)
        round0 = None
        if mutation.kind == "svd":
            if self._round0 is None:
                self._round0 = initial_weights(self.config, self.member_id)
            round0 = self._round0
        weights, info = mutate(base, mutation, generator, round0)
        self.policy.load_state_dict(weights)
        self.optimizer = make_optimizer(self.policy.parameters(), self.config)
        return info

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict:
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
        }

    def load_state_dict(self, state: Mapping) -> None:
        if state["member_id"] != self.member_id:
            raise ValueError(f"checkpoint of member {state['member_id']} loaded into member {self.member_id}")
        self.policy.load_state_dict(state["policy"])
        self.optimizer = make_optimizer(self.policy.parameters(), self.config)
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # Adam would share the given tensors
        self.alpha.value = float(state["alpha"])
        self.generator.set_state(state["generator"])
        self.epochs_done = int(state["epochs_done"])
        self.bad_rewards_total = int(state["bad_rewards_total"])
        self._pending = []  # an interrupted epoch's deferred inserts belong to the state being replaced


def _nanmean_rows(values: torch.Tensor) -> list[float]:
    """Mean of each row's non-NaN entries, ``[R, S]`` → R floats; ``math.nan`` for a row with none.

    Always the one ``math.nan`` object, as metric rows have always held: two rows with the same
    numbers then compare equal (``==`` on containers takes an identical object as equal).
    """
    kept = ~values.isnan()
    means = (torch.where(kept, values, 0.0).sum(1) / kept.sum(1)).tolist()  # 0/0 = NaN
    return [math.nan if math.isnan(m) else m for m in means]


def _to_cpu(obj):
    """``obj`` with every tensor inside it copied to the CPU (checkpoints load on any machine).

    Always a copy: ``Tensor.cpu()`` returns the tensor itself when it is on the CPU already,
    and Adam updates its moments and step counter in place, so a state that shared them would
    change as training goes on (a snapshot must not).
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


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
