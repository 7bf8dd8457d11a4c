"""Policies: what GRPO trains. Bring your own by implementing :class:`Policy`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from popgrpo.registry import POLICIES

if TYPE_CHECKING:
    from popgrpo.config import PolicyConfig
    from popgrpo.policies.causal_lm import CausalLMPolicy

__all__ = ["Policy", "causal_lm_policy", "gaussian_policy", "make_policy"]


@runtime_checkable
class Policy(Protocol):
    """A prompt-conditioned sampler of ideas; an ``nn.Module`` so optimisers and state dicts work.

    ``P`` prompts, ``G`` ideas per prompt, ``d`` idea dimension.
    """

    n_prompts: int

    def sample(self, prompts: torch.Tensor, group_size: int, generator: torch.Generator) -> torch.Tensor:
        """``[P]`` prompt ids → ``[P, G, d]`` ideas (no gradient)."""
        ...

    def log_prob(self, prompts: torch.Tensor, ideas: torch.Tensor) -> torch.Tensor:
        """``[P]`` prompts, ``[P, G, d]`` ideas → ``[P, G]`` log-probabilities (with gradient)."""
        ...

    def sample_with_log_prob(
        self, prompts: torch.Tensor, group_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample`` and the samples' ``log_prob`` from one pass (no gradient)."""
        ...

    def log_prob_and_entropy(self, prompts: torch.Tensor, ideas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``log_prob`` and ``entropy`` from one pass (with gradient)."""
        ...

    def entropy(self, prompts: torch.Tensor) -> torch.Tensor:
        """``[P]`` → ``[P]`` policy entropy per prompt (with gradient)."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> object: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...


def make_policy(cfg: PolicyConfig, idea_dim: int, generator: torch.Generator | None = None) -> Policy:
    """Build the policy ``cfg.kind`` names (a :class:`popgrpo.config.PolicyConfig`), seeded by ``generator``.

    The name is looked up in :data:`popgrpo.registry.POLICIES`: ``gaussian``
    (:func:`gaussian_policy`), ``causal_lm`` (:func:`causal_lm_policy`: a language model, whose
    samples are texts, so not a :class:`Policy` of vector ideas) or a plugin's.
    """
    return POLICIES.get(cfg.kind)(cfg, idea_dim, generator)


def gaussian_policy(cfg: PolicyConfig, idea_dim: int, generator: torch.Generator | None = None) -> Policy:
    """``policy.kind=gaussian``: the paper's prompt-conditioned Gaussian policy (§5)."""
    from popgrpo.policies.gaussian import PromptGaussianPolicy

    fields = cfg.model_dump(exclude={"kind", "device", "causal_lm"})
    return PromptGaussianPolicy(idea_dim=idea_dim, generator=generator, **fields)


def causal_lm_policy(cfg: PolicyConfig, idea_dim: int, generator: torch.Generator | None = None) -> CausalLMPolicy:
    """``policy.kind=causal_lm``: a Hugging Face causal LM with LoRA adapters (``idea_dim`` unused)."""
    from popgrpo.policies.causal_lm import CausalLMPolicy

    del idea_dim
    return CausalLMPolicy(cfg.causal_lm, "cpu", generator)
