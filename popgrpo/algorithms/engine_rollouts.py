"""Completions from a shared rollout engine: the member's side and the worker's bookkeeping.

With ``policy.causal_lm.rollout`` on a worker (:meth:`~popgrpo.config.RolloutConfig.on_worker`)
a language-model member does not generate with its own model. Its :class:`EngineSampler`
pushes the member's LoRA adapter to a :class:`RolloutService` whenever the weights changed
since the last push (after each update, and after the scheduler's merge: a merge is one more
push), asks it for the completions of the step's prompts, and builds the same
:class:`~popgrpo.policies.causal_lm.Rollout` the member's own ``generate`` would, plus the
engine's log-probs of the sampled tokens, which the loss compares with the trainer's own
(truncated importance sampling, :mod:`popgrpo.core.tis`).

:class:`RolloutServer` is the service itself: one :class:`~popgrpo.policies.engines.RolloutEngine`
and each member's latest adapter version. The Ray actor that holds it for a distributed run
is :class:`popgrpo.runtime.rollout_worker.RolloutWorker`; :class:`popgrpo.runtime.executor.LocalExecutor`
holds one in its own process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from popgrpo.config import Config
from popgrpo.core.tensor_lists import int_list
from popgrpo.policies.causal_lm import CausalLMPolicy, Rollout, draw_seed
from popgrpo.policies.engines import Generation, RolloutEngine, Sampling
from popgrpo.registry import ROLLOUT_ENGINES

__all__ = ["EngineSampler", "RolloutServer", "RolloutService", "completion_tensors", "rollout_server"]


class RolloutService(Protocol):
    """What a member asks of the shared rollout worker (in-process, or a Ray actor's client)."""

    def push_adapter(self, member_id: int, version: int, adapter_state: Mapping[str, torch.Tensor]) -> bool:
        """Make version ``version`` of ``member_id``'s adapter the one it generates with; False
        (and nothing changes) when the worker holds that version or a later one already."""
        ...

    def generate(self, member_id: int, prompts: list[list[int]], sampling: Sampling) -> Generation:
        """``sampling.n`` completions of each prompt (token ids) with ``member_id``'s latest adapter."""
        ...

    def latest_version(self, member_id: int) -> int:
        """The version of ``member_id``'s adapter the worker holds; 0 when it has none."""
        ...


class RolloutServer:
    """One engine for the whole population and each member's latest adapter version.

    A push older than (or equal to) the version held is stale, from a message that overtook
    another, and is ignored; generating for a member that never pushed is a ``KeyError``.
    """

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.versions: dict[int, int] = {}

    def push_adapter(self, member_id: int, version: int, adapter_state: Mapping[str, torch.Tensor]) -> bool:
        if version <= self.versions.get(member_id, 0):
            return False
        self.engine.load_adapter(member_id, version, adapter_state)
        self.versions[member_id] = version
        return True

    def generate(self, member_id: int, prompts: list[list[int]], sampling: Sampling) -> Generation:
        if member_id not in self.versions:
            raise KeyError(f"member {member_id} has pushed no adapter to the rollout worker")
        return self.engine.generate(prompts, member_id, sampling)

    def latest_version(self, member_id: int) -> int:
        return self.versions.get(member_id, 0)

    def adapter_versions(self) -> dict[int, int]:
        """Each member's latest adapter version."""
        return dict(self.versions)


def rollout_server(config: Config, device: str | torch.device = "cpu") -> RolloutServer | None:
    """The rollout worker's server for ``config``: its engine built from ``policy.causal_lm.rollout.engine``
    (:data:`~popgrpo.registry.ROLLOUT_ENGINES`); None when no worker is configured. Only a policy
    kind that generates on a worker asks (:meth:`PolicyKind.uses_rollout_worker
    <popgrpo.algorithms.policy_kinds.PolicyKind.uses_rollout_worker>`)."""
    cfg = config.policy.causal_lm
    if not cfg.rollout.on_worker():
        return None
    return RolloutServer(ROLLOUT_ENGINES.get(cfg.rollout.engine)(cfg, torch.device(device)))


def completion_tensors(generation: Generation, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An engine's ragged answer as ``[N, T]`` tensors: the tokens (padded with ``pad_token_id``),
    the completion mask (bool, 1 on each completion's own tokens) and the engine's log-probs (0
    after a completion's end); ``T`` is the longest completion."""
    n = len(generation.token_ids)
    width = max((len(t) for t in generation.token_ids), default=0)
    tokens = torch.full((n, width), pad_token_id, dtype=torch.long)
    logp = torch.zeros((n, width), dtype=torch.float32)
    mask = torch.zeros((n, width), dtype=torch.bool)
    for i, (ids, values) in enumerate(zip(generation.token_ids, generation.logprobs, strict=True)):
        if len(ids) != len(values):
            raise ValueError(f"completion {i}: {len(ids)} tokens but {len(values)} log-probs")
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        logp[i, : len(ids)] = torch.tensor(values, dtype=torch.float32)
        mask[i, : len(ids)] = True
    return tokens, mask, logp


class EngineSampler:
    """A member's completions from a :class:`RolloutService`, with its adapter pushed when it changed.

    Args:
        service: the shared rollout worker.
        member_id: whose adapter the worker uses.
        policy: the member's policy: its adapter weights are pushed, its tokenizer encodes the
            prompts and decodes the completions.
    """

    def __init__(self, service: RolloutService, member_id: int, policy: CausalLMPolicy) -> None:
        self.service = service
        self.member_id = member_id
        self.policy = policy
        self.version: int | None = None  # of the last adapter pushed; None: none yet
        self._pushed: dict[str, torch.Tensor] | None = None

    def push(self) -> bool:
        """Push the member's adapter as the next version when it differs from the last one pushed.

        The first push numbers on from the version the worker holds for this member (a member
        rebuilt after its process was lost continues its predecessor's numbering, so its pushes
        are never taken for stale ones)."""
        state = self.policy.state_dict()
        if self._pushed is not None and all(torch.equal(state[k], self._pushed[k]) for k in state):
            return False
        if self.version is None:
            self.version = self.service.latest_version(self.member_id)
        self.version += 1
        self.service.push_adapter(self.member_id, self.version, state)
        self._pushed = state
        return True

    @torch.no_grad()
    def rollout(self, prompts: list[str], group_size: int, generator: torch.Generator) -> tuple[Rollout, torch.Tensor]:
        """``group_size`` completions of each prompt from the worker, prompt-major, and the engine's
        ``[N, T]`` log-probs of their tokens. The seed is drawn from ``generator`` as the
        member's own :meth:`~popgrpo.policies.causal_lm.CausalLMPolicy.rollout` draws it."""
        self.push()
        policy, cfg = self.policy, self.policy.cfg
        input_ids, attention = policy.encode(prompts)
        rows = [int_list(ids[mask.bool()]) for ids, mask in zip(input_ids, attention, strict=True)]
        seed = draw_seed(generator)
        sampling = Sampling(n=group_size, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=seed)
        generation = self.service.generate(self.member_id, rows, sampling)
        if len(generation.token_ids) != len(prompts) * group_size:
            raise ValueError(
                f"the rollout engine answered {len(generation.token_ids)} completions for "
                f"{len(prompts)} prompts × {group_size}"
            )
        completion, mask, logp = completion_tensors(generation, policy.pad_token_id)
        input_ids = input_ids.repeat_interleave(group_size, dim=0).to(policy.device)
        attention = attention.repeat_interleave(group_size, dim=0).to(policy.device)
        rollout = policy.rollout_of(prompts, input_ids, attention, completion, mask, group_size)
        return rollout, logp.to(policy.device)
