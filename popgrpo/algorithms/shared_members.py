"""Language-model members on one base model, stepped together in mixed-adapter batches.

With ``policy.causal_lm.share_base`` the members of one actor hold one frozen base and an
adapter each (:class:`~popgrpo.policies.shared_base.SharedBase`). :class:`SharedBaseMembers`
runs one GRPO step of all of them as :meth:`Member.step <popgrpo.algorithms.member.Member.step>`
runs it for one, with the model's work batched:

1. every member draws its prompts and its sampling seed from its own stream, as it would alone;
2. one ``generate`` for every member's rows (:meth:`SharedBase.mixed_rollouts`), each member's
   tokens drawn with its own seeded generator; or, with ``policy.causal_lm.rollout`` on a
   worker, each member's completions from the worker's engine, as a member alone gets them;
3. one forward of the base with no adapter gives every member's reference log-probs;
4. rewards, archive and advantages per member (:meth:`Member.score_begin` / :meth:`Member.score_end`);
5. the update's forward and backward in passes of ``policy.causal_lm.share_base_update_members``
   members' rows (all of them on CUDA, one at a time on the CPU by default): each pass sums its
   members' losses, each member's gradient lands in its own adapter, and then every member's
   own Adam steps. A pass holds its rows' activations, so fewer members a pass hold less memory;
   on the CPU, where the update's arithmetic bounds it, a bigger pass gains little.

So a member's numbers are what it would get alone up to float rounding (tested against
separate members on the same seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from popgrpo.algorithms.member import Member
from popgrpo.algorithms.rollouts import TextRollouts
from popgrpo.algorithms.step import Samples, StepStats
from popgrpo.policies.causal_lm import Rollout, draw_seed
from popgrpo.policies.shared_base import AdapterPolicy, MixedBatch, SharedBase, update_members

__all__ = ["SharedBaseMembers"]


class SharedBaseMembers:
    """Train ``members`` (text members whose policies are adapters on one :class:`SharedBase`) in lockstep."""

    def __init__(self, members: Sequence[Member]) -> None:
        if not members:
            raise ValueError("no members to train")
        self.members = list(members)
        self.rollouts: list[TextRollouts] = []
        self.policies: list[AdapterPolicy] = []
        for member in self.members:
            rollouts, policy = member.rollouts, member.rollouts.policy
            if not isinstance(rollouts, TextRollouts) or not isinstance(policy, AdapterPolicy):
                raise TypeError(f"member {member.member_id} is not a language-model member on a shared base")
            self.rollouts.append(rollouts)
            self.policies.append(policy)
        self.base: SharedBase = self.policies[0].base
        if any(p.base is not self.base for p in self.policies):
            raise ValueError("these members do not share one base model")
        self.config = self.members[0].config
        # policy.causal_lm.rollout on a worker: each member's completions come from the worker's
        # engine (its adapter pushed there), and the reference pass and the update stay batched here.
        # policy.causal_lm.share_base_update_members: how many members' rows one update pass holds.
        self.update_members = update_members(self.config.policy.causal_lm, len(self.members), self.base.device)
        self.on_worker = any(r.engine is not None for r in self.rollouts)
        if self.on_worker and not all(r.engine is not None for r in self.rollouts):
            raise ValueError("members on one base either all generate on the rollout worker or none does")

    def train_epochs(self, n_epochs: int) -> list[list[dict[str, Any]]]:
        """``n_epochs`` epochs for every member; per member, one metrics row per epoch."""
        rows: list[list[dict[str, Any]]] = [[] for _ in self.members]
        for _ in range(n_epochs):
            steps = [self.step() for _ in range(self.config.grpo.steps_per_epoch)]
            for k, member in enumerate(self.members):
                rows[k].append(member.end_epoch([s[k] for s in steps]))
        return rows

    def sample(self) -> tuple[list[Samples[Rollout]], MixedBatch]:
        """Every member's step samples (with reference and, where needed, sampling log-probs) and
        the batch that holds them all."""
        group = self.config.grpo.group_size
        prompts: list[list[str]] = []
        seeds: list[int] = []
        outs: list[Rollout] = []
        engine_logp: list[torch.Tensor | None] = [None] * len(self.members)
        for k, (member, rollouts) in enumerate(zip(self.members, self.rollouts, strict=True)):
            prompts.append(rollouts.draw_prompts(member.generator))  # as TextRollouts.sample: prompts,
            if rollouts.engine is not None:  # ... then the worker's rollout, which draws the seed
                rollout, engine_logp[k] = rollouts.engine.rollout(prompts[-1], group, member.generator)
                outs.append(rollout)
            else:
                seeds.append(draw_seed(member.generator))  # ... then the seed of the member's generate call
        if not self.on_worker:
            outs = self.base.mixed_rollouts(self.policies, prompts, group, seeds)
        batch = MixedBatch.of(self.policies, outs)
        with torch.no_grad():
            reference = self.base.mixed_log_probs(batch, reference=True)
            # As TextRollouts.sample: with one update per batch the update's own detached
            # log-probs are the sampling policy's (old_logp None).
            old = self.base.mixed_log_probs(batch) if self.config.grpo.updates_per_batch > 1 else None
        samples = [
            Samples(
                ideas=rollout,
                old_logp=None if old is None else old[k][0],
                ref_logp=reference[k][0],
                n_prompts=len(prompts[k]),
                group_size=rollout.group_size,
                rollout_logp=engine_logp[k],
            )
            for k, rollout in enumerate(outs)
        ]
        return samples, batch

    def step(self) -> list[StepStats]:
        """One GRPO step of every member: one generation, one reference pass, one update pass per update."""
        members = self.members
        samples, batch = self.sample()
        pending = [m.score_begin(s) for m, s in zip(members, samples, strict=True)]
        batches = [m.score_end(p) for m, p in zip(members, pending, strict=True)]
        entropies: list[torch.Tensor] = []
        kls: list[torch.Tensor] = []
        chunk = self.update_members
        for _ in range(self.config.grpo.updates_per_batch):
            entropies, kls = [], []
            for member in members:
                member.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(members), chunk):
                part = list(range(start, min(start + chunk, len(members))))
                passes = self.base.mixed_log_probs(batch.select(part), with_entropy=True)
                losses: list[torch.Tensor] = []
                for k, (logp, token_entropy) in zip(part, passes, strict=True):
                    assert token_entropy is not None  # with_entropy=True always computes it
                    entropy = self.rollouts[k].reduce(token_entropy, samples[k])
                    loss, kl = members[k].loss(batches[k], logp, entropy)
                    losses.append(loss)
                    entropies.append(entropy)
                    kls.append(kl)
                # A member's loss depends on its own adapter only: the sum's gradient is each loss's own.
                torch.stack(losses).sum().backward()  # pyright: ignore[reportUnknownMemberType]
            for member in members:
                member.optimizer.step()  # pyright: ignore[reportUnknownMemberType]
        return [m.finish_step(b, entropies[k], kls[k]) for k, (m, b) in enumerate(zip(members, batches, strict=True))]
