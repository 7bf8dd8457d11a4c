"""The statistics every study report uses: paired tests, Holm, bootstrap effect sizes, TOST, verdicts.

A study compares two arms on paired units (the same seed, and landscape instance, in both
arms) and states claims about the paired differences ``d = a − b``. One claim is judged so:

1. **Test** ``mean d = 0`` two-sided: the paired t-test (:func:`paired_test`; the Wilcoxon
   signed-rank test is reported beside it and may be chosen instead).
2. **Correct** across the family of claims a report makes together with Holm's step-down
   method (:func:`holm`, statsmodels' ``multipletests``): controls the family-wise error rate
   without assuming independence (claims that reuse the same seeds are not independent).
3. **Equivalence** where the difference is not significant: two one-sided t-tests (TOST,
   :func:`tost_paired`) against a margin ``±m`` stated with the claim, Holm-corrected across
   the family as well. "No difference" is claimed only when TOST rejects, never from a large p.
4. **Effect size**: the mean difference with a bootstrap confidence interval over the paired
   units (:func:`bootstrap_ci`), or, where units are seeds nested in landscape instances, a
   hierarchical bootstrap that resamples instances, then seeds within each
   (:func:`hierarchical_bootstrap_ci`); and Cohen's ``d_z = mean d / sd d``.

:func:`judge` does all four for a family of :class:`Claim` and returns one :class:`Verdict`
each, whose :attr:`Verdict.word` is the one wording reports use: ``better``, ``worse``,
``equivalent within ±m`` or ``inconclusive`` (a significant difference that TOST also bounds
inside the margin adds ``, within ±m``). :func:`verdicts_markdown` and
:meth:`Verdict.record` (for ``verdicts.json``) format them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats

__all__ = [
    "ALPHA",
    "Claim",
    "Equivalence",
    "PairedTest",
    "Verdict",
    "bootstrap_ci",
    "hierarchical_bootstrap_ci",
    "holm",
    "judge",
    "paired_test",
    "tost_paired",
    "verdicts_markdown",
]

ALPHA = 0.05
"""The family-wise error rate of every verdict unless a report states another."""

VerdictWord = Literal["better", "worse", "equivalent", "inconclusive"]


def _p_of(result: Any) -> float:
    """A scipy test result's p-value (its annotations leave some results' ``pvalue`` out)."""
    return float(result.pvalue)


def _diffs(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """``a − b`` as a float array (``a`` itself when ``b`` is None); pairs with a NaN are dropped."""
    d = np.asarray(a, dtype=float) if b is None else np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return d[~np.isnan(d)]


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison of ``n`` differences: their mean and spread, two tests, an effect size."""

    n: int
    mean: float  # mean difference
    sd: float  # its standard deviation (ddof 1); NaN when n < 2
    t_p: float  # two-sided paired t-test p (NaN when undefined: n < 2, or every difference 0)
    wilcoxon_p: float  # two-sided Wilcoxon signed-rank p (NaN when undefined)
    dz: float  # Cohen's d_z = mean / sd (±inf when sd is 0 and the mean is not)


def paired_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray | None = None) -> PairedTest:
    """Paired t and Wilcoxon tests of ``a − b`` (``[n]`` each; ``a`` alone: already differences)."""
    d = _diffs(a, b)
    n = len(d)
    mean = float(d.mean()) if n else math.nan
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    t_p = wilcoxon_p = math.nan
    if n > 1 and sd > 0:
        t_p = _p_of(stats.ttest_1samp(d, 0.0))
    elif n > 1 and mean != 0:
        t_p = 0.0  # every difference the same non-zero value: t = ±inf
    if n > 0 and np.any(d != 0):
        wilcoxon_p = _p_of(stats.wilcoxon(d))
    if n > 1 and sd > 0:
        dz = mean / sd
    elif n > 1 and mean != 0:
        dz = math.copysign(math.inf, mean)
    else:
        dz = math.nan
    return PairedTest(n=n, mean=mean, sd=sd, t_p=t_p, wilcoxon_p=wilcoxon_p, dz=dz)


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> tuple[list[float], list[bool]]:
    """Holm-adjusted p-values of a family and which hypotheses are rejected at ``alpha``.

    ``min(1, max_{j ≤ i} (m − j + 1)·p_(j))`` for the ``i``-th smallest p of ``m``
    (statsmodels' ``multipletests(method="holm")``). A NaN p (a test that could not be done)
    still counts in ``m``, as a p of 1, and its adjusted value is NaN.
    """
    from statsmodels.stats.multitest import multipletests

    if not pvalues:
        return [], []
    raw = np.asarray(pvalues, dtype=float)
    reject, adjusted, _, _ = multipletests(np.where(np.isnan(raw), 1.0, raw), alpha=alpha, method="holm")
    adjusted = np.where(np.isnan(raw), np.nan, np.asarray(adjusted, dtype=float))
    return [float(p) for p in adjusted], [bool(r) and not math.isnan(p) for r, p in zip(reject, raw, strict=True)]


