"""Gaussian policy entropy and the adaptive entropy coefficient α (main paper eq. 4)."""

from __future__ import annotations

import math

import torch

__all__ = ["AdaptiveAlpha", "alpha_dual_step", "gaussian_entropy"]

_HALF_LOG_2PI_E = 0.5 * math.log(2.0 * math.pi * math.e)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Differential entropy of a diagonal Gaussian, in nats *per dimension*.

    ``H = mean_d (½ log(2πe) + log σ_d)`` over the last dimension, so ``log_std`` of shape
    ``[..., d]`` gives ``[...]``. Per dimension rather than summed so that the target H*
    means the same thing whatever the idea dimension: H* = 1.0 (the paper's default) is
    reached at σ = e^(1 − 1.419) ≈ 0.66; a unit Gaussian has H ≈ 1.419.
    """
    return _HALF_LOG_2PI_E + log_std.mean(dim=-1)


def alpha_dual_step(alpha: float, entropy: float, target: float, lr: float) -> float:
    """One projected dual-gradient step on ``α · (H − H*)`` (eq. 4), keeping α ≥ 0.

    The gradient of the dual objective with respect to α is ``H − H*``: when entropy sits
    below the target α grows (more entropy bonus), above it α shrinks towards 0.
    """
    return max(0.0, alpha - lr * (entropy - target))


class AdaptiveAlpha:
    """α with its own state, tuned by :func:`alpha_dual_step` once per GRPO step.

    Args:
        target: target entropy H* in nats per dimension (1.0 in the paper).
        init: starting α.
        lr: dual step size.
    """

    def __init__(self, target: float = 1.0, init: float = 0.0, lr: float = 0.01) -> None:
        if init < 0 or lr < 0:
            raise ValueError(f"alpha init and lr must be >= 0, got init={init}, lr={lr}")
        self.target = target
        self.value = float(init)
        self.lr = lr

    def update(self, entropy: float) -> float:
        self.value = alpha_dual_step(self.value, float(entropy), self.target, self.lr)
        return self.value
