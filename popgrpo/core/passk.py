"""pass@k over problems, for a member and for a population (Chen et al. 2021, "Evaluating Large
Language Models Trained on Code", §2.1), in numpy.

For one problem with ``n`` samples of which ``c`` pass, the unbiased estimator of the chance that
at least one of ``k`` samples passes is::

    pass@k = 1 − C(n − c, k) / C(n, k)
           = 1 − ∏_{i = n − c + 1}^{n} (1 − k / i)        (the product Chen et al. compute,
                                                           which no factorial can overflow)

and 1 when ``n − c < k`` (every draw of ``k`` holds a pass). A set of problems reports the mean
over its problems. A **population's** pass@k pools its members' samples of each problem
(``n`` and ``c`` summed over the members that drew it) before the estimator, the same as one
policy's samples would be: it is the chance that ``k`` samples drawn from everything the
population wrote for a problem include a pass. Problems *solved* are those with ``c > 0``; the
population's are the union of its members' (:func:`population_summary`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["ProblemCounts", "mean_pass_at_k", "pool_counts", "population_summary", "unbiased_pass_at_k"]

ProblemCounts = Mapping[str, tuple[int, int]]
"""problem id → (n samples, c passing)."""


def unbiased_pass_at_k(n: ArrayLike, c: ArrayLike, k: int) -> NDArray[np.float64]:
    """The estimator of the module docstring for each pair of ``n`` and ``c`` (broadcast) → float64.

    Raises ``ValueError`` unless ``1 <= k <= n`` and ``0 <= c <= n`` everywhere.
    """
    n_arr, c_arr = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64))
    if k < 1 or (n_arr < k).any() or (c_arr < 0).any() or (c_arr > n_arr).any():
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n, got k={k}, n={n_arr.tolist()}, c={c_arr.tolist()}")
    out = np.ones(n_arr.shape, dtype=np.float64)
    for index in np.ndindex(n_arr.shape):  # pyright: ignore[reportUnknownVariableType]  # numpy's stub
        ni, ci = int(n_arr[index]), int(c_arr[index])
        if ni - ci >= k:
            out[index] = 1.0 - float(np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64)))
    return out


def mean_pass_at_k(counts: ProblemCounts, k: int) -> float:
    """Mean pass@k over the problems with at least ``k`` samples; NaN when there are none."""
    pairs = [(n, c) for n, c in counts.values() if n >= k]
    if not pairs:
        return math.nan
    n = np.array([p[0] for p in pairs], dtype=np.int64)
    c = np.array([p[1] for p in pairs], dtype=np.int64)
    return float(unbiased_pass_at_k(n, c, k).mean())


def pool_counts(members: Sequence[ProblemCounts]) -> dict[str, tuple[int, int]]:
    """Each problem's ``(n, c)`` summed over the members that sampled it."""
    pooled: dict[str, tuple[int, int]] = {}
    for counts in members:
        for problem, (n, c) in counts.items():
            pn, pc = pooled.get(problem, (0, 0))
            pooled[problem] = (pn + n, pc + c)
    return pooled


def population_summary(
    members: Sequence[ProblemCounts], solutions: Sequence[Mapping[str, Sequence[str]]], k: int
) -> dict[str, float]:
    """A population's pass@k and problems solved next to its best member's, and its distinct solutions.

    ``members``: each member's counts; ``solutions``: each member's keys of distinct correct
    solutions per problem (:func:`popgrpo.envs.problems.solution_key`). Returns
    ``population_pass_at_1`` and ``population_pass_at_k`` (pooled samples, the mean over the
    problems with ``n >= k``), ``best_member_pass_at_k`` (the highest member's own),
    ``population_solved`` (problems some member solved), ``best_member_solved`` and
    ``population_distinct_correct`` (distinct correct solutions, all members' together, per
    problem solved; NaN when none is).
    """
    pooled = pool_counts(members)
    own = [mean_pass_at_k(counts, k) for counts in members]
    own = [v for v in own if not math.isnan(v)]
    union: dict[str, set[str]] = {}
    for member in solutions:
        for problem, keys in member.items():
            union.setdefault(problem, set()).update(keys)
    solved = [problem for problem, (_, c) in pooled.items() if c > 0]
    distinct = [len(union.get(problem, ())) for problem in solved]
    return {
        "population_pass_at_1": mean_pass_at_k(pooled, 1),
        "population_pass_at_k": mean_pass_at_k(pooled, k),
        "best_member_pass_at_k": max(own) if own else math.nan,
        "population_solved": float(len(solved)),
        "best_member_solved": float(max((sum(c > 0 for _, c in m.values()) for m in members), default=0)),
        "population_distinct_correct": float(np.mean(distinct)) if distinct else math.nan,
    }
