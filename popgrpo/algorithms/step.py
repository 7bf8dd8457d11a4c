"""One GRPO step's math, from scored ideas to the loss, as small pure functions (main paper eqs. 3–6).

A step of :class:`~popgrpo.algorithms.member.Member` reads top to bottom as::

    samples = rollouts.sample(generator)                      # Samples: P prompts × G ideas, old/ref log-probs
    rewards = reward_source(samples, features, generator)     # the environment's reward (or a learned proxy)
    returns, archive = shape_returns(rewards, statuses, novelty, ...)  # eqs. 3, 5
    advantages = step_advantages(returns, complexity, finite, ...)     # eq. 6, bad rewards masked
    loss, kl = grpo_loss(logp, old_logp, ref_logp, advantages, ...)    # eq. 4

and carries its data in three frozen records, each built once by the part that owns it:
:class:`Samples` (what the rollouts sampled), :class:`Scores` (how the reward source and the
rollouts scored it), then :class:`StepBatch` (what the update learns from: samples, scores,
the :class:`ArchiveSummary` and the advantages) and :class:`StepStats` (what the epoch
reports: scores, archive summary, entropy, KL and the ideas' identities).

Everything here works on one step's tensors and holds no state; the member owns the policy,
the optimiser, α and the archive. Shapes: ``P`` prompts (groups), ``G`` ideas per group,
``N = P·G``, ``e`` the width of an idea's features (what the archive stores for it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray

from popgrpo.columns import COMPLEXITY_QUANTILES
from popgrpo.core.archive import STATUS_IMPROVED, STATUS_NEW
from popgrpo.core.grpo import binned_advantages, clipped_terms, group_advantages, kl_penalty
from popgrpo.core.metrics import group_pass_best_at_k_batches, linear_quantiles, pairwise_diversity_batches
from popgrpo.core.tensor_lists import float_list
from popgrpo.core.tis import tis_weights

__all__ = [
    "NO_ARCHIVE_ANSWER",
    "ArchiveSummary",
    "Identities",
    "Samples",
    "Scores",
    "StepBatch",
    "StepStats",
    "distinct_share",
    "epoch_means",
    "grpo_loss",
    "shape_returns",
    "step_advantages",
    "zero_bad",
]


IdeasT_co = TypeVar("IdeasT_co", covariant=True)

Identities = list[Hashable] | torch.Tensor
"""What makes each of a step's ``N`` ideas itself: ``N`` hashables, or an ``[N, e]`` tensor whose
equal rows are equal ideas (:meth:`popgrpo.algorithms.rollouts.Rollouts.identities`)."""


@dataclass(frozen=True, kw_only=True)
class Samples(Generic[IdeasT_co]):
    """What the policy sampled in one step (no gradient): the rollouts' part of the step.

    ``ideas`` is ``[P, G, d]`` on the member's device for vector ideas, a
    :class:`~popgrpo.policies.causal_lm.Rollout` for text. ``old_logp`` / ``ref_logp`` are
    ``[P, G]`` per idea, or ``[N, T]`` per token, under the sampling and the reference policy.
    ``old_logp`` is None where the sampling policy's log-probs are the first update's own
    (text with one update per batch): the loss then takes those, detached. ``rollout_logp``
    (``[N, T]``) is what a rollout engine other than the trainer's own model reported for the
    sampled tokens (vLLM); the loss then weights its policy-gradient term by truncated
    importance sampling (:mod:`popgrpo.core.tis`). None: the trainer's model sampled them.
    """

    ideas: IdeasT_co
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor
    n_prompts: int
    group_size: int
    rollout_logp: torch.Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class Scores:
    """How a step's ideas were scored: the reward source's answer and what the rollouts say of each idea.

    Built once the rewards are in (:meth:`popgrpo.algorithms.member.Member.score_begin`); read
    by the advantages, the update and the epoch's metrics.
    """

    features: torch.Tensor  # [N, e] CPU: what the archive stores, novelty and the reward models compare
    complexity: torch.Tensor  # [P, G]
    rewards: torch.Tensor  # [P, G] as the reward source gave them (NaN/inf kept, for the metrics)
    finite: torch.Tensor  # [P, G] bool
    n_bad: int  # rewards that are NaN/inf
    reasons: Counter[str] | None = None  # why rewards were what they were (text reward callables)
    control: torch.Tensor | None = None  # [P, G] environment reward when ``rewards`` come from a proxy
    # [N] (the epoch averages them over all ideas, so not reshaped to [P, G]):
    expected: torch.Tensor | None = None  # noise-free expected environment reward, where known
    success: torch.Tensor | None = None  # bool, or float with NaN: execution succeeded, where the source knows


@dataclass(frozen=True, kw_only=True)
class ArchiveSummary:
    """What the archive said of a step's ``N`` ideas, when it answered during the step (:func:`shape_returns`)."""

    new: int = 0  # ideas that filled an empty cell
    improved: int = 0  # ideas that beat their cell's elite
    novelty: float = math.nan  # mean kNN novelty; NaN: novelty is off


