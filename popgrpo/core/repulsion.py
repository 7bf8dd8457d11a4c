"""Repulsion from fitter members' behaviours: a kernel penalty on the returns (niching, taboo regions).

A member that is told where fitter members earn their returns (``c_j``: the behaviour
descriptors of the best idea of each of their groups, :func:`group_best`) has each idea's
return lowered by a Gaussian kernel of its behaviour's distance to the nearest of them::

    r'(x) = r(x) − s · max_j exp(−‖b(x) − c_j‖² / (2 h²))

with strength ``s`` and bandwidth ``h`` in behaviour space ([0, 1]²). This is the taboo
region of niching evolution strategies (NEA2, Preuss 2012; RS-CMSA, Ahrari et al. 2017: a
subpopulation is kept out of the basins that better subpopulations already occupy), written
as a smooth penalty as in the repulsive kernel term of SVGD (Liu & Wang 2016) and the
population-diversity objective of DvD (Parker-Holder et al. 2020). The penalty only shapes
what the member learns from; the archive and the metrics keep the raw rewards.
"""

from __future__ import annotations

import torch

from popgrpo.core.tensor_lists import float_list

__all__ = ["group_best", "repulsion_penalty"]


def repulsion_penalty(
    behaviours: torch.Tensor, centres: torch.Tensor, strength: float, bandwidth: float
) -> torch.Tensor:
    """``s · max_j exp(−‖b_i − c_j‖² / (2h²))`` for each idea: ``behaviours [N, B]``, ``centres [M, B]`` → ``[N]``.

    The nearest centre counts (a taboo region is entered or not), so the penalty lies in
    ``[0, s]`` whatever the number of centres: ``s`` on a centre, ``s·e^{-2}`` at distance ``2h``.
    ``M = 0`` (nobody to avoid) gives zeros.
    """
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    if centres.numel() == 0:
        return torch.zeros(behaviours.shape[0], dtype=behaviours.dtype)
    sq_dist = torch.cdist(behaviours.to(torch.float64), centres.to(torch.float64)).pow(2)  # [N, M]
    nearest = sq_dist.min(dim=1).values
    return (strength * torch.exp(-nearest / (2.0 * bandwidth**2))).to(behaviours.dtype)


def group_best(behaviours: torch.Tensor, rewards: torch.Tensor) -> list[list[float]]:
    """Where each group found its best idea: ``behaviours [S, P, G, B]``, ``rewards [S, P, G]`` → ``[P][B]``.

    For each of the P groups (one per prompt), the descriptor of its highest-reward idea over
    the S steps (a member's behaviour "at the returns": where it earns its fitness). Ideas
    with a non-finite reward or descriptor are left out; a group with none gives NaNs.
    """
    s, p, g, b = behaviours.shape
    flat_b = behaviours.to(torch.float64).permute(1, 0, 2, 3).reshape(p, s * g, b)
    flat_r = rewards.to(torch.float64).permute(1, 0, 2).reshape(p, s * g)
    usable = torch.isfinite(flat_r) & ~flat_b.isnan().any(dim=-1)
    best = torch.where(usable, flat_r, -torch.inf).argmax(dim=1)  # [P]
    picked = flat_b[torch.arange(p), best]  # [P, B]
    picked = torch.where(usable.any(dim=1, keepdim=True), picked, torch.nan)
    return [float_list(row) for row in picked]
