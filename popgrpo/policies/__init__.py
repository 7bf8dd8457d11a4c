"""Policies: what GRPO trains. Bring your own by implementing :class:`Policy`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["Policy", "make_policy"]


@runtime_checkable
class Policy(Protocol):
    """A prompt-conditioned sampler of ideas; an ``nn.Module`` so optimisers and state dicts work.

    ``P`` prompts, ``G`` ideas per prompt, ``d`` idea dimension.
    """

    n_prompts: int

    def sample(self, prompts: torch.Tensor, group_size: int, generator: torch.Generator) -> torch.Tensor:
        """``[P]`` prompt ids → ``[P, G, d]`` ideas (no gradient)."""

    def log_prob(self, prompts: torch.Tensor, ideas: torch.Tensor) -> torch.Tensor:
        """``[P]`` prompts, ``[P, G, d]`` ideas → ``[P, G]`` log-probabilities (with gradient)."""

    def sample_with_log_prob(
        self, prompts: torch.Tensor, group_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample`` and the samples' ``log_prob`` from one pass (no gradient)."""

    def log_prob_and_entropy(self, prompts: torch.Tensor, ideas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``log_prob`` and ``entropy`` from one pass (with gradient)."""

    def entropy(self, prompts: torch.Tensor) -> torch.Tensor:
        """``[P]`` → ``[P]`` policy entropy per prompt (with gradient)."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state_dict: dict) -> object: ...

    def parameters(self): ...


def make_policy(cfg, idea_dim: int, generator: torch.Generator | None = None) -> Policy:
    """Build the policy named by a :class:`popgrpo.config.PolicyConfig`, seeded by ``generator``."""
    if cfg.kind == "gaussian":
        from popgrpo.policies.gaussian import PromptGaussianPolicy

        fields = cfg.model_dump(exclude={"kind", "device", "causal_lm"})
        return PromptGaussianPolicy(idea_dim=idea_dim, generator=generator, **fields)
    if cfg.kind == "causal_lm":
        from popgrpo.policies.causal_lm import CausalLMPolicy

        return CausalLMPolicy(cfg.causal_lm, "cpu", generator)
    raise ValueError(f"unknown policy.kind {cfg.kind!r}")
