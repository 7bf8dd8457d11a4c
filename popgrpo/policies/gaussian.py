"""The paper's policy (§5): prompt embeddings → two-layer ReLU trunk → Gaussian heads."""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from popgrpo.core.entropy import gaussian_entropy

__all__ = ["PromptGaussianPolicy"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class PromptGaussianPolicy(nn.Module):
    """``π(x | c) = N(μ(c), diag σ(c)²)`` over ideas in R^d.

    Learnable prompt embeddings (``n_prompts × embed_dim``, 8 × 64 in the paper), a two-layer
    trunk (``hidden`` = 128 units, ReLU) and two linear heads for the mean and the log
    standard deviation. The heads start near zero (mean ≈ 0, log σ ≈ ``log_std_init``), so an
    untrained policy proposes ideas around the origin with norm ≈ √d. ``log σ`` is clamped to
    ``[log_std_min, log_std_max]`` to keep the Gaussian proper under strong entropy bonuses.
    """

    def __init__(
        self,
        idea_dim: int = 16,
        n_prompts: int = 8,
        embed_dim: int = 64,
        hidden: int = 128,
        log_std_init: float = 0.0,
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.n_prompts = n_prompts
        self.idea_dim = idea_dim
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        self.prompt_embedding = nn.Parameter(torch.empty(n_prompts, embed_dim))
        first, second = nn.Linear(embed_dim, hidden), nn.Linear(hidden, hidden)
        self.trunk = nn.Sequential(first, nn.ReLU(), second, nn.ReLU())
        self.mean_head = nn.Linear(hidden, idea_dim)
        self.log_std_head = nn.Linear(hidden, idea_dim)
        linears = (first, second, self.mean_head, self.log_std_head)  # in forward order
        self._init_parameters(linears, log_std_init, generator)
        # The layers' parameter dicts (not the tensors, which load_state_dict and functional_call
        # may replace), in forward order; a plain tuple, so not registered twice.
        self._layer_params = tuple(m._parameters for m in linears)

    @torch.no_grad()
    def _init_parameters(
        self, linears: tuple[nn.Linear, ...], log_std_init: float, generator: torch.Generator | None
    ) -> None:
        """Seeded init (``generator``) of the embedding and ``linears``, so members built from one seed start identical."""
        self.prompt_embedding.normal_(0.0, 1.0, generator=generator)
        for layer in linears:
            bound = 1.0 / math.sqrt(layer.in_features)  # torch's default Linear init range
            layer.weight.uniform_(-bound, bound, generator=generator)
            layer.bias.uniform_(-bound, bound, generator=generator)
        self.mean_head.weight.mul_(0.01)
        self.mean_head.bias.zero_()
        self.log_std_head.weight.mul_(0.01)
        self.log_std_head.bias.fill_(log_std_init)

    def forward(self, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[P]`` prompt ids → mean ``[P, d]`` and log-std ``[P, d]``.

        For a policy this small the framework costs more than the arithmetic, so the forward
        calls no ``nn.Module`` and reads each layer's parameters from its ``_parameters`` dict:
        ``Module.__call__`` and ``Module.__getattr__`` took about 40% of a forward here
        (profiled, docs/benchmarks/refactors.md). That dict is where ``load_state_dict`` writes and where
        ``torch.func.functional_call`` (packed members) swaps in its tensors, so both still see
        the weights they set.
        """
        first, second, mean_head, log_std_head = self._layers
        embedding = cast(torch.Tensor, self._parameters["prompt_embedding"])  # cast: torch types entries Optional
        h = F.relu(F.linear(embedding[prompts], *first))
        h = F.relu(F.linear(h, *second))
        log_std = F.linear(h, *log_std_head).clamp(self.log_std_min, self.log_std_max)
        return F.linear(h, *mean_head), log_std

    @property
    def _layers(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """``(weight, bias)`` of the two trunk layers, the mean head and the log-std head."""
        # cast: torch types _parameters' entries Optional; every layer here has a weight and a bias.
        return cast(
            "tuple[tuple[torch.Tensor, torch.Tensor], ...]", tuple((p["weight"], p["bias"]) for p in self._layer_params)
        )

    # The methods below call ``self.forward`` rather than ``self(...)``: the policy registers
    # no hooks, and ``Module.__call__``'s hook checks cost more than a layer of this size.
    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, group_size: int, generator: torch.Generator) -> torch.Tensor:
        mean, log_std = self.forward(prompts)
        noise = self.draw_noise(prompts.shape[0], group_size, generator).to(mean.device)
        return self.ideas_from_noise(mean, log_std, noise)

    def draw_noise(self, n_prompts: int, group_size: int, generator: torch.Generator) -> torch.Tensor:
        """``[P, G, d]`` standard normal draws, on the generator's (CPU) device: the same stream on any device."""
        return torch.randn((n_prompts, group_size, self.idea_dim), generator=generator)

    @staticmethod
    def ideas_from_noise(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """``mean [P, d]``, ``log_std [P, d]``, ``noise [P, G, d]`` → ideas ``[P, G, d]`` (reparameterised)."""
        return _reparameterise(mean, log_std.exp().unsqueeze(1), noise)

    @torch.no_grad()
    def sample_with_log_prob(
        self, prompts: torch.Tensor, group_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sample` and the ideas' log-probabilities from the same forward pass (no gradient).

        The same numbers as :meth:`ideas_from_noise` then :meth:`log_prob_from`, with σ = exp(log σ)
        computed once for both."""
        mean, log_std = self.forward(prompts)
        noise = self.draw_noise(prompts.shape[0], group_size, generator).to(mean.device)
        std = log_std.exp().unsqueeze(1)
        ideas = _reparameterise(mean, std, noise)
        return ideas, _log_density(mean, log_std, std, ideas)

    def log_prob(self, prompts: torch.Tensor, ideas: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.forward(prompts)
        return self.log_prob_from(mean, log_std, ideas)

    def log_prob_and_entropy(self, prompts: torch.Tensor, ideas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`log_prob` ``[P, G]`` and :meth:`entropy` ``[P, d]`` from one forward pass."""
        mean, log_std = self.forward(prompts)
        return self.log_prob_from(mean, log_std, ideas), gaussian_entropy(log_std)

    @staticmethod
    def log_prob_from(mean: torch.Tensor, log_std: torch.Tensor, ideas: torch.Tensor) -> torch.Tensor:
        """Diagonal-Gaussian log-density of ideas ``[P, G, d]`` under ``mean``, ``log_std`` ``[P, d]`` → ``[P, G]``."""
        return _log_density(mean, log_std, log_std.exp().unsqueeze(1), ideas)

    def entropy(self, prompts: torch.Tensor) -> torch.Tensor:
        """Per-dimension entropy in nats (see :func:`popgrpo.core.entropy.gaussian_entropy`)."""
        _, log_std = self.forward(prompts)
        return gaussian_entropy(log_std)


def _reparameterise(mean: torch.Tensor, std: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Ideas ``mean + σ·noise``: ``mean [P, d]``, ``std`` = exp(log σ) ``[P, 1, d]``, noise ``[P, G, d]`` → ``[P, G, d]``."""
    return mean.unsqueeze(1) + std * noise


def _log_density(mean: torch.Tensor, log_std: torch.Tensor, std: torch.Tensor, ideas: torch.Tensor) -> torch.Tensor:
    """``log N(ideas; mean, σ²)`` summed over d: ``mean``, ``log_std`` ``[P, d]``, ``std`` = exp(log σ) ``[P, 1, d]``, ideas ``[P, G, d]`` → ``[P, G]``."""
    z = (ideas - mean.unsqueeze(1)) / std
    return (-0.5 * z.pow(2) - log_std.unsqueeze(1) - _LOG_SQRT_2PI).sum(dim=-1)
