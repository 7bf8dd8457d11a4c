"""Pure torch/numpy math of popgrpo. Never imports Ray (a test checks it imports without).

Modules: :mod:`~popgrpo.core.grpo` (advantages, surrogate, KL), :mod:`~popgrpo.core.archive`
(MAP-Elites), :mod:`~popgrpo.core.novelty` (k-NN novelty), :mod:`~popgrpo.core.entropy`
(entropy and adaptive α), :mod:`~popgrpo.core.metrics`, :mod:`~popgrpo.core.merge`
(soup, perturbation, WiSE-FT), :mod:`~popgrpo.core.selection` (Pop-GRPO score, top-M).
"""

from popgrpo.core.archive import MapElitesArchive
from popgrpo.core.entropy import AdaptiveAlpha, alpha_dual_step, gaussian_entropy
from popgrpo.core.grpo import binned_advantages, clipped_surrogate, group_advantages, kl_penalty
from popgrpo.core.merge import perturb, soup, wise_ft
from popgrpo.core.metrics import complexity, pairwise_diversity, pass_at_k
from popgrpo.core.novelty import NoveltyMemory
from popgrpo.core.selection import pop_score, select_top_m

__all__ = [
    "AdaptiveAlpha",
    "MapElitesArchive",
    "NoveltyMemory",
    "alpha_dual_step",
    "binned_advantages",
    "clipped_surrogate",
    "complexity",
    "gaussian_entropy",
    "group_advantages",
    "kl_penalty",
    "pairwise_diversity",
    "pass_at_k",
    "perturb",
    "pop_score",
    "select_top_m",
    "soup",
    "wise_ft",
]