@dataclass(frozen=True)
class Equivalence:
    """TOST of ``|mean d| < margin``: ``p`` is the larger of the two one-sided p-values."""

    margin: float
    p: float
    p_lower: float  # H0: mean ≤ −margin
    p_upper: float  # H0: mean ≥ +margin


def tost_paired(
    a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray | None = None, *, margin: float
) -> Equivalence:
    """Two one-sided paired t-tests (Schuirmann's TOST) that ``a − b`` lies within ``±margin``.

    Equivalence is shown at level α when ``p < α`` (both one-sided tests reject). With every
    difference equal (sd 0) the test is decided by where that value lies: p 0 inside the
    margin, 1 outside; fewer than two differences give NaN.
    """
    if margin <= 0:
        raise ValueError(f"equivalence margin must be > 0, got {margin}")
    d = _diffs(a, b)
    if len(d) < 2:
        return Equivalence(margin, math.nan, math.nan, math.nan)
    if float(d.std(ddof=1)) == 0.0:
        lower, upper = float(d[0] <= -margin), float(d[0] >= margin)
        return Equivalence(margin, max(lower, upper), lower, upper)
    lower = _p_of(stats.ttest_1samp(d, -margin, alternative="greater"))
    upper = _p_of(stats.ttest_1samp(d, margin, alternative="less"))
    return Equivalence(margin, max(lower, upper), lower, upper)


