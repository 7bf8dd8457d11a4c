"""A population member whose policy is a causal language model with LoRA adapters.

The same GRPO member as :class:`~popgrpo.algorithms.member.Member` (archive bonuses,
novelty, complexity bins, α, checkpoints, re-seeding from the soup: all inherited), with
what differs for text:

* an idea is a completion; its archive "idea" is its sentence embedding, its behaviour the
  embedding's fixed projection, its complexity its length in tokens
  (:class:`popgrpo.envs.text.TextEnv`);
* the loss is on tokens: per-token ratios and k3 KL, the completion's advantage on each of its
  tokens, reduced by ``policy.causal_lm.loss_normalisation``
  (:func:`popgrpo.core.grpo.masked_aggregate`); the entropy bonus uses the mean per-token
  entropy reduced the same way;
* the reference policy is the base model (adapters off), the weights the scheduler moves are
  the adapters.

Each step draws ``prompts_per_step`` prompts from the member's own stream; reward reasons
(e.g. the sandbox's ``timeout``/``crash``) are counted per epoch in the ``reward_reasons``
column.
"""

from __future__ import annotations

import json
from collections import Counter

import torch

from popgrpo.algorithms.archive_service import ArchiveService
from popgrpo.algorithms.member import _STREAM_MEMBER, Member, StepBatch, init_generator, make_optimizer
from popgrpo.config import Config
from popgrpo.core.entropy import AdaptiveAlpha
from popgrpo.core.grpo import kl_penalty, masked_aggregate, token_clipped_surrogate
from popgrpo.core.seeding import torch_generator
from popgrpo.envs import make_env
from popgrpo.policies.causal_lm import CausalLMPolicy, Rollout

__all__ = ["LMMember"]


class LMMember(Member):
    """A GRPO learner over a causal LM's LoRA adapters (arguments as :class:`Member`)."""

    def __init__(
        self,
        member_id: int,
        config: Config,
        archive: ArchiveService,
        env=None,
        device: str | torch.device = "cpu",
    ) -> None:
        # Member.__init__ builds a Gaussian policy and a deep-copied reference; neither applies.
        self.member_id = member_id
        self.config = config
        self.archive = archive
        self.device = torch.device(device)
        self.env = env if env is not None else make_env(config.env, self.device)
        self.policy = CausalLMPolicy(config.policy.causal_lm, self.device, init_generator(config, member_id))
        self._round0 = self.policy.state_dict()  # θ_0 of the svd mutation: the initial adapters
        self.optimizer = make_optimizer(self.policy.parameters(), config)
        ent = config.maxent.entropy
        self.alpha = AdaptiveAlpha(ent.target, ent.alpha_init, ent.alpha_lr)
        self.generator = torch_generator(config.run.seed, _STREAM_MEMBER, member_id)
        self.epochs_done = 0
        self.bad_rewards_total = 0
        self._pending = []

    def _draw_prompts(self) -> list[str]:
        """``prompts_per_step`` prompts: without replacement when there are enough, else with."""
        pool = self.env.prompts
        n = self.config.policy.causal_lm.prompts_per_step
        if n <= len(pool):
            index = torch.randperm(len(pool), generator=self.generator)[:n]
        else:
            index = torch.randint(len(pool), (n,), generator=self.generator)
        return [pool[i] for i in index.tolist()]

    def _step(self) -> dict:
        cfg = self.config
        group = cfg.grpo.group_size
        prompts = self._draw_prompts()
        rollout = self.policy.rollout(prompts, group, self.generator)
        with torch.no_grad():
            old_logp, _ = self.policy.token_log_probs(rollout)
            ref_logp = self.policy.reference_log_probs(rollout)
        batch, reasons = self._score_text(rollout, old_logp, ref_logp)
        for _ in range(cfg.grpo.updates_per_batch):
            logp, token_entropy = self.policy.token_log_probs(rollout, with_entropy=True)
            entropy = masked_aggregate(token_entropy, rollout.completion_mask, self._normalisation)
            loss, kl = self._loss(batch, logp, entropy)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        stats = self._finish_step(batch, entropy, kl)
        stats["reward_reasons"] = reasons
        return stats

    @property
    def _normalisation(self) -> str:
        return self.config.policy.causal_lm.loss_normalisation

    def _score_text(
        self, rollout: Rollout, old_logp: torch.Tensor, ref_logp: torch.Tensor
    ) -> tuple[StepBatch, Counter]:
        """Rewards, embeddings, behaviours, archive statuses / novelty, advantages ``[P, G]``."""
        n_prompts, group = len(rollout.prompts), rollout.group_size
        prompt_of = [p for p in rollout.prompts for _ in range(group)]
        rewards, reasons = self.env.reward(prompt_of, rollout.completions)
        embeddings = self.env.embed(rollout.completions)  # [N, E]: what the archive stores and novelty compares
        complexity = rollout.lengths.float().cpu().reshape(n_prompts, group)
        batch = StepBatch(
            rollout,
            old_logp,
            ref_logp,
            embeddings,
            rewards.reshape(n_prompts, group),
            complexity,
            torch.ones(0),
            0,
            None,
            {},
        )
        request = self._submit(batch)  # behaviours: the embeddings' projection (TextEnv.behaviour)
        return self._score_end(batch, self._archive_result(request)), reasons

    def _loss(self, batch: StepBatch, logp: torch.Tensor, entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-level clipped surrogate + KL (k3) − α·H; ``logp`` is ``[N, T]``, ``entropy`` a scalar."""
        cfg = self.config
        mask = batch.ideas.completion_mask
        advantages = batch.advantages.reshape(-1)
        surrogate = token_clipped_surrogate(logp, batch.old_logp, advantages, mask, cfg.grpo.clip, self._normalisation)
        kl = masked_aggregate(kl_penalty(logp, batch.ref_logp), mask, self._normalisation)
        loss = surrogate + cfg.grpo.kl_coef * kl
        if cfg.maxent.entropy.enabled:
            loss = loss - self.alpha.value * entropy
        return loss, kl

    def _epoch_row(self, steps: list[dict]) -> dict:
        row = super()._epoch_row(steps)
        reasons = sum((s["reward_reasons"] for s in steps), Counter())
        row["reward_reasons"] = json.dumps(dict(sorted(reasons.items())))
        return row