NO_ARCHIVE_ANSWER = ArchiveSummary()
"""The summary of a step the archive did not answer (its inserts wait for the epoch's end)."""


@dataclass(frozen=True, kw_only=True)
class StepBatch(Generic[IdeasT_co]):
    """What a step's update learns from: the samples, their scores and their advantages."""

    samples: Samples[IdeasT_co]
    scores: Scores
    archive: ArchiveSummary
    advantages: torch.Tensor  # [P, G] on the member's device


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """What an epoch's metrics row needs of one step (reduced together in :func:`epoch_means`)."""

    scores: Scores
    archive: ArchiveSummary
    entropy: torch.Tensor  # scalar, detached
    kl: torch.Tensor  # scalar, detached
    identities: Identities
    # What each of the P groups answered (text: its prompt); None where groups are not told apart.
    groups: Sequence[Hashable] | None = None


def zero_bad(rewards: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """Rewards with every NaN/inf replaced by 0 (``[P, G]``)."""
    return torch.where(finite, rewards, torch.zeros_like(rewards))


def shape_returns(
    returns: torch.Tensor,
    statuses: NDArray[np.integer[Any]],
    novelty: NDArray[np.floating[Any]] | None,
    *,
    beta_new: float | None,
    beta_imp: float,
    novelty_coef: float,
) -> tuple[torch.Tensor, ArchiveSummary]:
    """Archive bonus (eq. 3, when ``beta_new`` is not None) and novelty reward (eq. 5) added to ``returns``.

    ``R + β_new·1[new] + β_imp·1[improved] + γ·kNN``, all ``[P, G]``; ``statuses`` and
    ``novelty`` are the archive's ``[N]`` answers for the step's ideas. Returns the shaped
    returns and the step's :class:`ArchiveSummary` (new and improved counts, mean novelty).
    """
    status_t = torch.as_tensor(np.array(statuses)).reshape(returns.shape)  # a copy: Ray's arrays are read-only
    if beta_new is not None:
        returns = returns + beta_new * (status_t == STATUS_NEW) + beta_imp * (status_t == STATUS_IMPROVED)
    novelty_mean = math.nan
    if novelty is not None:
        novelty_t = torch.tensor(np.asarray(novelty), dtype=torch.float32).reshape(returns.shape)
        returns = returns + novelty_coef * novelty_t
        novelty_mean = float(novelty_t.mean())
    summary = ArchiveSummary(
        new=int((statuses == STATUS_NEW).sum()),
        improved=int((statuses == STATUS_IMPROVED).sum()),
        novelty=novelty_mean,
    )
    return returns, summary


def step_advantages(
    returns: torch.Tensor,
    complexity: torch.Tensor,
    finite: torch.Tensor,
    n_bad: int,
    bins: int,
    eps: float,
    estimate: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Group-relative advantages of ``returns [P, G]`` (eq. 6 within complexity bins when ``bins > 1``).

    ``estimate`` maps one group's (or bin's) ``[P, g]`` returns to advantages (``explore.advantage``,
    :mod:`popgrpo.algorithms.exploration`); None: GRPO's normalisation. An idea with a NaN/inf
    reward takes its group's mean return before the estimate, so it does not move its group's
    statistics, and then gets advantage exactly 0.
    """
    if n_bad:
        counts = finite.sum(dim=1, keepdim=True).clamp_min(1)
        group_mean = (returns * finite).sum(dim=1, keepdim=True) / counts
        returns = torch.where(finite, returns, group_mean.expand_as(returns))
    if bins > 1:
        adv = binned_advantages(returns, complexity, bins, eps, within=estimate)
    else:
        adv = group_advantages(returns, eps) if estimate is None else estimate(returns)
    return torch.where(finite, adv, torch.zeros_like(adv)) if n_bad else adv


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip: float,
    kl_coef: float,
    alpha: float | None,
    reduce: Callable[[torch.Tensor], torch.Tensor] = torch.mean,
    rollout_logp: torch.Tensor | None = None,
    tis_cap: float = 2.0,
    terms: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The GRPO loss of eq. 4: clipped surrogate + β·KL(k3) − α·H; returns ``(loss, kl)``.

    ``logp`` (with gradient), ``old_logp`` and ``ref_logp`` have one shape (``[P, G]`` per idea
    or ``[N, T]`` per token), ``advantages`` broadcasts against it, ``entropy`` is the policy's
    (already reduced) entropy. ``reduce`` turns per-idea or per-token terms into one number:
    the mean, or a masked token aggregate for text. ``alpha`` None: no entropy bonus.
    ``rollout_logp`` (same shape): the log-probs a rollout engine reported for the sampled
    ideas; each surrogate term is then weighted by ``min(exp(old_logp − rollout_logp),
    tis_cap)`` (:func:`~popgrpo.core.tis.tis_weights`). None: no weighting. ``terms``
    ``(logp, old_logp, advantages) → per-idea (per-token) losses`` replaces the clipped
    surrogate (``explore.policy_loss``: clip-higher, Clip-Cov, KL-Cov); None: the clipped surrogate.
    """
    kl = reduce(kl_penalty(logp, ref_logp))
    surrogate = clipped_terms(logp, old_logp, advantages, clip) if terms is None else terms(logp, old_logp, advantages)
    if rollout_logp is not None:
        surrogate = surrogate * tis_weights(old_logp, rollout_logp, tis_cap)
    loss = reduce(surrogate) + kl_coef * kl
    if alpha is not None:
        loss = loss - alpha * entropy
    return loss, kl


def epoch_means(steps: Sequence[StepStats], success_threshold: float, k: int) -> dict[str, float]:
    """An epoch's per-step statistics (each step's batch on its own, as the paper reports them),
    averaged over the epoch's steps, NaN steps left out; plus the complexity quantiles of every
    idea of the epoch. All steps are reduced together, not one by one."""
    scores = [s.scores for s in steps]
    rewards = torch.stack([s.rewards for s in scores])  # [S, P, G]
    finite = torch.stack([s.finite for s in scores])
    complexity = torch.stack([s.complexity for s in scores])
    step_mean, step_max = _step_mean_max(rewards, finite)
    if any(s.control is not None for s in scores):
        control = torch.stack([s.rewards if s.control is None else s.control for s in scores])
        control_finite = torch.isfinite(control)
        control_mean, control_max = _step_mean_max(control, control_finite)
    else:
        control_finite = finite
        control_mean, control_max = step_mean, step_max
    every_expected = _every_step_has([s.expected for s in scores])
    if every_expected is not None:
        expected = torch.stack(every_expected).flatten(1).double().nanmean(1)
    else:
        expected = torch.full((len(steps),), math.nan)
    pass_k, best_k = group_pass_best_at_k_batches(rewards, success_threshold, k)
    every_success = _every_step_has([s.success for s in scores])
    if every_success is not None:
        success = torch.stack(every_success).flatten(1).double().nanmean(1)
    else:
        success = torch.full((len(steps),), math.nan)
    per_step = {  # [S] each
        "reward_mean": step_mean,
        "reward_max": step_max,
        "diversity": pairwise_diversity_batches(torch.stack([s.features for s in scores])),
        "complexity": complexity.flatten(1).mean(1),
        "entropy": torch.stack([s.entropy for s in steps]),
        "kl": torch.stack([s.kl for s in steps]),
        "novelty": torch.tensor([s.archive.novelty for s in steps]),
        "pass_at_k": pass_k,
        "best_at_k": best_k,
        "control_reward_mean": control_mean,
        "control_reward_max": control_max,
        "control_expected_reward": expected,
        "control_share": control_finite.flatten(1).double().mean(1),
        "success": success,
    }
    means = dict(zip(per_step, _nanmean_rows(torch.stack([v.double() for v in per_step.values()])), strict=True))
    quantiles = linear_quantiles(complexity.flatten().double().numpy(), COMPLEXITY_QUANTILES)
    means.update({f"complexity_p{round(q * 100)}": v for q, v in zip(COMPLEXITY_QUANTILES, quantiles, strict=True)})
    means["distinct"] = distinct_share([s.identities for s in steps])
    return means


def distinct_share(identities: Sequence[Identities | None]) -> float:
    """The share of distinct ideas among all of an epoch's steps' ideas (NaN when a step has none).

    Each step gives ``N`` hashables, or an ``[N, e]`` tensor whose rows are compared bit for bit."""
    if any(ids is None for ids in identities):
        return math.nan
    tensors = [ids for ids in identities if isinstance(ids, torch.Tensor)]
    if identities and len(tensors) == len(identities):
        stacked = torch.cat(tensors)
        rows = np.ascontiguousarray(stacked.reshape(len(stacked), -1).numpy())
        if not rows.size:
            return math.nan
        if _all_folds_differ(rows):  # the usual case for continuous ideas: every row is distinct
            return 1.0
        # Each row's bytes as one opaque item: equal exactly when every element's bits are
        # equal; np.unique on them is ten times faster than torch.unique(dim=0).
        void = np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))
        # numpy's stubs give ndarray.view an unannotated overload: the call's type is still exact.
        items = rows.view(void).ravel()  # pyright: ignore[reportUnknownMemberType]
        return len(np.unique(items)) / len(items)
    every: list[Hashable] = [i for ids in identities if ids is not None for i in ids]
    return len(set(every)) / len(every) if every else math.nan


