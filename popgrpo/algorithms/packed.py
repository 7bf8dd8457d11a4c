"""Several members trained together: one vectorised forward/backward per GRPO step.

For a small policy a member's step is mostly framework overhead (Python, small-kernel
launches), so K members one after another cost ~K× one step. :class:`PackedMembers` stacks
the members' parameters (``[K, ...]`` per tensor) and runs the policy's work of all K in one
pass with ``torch.func.vmap`` over ``functional_call``; everything else (random draws,
environment, archive, advantages, α) stays per member, in member order, with each member's
own generator, so the result equals training the members one at a time up to float
rounding (tested). With private archives that is exact up to rounding; with a shared archive
the members' insertions interleave step by step instead of epoch by epoch.

Adam is elementwise, so one Adam over the stacked tensors is K independent Adams. Between
calls the members' own modules and optimisers hold the state (checkpoints, ``get_weights``,
``adopt`` see nothing different): each call stacks them at the start and writes back at
the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from popgrpo.algorithms.member import Member, make_optimizer
from popgrpo.algorithms.rollouts import ReparameterisedPolicy, VectorPolicy, VectorRollouts
from popgrpo.algorithms.step import Samples, StepStats

__all__ = ["PackedMembers", "can_pack"]


class _LogProbEntropy(nn.Module):
    """``(prompts, ideas)`` → ``(log_prob [P, G], mean entropy)``: the policy's own math, as one call."""

    def __init__(self, policy: VectorPolicy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, prompts: torch.Tensor, ideas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, entropy = self.policy.log_prob_and_entropy(prompts, ideas)
        return logp, entropy.mean()


def can_pack(members: Sequence[Member]) -> bool:
    """Members can step together when their rollouts are :class:`~popgrpo.algorithms.rollouts.VectorRollouts`
    whose policy can split sampling into forward + noise (a
    :class:`~popgrpo.algorithms.rollouts.ReparameterisedPolicy`, an ``nn.Module``)."""
    return bool(members) and _packable(members[0].rollouts) is not None


def _packable(rollouts: object) -> tuple[VectorRollouts, ReparameterisedPolicy, nn.Module] | None:
    """``rollouts``, its policy as a reparameterised policy and as a module; None when it cannot be packed."""
    if not isinstance(rollouts, VectorRollouts):
        return None
    policy = rollouts.policy
    # The two methods are looked up on the policy itself: isinstance on a protocol of methods
    # caches its answer per class, so it alone would not see a method removed later.
    if not (hasattr(policy, "draw_noise") and hasattr(policy, "ideas_from_noise")):
        return None
    if not isinstance(policy, ReparameterisedPolicy) or not isinstance(policy, nn.Module):
        return None
    return rollouts, policy, policy


class PackedMembers:
    """Train ``members`` (same config, same device) in lockstep, one batched policy pass per step."""

    def __init__(self, members: Sequence[Member]) -> None:
        packable = [found for found in (_packable(m.rollouts) for m in members) if found is not None]
        if not members or len(packable) != len(members):
            raise ValueError("these members' policy cannot be vectorised (needs draw_noise and ideas_from_noise)")
        self.members = list(members)
        self.rollouts = [rollouts for rollouts, _, _ in packable]
        self._samplers = [policy for _, policy, _ in packable]  # each member's own draws its noise
        first, self._policy, self._module = packable[0]
        self.config = self.members[0].config
        self.prompts = first.prompts
        self._template = _LogProbEntropy(self._policy)  # structure only; parameters come from the stacks
        self._names = [name for name, _ in self._module.named_parameters()]

    # ---- stacking ----------------------------------------------------------------------
    def _stack(self) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor], torch.optim.Adam]:
        """Stacked trainable parameters (leaves), the references' heads, one Adam over the parameters.

        The references are frozen and the prompts fixed: their mean and log-std heads
        (``[K, P, d]`` each) are computed here once, from the stacked reference parameters."""
        own = [dict(r.policy.named_parameters()) for r in self.rollouts]
        ref = [dict(r.reference.named_parameters()) for r in self.rollouts]
        params = {n: torch.stack([o[n].detach() for o in own]).requires_grad_(True) for n in self._names}
        reference = {n: torch.stack([r[n].detach() for r in ref]) for n in self._names}
        with torch.no_grad():
            reference_heads = self._heads(reference)
        optimizer = make_optimizer(params.values(), self.config)
        states = [m.optimizer.state_dict()["state"] for m in self.members]
        if any(states):
            steps = {float(s[i]["step"]) for s in states for i in s}
            if not all(len(s) == len(self._names) for s in states) or len(steps) != 1:
                raise RuntimeError("packed members must share their Adam step count (they train in lockstep)")
            for i, p in enumerate(params.values()):
                optimizer.state[p] = {
                    "step": states[0][i]["step"].clone(),
                    "exp_avg": torch.stack([s[i]["exp_avg"] for s in states]).to(p.device),
                    "exp_avg_sq": torch.stack([s[i]["exp_avg_sq"] for s in states]).to(p.device),
                }
        return params, reference_heads, optimizer

    def _heads(self, params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked ``params`` → every member's ``(mean, log_std)`` ``[K, P, d]`` for the prompts."""
        policy = self._module

        def heads(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return functional_call(policy, p, (self.prompts,))

        return vmap(heads)(params)

    def _unstack(self, params: dict[str, torch.Tensor], optimizer: torch.optim.Adam) -> None:
        """Write the stacks back into every member's policy and Adam."""
        with torch.no_grad():
            for k, (member, rollouts) in enumerate(zip(self.members, self.rollouts, strict=True)):
                own = dict(rollouts.policy.named_parameters())
                for n in self._names:
                    own[n].copy_(params[n][k])
                template = member.optimizer.state_dict()
                state = {}
                for i, p in enumerate(params.values()):
                    s = optimizer.state.get(p)
                    if s:
                        state[i] = {
                            "step": s["step"].clone(),
                            "exp_avg": s["exp_avg"][k].clone(),
                            "exp_avg_sq": s["exp_avg_sq"][k].clone(),
                        }
                member.optimizer.load_state_dict({"state": state, "param_groups": template["param_groups"]})

    # ---- training ------------------------------------------------------------------------
    def train_epochs(self, n_epochs: int) -> list[list[dict[str, Any]]]:
        """``n_epochs`` epochs for every member; per member, one metrics row per epoch."""
        params, reference_heads, optimizer = self._stack()
        rows: list[list[dict[str, Any]]] = [[] for _ in self.members]
        try:
            for _ in range(n_epochs):
                steps = [
                    self._step(params, reference_heads, optimizer) for _ in range(self.config.grpo.steps_per_epoch)
                ]
                for k, member in enumerate(self.members):
                    rows[k].append(member.end_epoch([s[k] for s in steps]))
        finally:
            self._unstack(params, optimizer)
        return rows

    def _forward(self, params: dict[str, torch.Tensor], ideas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked ``params``, ideas ``[K, P, G, d]`` → log-probs ``[K, P, G]``, entropies ``[K]``."""

        def one(p: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return functional_call(self._template, {f"policy.{n}": v for n, v in p.items()}, (self.prompts, x))

        return vmap(one)(params, ideas)

    def _step(
        self,
        params: dict[str, torch.Tensor],
        reference_heads: tuple[torch.Tensor, torch.Tensor],
        optimizer: torch.optim.Adam,
    ) -> list[StepStats]:
        """One GRPO step of every member (:meth:`Member.step`, with the policy work batched)."""
        cfg, members = self.config, self.members
        policy = self._policy
        n_prompts, group = len(self.prompts), cfg.grpo.group_size
        with torch.no_grad():
            heads = self._heads(params)  # (mean, log_std) [K, P, d]
            noise = torch.stack(
                [p.draw_noise(n_prompts, group, m.generator) for p, m in zip(self._samplers, members, strict=True)]
            ).to(heads[0].device)
            ideas = vmap(policy.ideas_from_noise)(*heads, noise)  # [K, P, G, d]
            old_logp = vmap(policy.log_prob_from)(*heads, ideas)  # from the sampling pass, as Member does
            ref_logp = vmap(policy.log_prob_from)(*reference_heads, ideas)
        samples = [
            Samples(ideas=ideas[k], old_logp=old_logp[k], ref_logp=ref_logp[k], n_prompts=n_prompts, group_size=group)
            for k in range(len(members))
        ]
        # Every member's archive request goes out before any answer is awaited: on Ray that is
        # one round-trip latency per step for the whole pack, not one per member.
        pending = [m.score_begin(s) for m, s in zip(members, samples, strict=True)]
        batches = [m.score_end(p) for m, p in zip(members, pending, strict=True)]
        scale = self.rollouts[0].entropy_scale  # maxent.entropy.per_dimension (VectorRollouts)
        entropy: torch.Tensor | None = None
        kls: list[torch.Tensor] = []
        for _ in range(cfg.grpo.updates_per_batch):
            logp, entropy = self._forward(params, ideas)
            if scale != 1:
                entropy = entropy * scale
            losses: list[torch.Tensor] = []
            kls = []
            for k, (member, batch) in enumerate(zip(members, batches, strict=True)):
                loss, kl = member.loss(batch, logp[k], entropy[k])
                losses.append(loss)
                kls.append(kl)
            optimizer.zero_grad(set_to_none=True)
            # Members are independent: each gets its own gradient. (torch leaves the parameters
            # of backward and of step's closure unannotated.)
            torch.stack(losses).sum().backward()  # pyright: ignore[reportUnknownMemberType]
            optimizer.step()  # pyright: ignore[reportUnknownMemberType]
        assert entropy is not None, "grpo.updates_per_batch is at least 1"
        return [m.finish_step(b, entropy[k], kls[k]) for k, (m, b) in enumerate(zip(members, batches, strict=True))]
