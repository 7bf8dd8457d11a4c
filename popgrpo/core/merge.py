"""Weight-space merging: model soup, Gaussian perturbation, WiSE-FT interpolation.

State dicts are ``{name: tensor}`` mappings with the same keys and shapes. Functions return
new tensors and never modify their inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

__all__ = ["perturb", "soup", "wise_ft"]

StateDict = Mapping[str, torch.Tensor]


def soup(state_dicts: Sequence[StateDict], weights: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """Weighted mean of state dicts (model soup, Wortsman et al. 2022); uniform by default.

    ``θ = Σ_k w_k θ_k / Σ_k w_k``. Weights must be non-negative with a positive sum.
    """
    if not state_dicts:
        raise ValueError("soup needs at least one state dict")
    if weights is None:
        weights = [1.0] * len(state_dicts)
    if len(weights) != len(state_dicts):
        raise ValueError(f"{len(weights)} weights for {len(state_dicts)} state dicts")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"soup weights must be >= 0 with a positive sum, got {list(weights)}")
    w = w / w.sum()
    keys = list(state_dicts[0].keys())
    for sd in state_dicts[1:]:
        if list(sd.keys()) != keys:
            raise ValueError("state dicts in a soup must have the same keys")
    out = {}
    for key in keys:
        stacked = torch.stack([sd[key].to(torch.float64) for sd in state_dicts])
        mixed = torch.tensordot(w, stacked, dims=1)
        out[key] = mixed.to(state_dicts[0][key].dtype)
    return out


def perturb(state_dict: StateDict, sigma: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``θ + σ·ε`` with ``ε ~ N(0, I)`` drawn from ``generator``, for every floating tensor.

    Pop-GRPO's re-seeding step (σ_p = 0.01 in the main paper). Integer buffers pass through.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    out = {}
    for key, value in state_dict.items():
        if value.is_floating_point() and sigma > 0:
            noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
            out[key] = value + sigma * noise
        else:
            out[key] = value.clone()
    return out


def wise_ft(early: StateDict, late: StateDict, delta: float) -> dict[str, torch.Tensor]:
    """WiSE-FT interpolation ``δ·θ_early + (1 − δ)·θ_late`` (Wortsman et al. 2022, §3.2).

    ``delta = 0`` returns the late weights, ``delta = 1`` the early ones.
    """
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    if early.keys() != late.keys():
        raise ValueError("early and late state dicts must have the same keys")
    return {k: delta * early[k] + (1.0 - delta) * late[k] for k in late}
