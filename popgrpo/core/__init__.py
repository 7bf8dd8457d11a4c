"""Pure torch/numpy math of popgrpo. Never imports Ray (a test checks it imports without).

Modules: :mod:`~popgrpo.core.grpo` (advantages, surrogate, KL), :mod:`~popgrpo.core.archive`
(MAP-Elites), :mod:`~popgrpo.core.novelty` (k-NN novelty), :mod:`~popgrpo.core.entropy`
(entropy and adaptive α), :mod:`~popgrpo.core.metrics` (diversity, complexity, pass@k, best@k),
:mod:`~popgrpo.core.discovery` (best noise-free value, peaks reached, samples to first discovery),
:mod:`~popgrpo.core.merge` (soups, WiSE-FT, task arithmetic; Gaussian and SVD mutations),
:mod:`~popgrpo.core.selection` (Pop-GRPO score, top-M, cyclic objectives),
:mod:`~popgrpo.core.repulsion` (the repulsion kernel of the population mechanism).
"""

from popgrpo.core.archive import MapElitesArchive
from popgrpo.core.entropy import AdaptiveAlpha, alpha_dual_step, gaussian_entropy
from popgrpo.core.grpo import (
    binned_advantages,
    clipped_surrogate,
    clipped_terms,
    group_advantages,
    kl_penalty,
    masked_aggregate,
    token_clipped_surrogate,
)
from popgrpo.core.merge import (
    GaussianMutation,
    SvdMutation,
    greedy_soup,
    mutate,
    perturb,
    score_weights,
    soup,
    svd_mutate,
    task_arithmetic,
    task_vector,
    weighted_soup,
    wise_ft,
)
from popgrpo.core.metrics import (
    best_at_k,
    complexity,
    group_pass_best_at_k,
    group_pass_best_at_k_batches,
    pairwise_diversity,
    pairwise_diversity_batches,
    pass_at_k,
    pass_at_k_rows,
)
from popgrpo.core.novelty import NoveltyMemory
from popgrpo.core.selection import cyclic_objective, objective_scores, pop_score, select_top_m

__all__ = [
    "AdaptiveAlpha",
    "GaussianMutation",
    "MapElitesArchive",
    "NoveltyMemory",
    "SvdMutation",
    "alpha_dual_step",
    "best_at_k",
    "binned_advantages",
    "clipped_surrogate",
    "clipped_terms",
    "complexity",
    "cyclic_objective",
    "gaussian_entropy",
    "greedy_soup",
    "group_advantages",
    "group_pass_best_at_k",
    "group_pass_best_at_k_batches",
    "kl_penalty",
    "masked_aggregate",
    "mutate",
    "objective_scores",
    "pairwise_diversity",
    "pairwise_diversity_batches",
    "pass_at_k",
    "pass_at_k_rows",
    "perturb",
    "pop_score",
    "score_weights",
    "select_top_m",
    "soup",
    "svd_mutate",
    "task_arithmetic",
    "task_vector",
    "token_clipped_surrogate",
    "weighted_soup",
    "wise_ft",
]