def _every_step_has(values: list[torch.Tensor | None]) -> list[torch.Tensor] | None:
    """``values`` when no step's is None, else None (a column every step must know)."""
    present = [v for v in values if v is not None]
    return present if len(present) == len(values) else None


def _all_folds_differ(rows: np.ndarray) -> bool:
    """True when no two rows of ``rows [M, e]`` can be equal: each row's bits XOR-folded into one
    word, and those words all differ. Equal rows have equal folds, so distinct folds prove the
    rows distinct; equal folds prove nothing (the caller then compares the rows themselves)."""
    width = rows.dtype.itemsize * rows.shape[1]
    word = np.uint64 if width % 8 == 0 else np.uint32 if width % 4 == 0 else np.uint8
    # numpy's stubs leave an overload of ndarray.view and ufunc.reduce's **kwargs unannotated.
    words = rows.view(word)  # pyright: ignore[reportUnknownMemberType]
    folds = np.sort(np.bitwise_xor.reduce(words, axis=1))  # pyright: ignore[reportUnknownMemberType]
    return bool((folds[1:] != folds[:-1]).all())


def _step_mean_max(rewards: torch.Tensor, finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's mean and max of its finite rewards, ``[S, P, G]`` → two ``[S]`` (NaN: none finite)."""
    good = finite.flatten(1)
    reward_sum = torch.where(finite, rewards, torch.zeros((), dtype=rewards.dtype)).flatten(1).sum(1)
    step_mean = reward_sum / good.sum(1)  # a step with no finite reward: 0/0 = NaN
    step_max = torch.where(finite, rewards, torch.tensor(-math.inf)).flatten(1).amax(1)
    return step_mean, torch.where(good.any(1), step_max, torch.tensor(math.nan))


def _nanmean_rows(values: torch.Tensor) -> list[float]:
    """Mean of each row's non-NaN entries, ``[R, S]`` → R floats; ``math.nan`` for a row with none.

    Always the one ``math.nan`` object: two rows with the same numbers then compare equal
    (``==`` on containers takes an identical object as equal).
    """
    kept = ~values.isnan()
    means = float_list(torch.where(kept, values, 0.0).sum(1) / kept.sum(1))  # 0/0 = NaN
    return [math.nan if math.isnan(m) else m for m in means]
