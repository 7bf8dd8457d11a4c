"""Repulsion from fitter members' behaviours: a kernel penalty on the returns (niching, taboo regions).

A member that is told where fitter members search (the centroids ``c_j`` of their groups'
behaviour descriptors) has each idea's return lowered by a Gaussian kernel of its
behaviour's distance to the nearest of them::

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

__all__ = ["group_centroids", "repulsion_penalty"]


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


def group_centroids(behaviours: torch.Tensor) -> list[list[float]]:
    """Each group's mean descriptor: ``behaviours [S, P, G, B]`` (S steps of P groups of G ideas) → ``[P][B]``.

    A member's behaviour in one epoch, one centre per prompt (a vector policy has one search
    distribution per prompt, so a single mean would sit between its modes). Ideas with a NaN
    descriptor are left out; a group with none gives NaNs.
    """
    b = behaviours.to(torch.float64)
    keep = ~b.isnan().any(dim=-1, keepdim=True)  # [S, P, G, 1]
    total = torch.where(keep, b, 0.0).sum(dim=(0, 2))  # [P, B]
    count = keep.sum(dim=(0, 2)).to(torch.float64)  # [P, 1]
    return [float_list(row) for row in total / count]  # 0/0 = NaN