def bootstrap_ci(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray | None = None,
    *,
    statistic: Callable[..., Any] = np.mean,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``statistic`` of the paired differences ``a − b``.

    ``scipy.stats.bootstrap`` over the ``n`` paired units, seeded. Percentile, not BCa: it is
    defined for the few seeds a study has (BCa's jackknife degenerates there) and it is what
    :func:`hierarchical_bootstrap_ci` computes too. NaN bounds for fewer than two differences.
    """
    d = _diffs(a, b)
    if len(d) < 2 or np.all(d == d[0]):
        return (float(d[0]), float(d[0])) if len(d) >= 2 else (math.nan, math.nan)
    result = stats.bootstrap(
        (d,),
        statistic,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def hierarchical_bootstrap_ci(
    diffs: Sequence[float] | np.ndarray,
    groups: Sequence[Hashable],
    *,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile CI of the mean difference when units (seeds) are nested in groups (landscape instances).

    Each resample draws as many groups as there are, with replacement, then within each drawn
    group as many of its differences as it has, with replacement, and takes the mean of all
    drawn differences. Both levels of variation reach the interval, so a gain carried by one
    landscape instance gives a wide one. ``diffs [n]`` and ``groups [n]`` (a label per unit).
    """
    d = np.asarray(diffs, dtype=float)
    labels = list(groups)
    if len(labels) != len(d):
        raise ValueError(f"{len(d)} differences but {len(labels)} group labels")
    members = [d[[i for i, g in enumerate(labels) if g == label]] for label in dict.fromkeys(labels)]
    if len(d) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(members), size=(n_resamples, len(members)))  # [R, G] group draws
    sums = np.zeros(n_resamples)
    counts = np.zeros(n_resamples)
    for slot in range(len(members)):
        for g, values in enumerate(members):
            rows = np.flatnonzero(chosen[:, slot] == g)
            if rows.size:
                draws = values[rng.integers(0, len(values), size=(rows.size, len(values)))]
                sums[rows] += draws.sum(axis=1)
                counts[rows] += len(values)
    means = sums / counts
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Claim:
    """One comparison a report states: arm ``a`` against arm ``b`` on paired units.

    ``diffs`` are the paired differences ``a − b`` per unit (seed), in the metric's units;
    ``higher_is_better`` says which sign is "better"; ``margin`` is the equivalence margin in
    the same units, stated before looking at the result; ``groups`` (optional, one label per
    unit: the landscape instance) switches the confidence interval to the hierarchical
    bootstrap; ``test`` picks the test whose p enters the family: ``t`` or ``wilcoxon``.
    """

    name: str
    diffs: tuple[float, ...]
    margin: float
    higher_is_better: bool = True
    groups: tuple[Hashable, ...] | None = None
    test: Literal["t", "wilcoxon"] = "t"

    @classmethod
    def paired(
        cls,
        name: str,
        a: Sequence[float] | np.ndarray,
        b: Sequence[float] | np.ndarray,
        margin: float,
        **kwargs: Any,
    ) -> Claim:
        """The claim of arms ``a [n]`` and ``b [n]``, paired by position."""
        if len(a) != len(b):
            raise ValueError(f"{name}: {len(a)} against {len(b)} values; a paired claim needs one of each per unit")
        diffs = tuple(float(x) - float(y) for x, y in zip(a, b, strict=True))
        return cls(name=name, diffs=diffs, margin=margin, **kwargs)


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` concluded of a :class:`Claim` within its family."""

    claim: Claim
    test: PairedTest
    ci: tuple[float, float]  # confidence interval of the mean difference
    p: float  # the claim's test's raw two-sided p
    p_holm: float  # Holm-adjusted across the family
    p_tost: float  # TOST p, Holm-adjusted across the family
    outcome: VerdictWord
    alpha: float = ALPHA
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def within_margin(self) -> bool:
        """TOST rejected too: the difference, whatever its sign, is smaller than the margin."""
        return self.p_tost < self.alpha

    @property
    def word(self) -> str:
        """The verdict as reports write it: better, worse, ``equivalent within ±m``, inconclusive.

        A significant difference that TOST also bounds inside the margin (real, but smaller
        than what the claim counts as a difference) reads ``better, within ±m`` / ``worse, within ±m``.
        """
        margin = f"within ±{self.claim.margin:g}"
        if self.outcome == "equivalent":
            return f"equivalent {margin}"
        if self.outcome in ("better", "worse") and self.within_margin:
            return f"{self.outcome}, {margin}"
        return self.outcome

    def record(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict (``verdicts.json``): NaN becomes None."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else float(x)

        return {
            "claim": self.claim.name,
            "n": self.test.n,
            "mean_diff": num(self.test.mean),
            "ci_low": num(self.ci[0]),
            "ci_high": num(self.ci[1]),
            "dz": None if math.isnan(self.test.dz) or math.isinf(self.test.dz) else self.test.dz,
            "test": self.claim.test,
            "p": num(self.p),
            "p_holm": num(self.p_holm),
            "margin": self.claim.margin,
            "p_tost_holm": num(self.p_tost),
            "alpha": self.alpha,
            "outcome": self.outcome,
            "verdict": self.word,
            **self.extra,
        }


def judge(
    claims: Sequence[Claim],
    *,
    alpha: float = ALPHA,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
) -> list[Verdict]:
    """Verdicts of a family of claims, corrected together.

    A claim is ``better`` or ``worse`` (by its sign and ``higher_is_better``) when its
    Holm-adjusted p is below ``alpha``; otherwise ``equivalent`` when its Holm-adjusted TOST p
    is below ``alpha``; otherwise ``inconclusive``.
    """
    tests = [paired_test(c.diffs) for c in claims]
    raw = [t.t_p if c.test == "t" else t.wilcoxon_p for c, t in zip(claims, tests, strict=True)]
    adjusted, reject = holm(raw, alpha)
    tost_adjusted, equivalent = holm([tost_paired(c.diffs, margin=c.margin).p for c in claims], alpha)
    verdicts: list[Verdict] = []
    for i, (claim, test) in enumerate(zip(claims, tests, strict=True)):
        if claim.groups is not None:
            ci = hierarchical_bootstrap_ci(
                claim.diffs, claim.groups, confidence=confidence, n_resamples=n_resamples, seed=seed
            )
        else:
            ci = bootstrap_ci(claim.diffs, confidence=confidence, n_resamples=n_resamples, seed=seed)
        outcome: VerdictWord
        if reject[i]:
            outcome = "better" if (test.mean > 0) == claim.higher_is_better else "worse"
        elif equivalent[i]:
            outcome = "equivalent"
        else:
            outcome = "inconclusive"
        verdicts.append(Verdict(claim, test, ci, raw[i], adjusted[i], tost_adjusted[i], outcome, alpha))
    return verdicts


def _num(x: float, digits: int = 3) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.{digits}f}"


def _p(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3g}"


def verdicts_markdown(
    verdicts: Sequence[Verdict],
    digits: int = 3,
    *,
    after_claim: Sequence[tuple[str, str]] = (),
    last: Sequence[tuple[str, str]] = (),
) -> str:
    """A Markdown table of verdicts: claim, n, mean difference [CI], Holm p, TOST p, verdict.

    ``after_claim`` and ``last``: extra columns ``(header, key of Verdict.extra)`` placed after
    the claim's name and after the verdict."""
    head = ["claim", *(h for h, _ in after_claim), "n", "mean difference [95% CI]", "p (Holm)"]
    head += ["TOST p (Holm), margin", "verdict", *(h for h, _ in last)]
    lines = ["| " + " | ".join(head) + " |", "| --- " * len(head) + "|"]
    for v in verdicts:
        ci = f"[{_num(v.ci[0], digits)}, {_num(v.ci[1], digits)}]"
        cells = [v.claim.name, *(str(v.extra[k]) for _, k in after_claim), str(v.test.n)]
        cells += [f"{_num(v.test.mean, digits)} {ci}", _p(v.p_holm), f"{_p(v.p_tost)}, ±{v.claim.margin:g}"]
        cells += [f"**{v.word}**", *(str(v.extra[k]) for _, k in last)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
