"""The statistics every study report uses: paired tests, Holm, bootstrap effect sizes, TOST,
verdicts, and survival comparisons; and the one way a report writes its verdicts.

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
inside the margin adds ``, within ±m``); a claim with fewer paired units than a report asks for
is ``not measured`` and stays out of the family.

Every study report goes the same way from its data to its pages: it states its claims as
:class:`Claim` (its own columns in :attr:`Claim.labels`), judges each family with
:func:`judge`, writes :meth:`Verdict.record` of each with :func:`write_verdicts` (its
``verdicts.json``) and draws the table of its page with :func:`verdicts_markdown`, picking
the columns (:func:`default_columns`, :func:`label_column`, or its own).

Where the comparison is *when* something happens and some units never see it within the
time observed (right-censored), means are not defined: :func:`survival_test` compares two arms
paired by unit with Kaplan–Meier curves (:func:`km_curve`), a log-rank test stratified by unit
(:func:`logrank`) and the difference of restricted mean survival times (:func:`rmst`) with a
bootstrap interval over units; :func:`holm_survival` corrects a family of them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy import stats

from popgrpo.markdown import md_table

__all__ = [
    "ALPHA",
    "CLAIM",
    "HOLM",
    "TOST",
    "VERDICT",
    "Claim",
    "Column",
    "Equivalence",
    "N",
    "PairedTest",
    "SurvivalTest",
    "Verdict",
    "bootstrap_ci",
    "default_columns",
    "effect",
    "format_diff",
    "format_mean_sd",
    "format_p",
    "hierarchical_bootstrap_ci",
    "holm",
    "holm_survival",
    "judge",
    "km_curve",
    "km_median",
    "label_column",
    "logrank",
    "paired_test",
    "rmst",
    "survival_test",
    "tost_paired",
    "verdicts_json",
    "verdicts_markdown",
    "write_verdicts",
]

ALPHA = 0.05
"""The family-wise error rate of every verdict unless a report states another."""

VerdictWord = Literal["better", "worse", "equivalent", "inconclusive", "not measured"]


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

    ``labels``: the report's own columns of the claim (what it compares, the paper's claim…),
    carried into :attr:`Verdict.extra` and its record; ``note``: what the report's page says of
    the data beside the statistics (per-unit differences, a trend), left out of the record.
    """

    name: str
    diffs: tuple[float, ...]
    margin: float
    higher_is_better: bool = True
    groups: tuple[Hashable, ...] | None = None
    test: Literal["t", "wilcoxon"] = "t"
    labels: Mapping[str, Any] = field(default_factory=dict, compare=False)
    note: str = field(default="", compare=False)

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

    def record(self, first: Sequence[str] = ()) -> dict[str, Any]:
        """The verdict as a JSON-ready dict (``verdicts.json``): NaN becomes None.

        The statistics, then :attr:`extra` (the claim's labels and what the report added); the
        keys of ``extra`` named in ``first`` lead instead (a study's identifying columns). A claim
        not measured has its name, ``n`` and verdict only."""
        lead = {k: self.extra[k] for k in first if k in self.extra}
        rest = {k: v for k, v in self.extra.items() if k not in lead}
        if self.outcome == "not measured":
            return {**lead, "claim": self.claim.name, "n": self.test.n, "verdict": self.word, **rest}
        num = _json_number
        return {
            **lead,
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
            **rest,
        }


def _json_number(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def judge(
    claims: Sequence[Claim],
    *,
    alpha: float = ALPHA,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    min_n: int = 0,
) -> list[Verdict]:
    """Verdicts of a family of claims, corrected together, one per claim in their order.

    A claim is ``better`` or ``worse`` (by its sign and ``higher_is_better``) when its
    Holm-adjusted p is below ``alpha``; otherwise ``equivalent`` when its Holm-adjusted TOST p
    is below ``alpha``; otherwise ``inconclusive``. A claim with fewer than ``min_n`` paired
    units is ``not measured`` (NaN statistics) and is not counted in the family. Each verdict's
    :attr:`~Verdict.extra` starts as a copy of its claim's labels.
    """
    measured = [c for c in claims if len(c.diffs) >= min_n]
    judged = iter(_judge(measured, alpha=alpha, confidence=confidence, n_resamples=n_resamples, seed=seed))
    nan = math.nan
    return [
        next(judged)
        if len(c.diffs) >= min_n
        else Verdict(c, paired_test(c.diffs), (nan, nan), nan, nan, nan, "not measured", alpha, dict(c.labels))
        for c in claims
    ]


def _judge(claims: Sequence[Claim], *, alpha: float, confidence: float, n_resamples: int, seed: int) -> list[Verdict]:
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
        verdicts.append(
            Verdict(claim, test, ci, raw[i], adjusted[i], tost_adjusted[i], outcome, alpha, dict(claim.labels))
        )
    return verdicts


# ---- writing verdicts ------------------------------------------------------------------------
def format_diff(x: float, digits: int = 3) -> str:
    """A signed difference to ``digits`` decimals (``+0.012``), ``n/a`` for NaN."""
    return "n/a" if math.isnan(x) else f"{x:+.{digits}f}"


def format_p(x: float) -> str:
    """A p-value to three significant digits, ``n/a`` for NaN."""
    return "n/a" if math.isnan(x) else f"{x:.3g}"


def format_mean_sd(values: Any, digits: int = 3) -> str:
    """``mean ± sd`` (ddof 1) of a pandas Series' values that are not NaN, to ``digits`` decimals:
    the mean alone for one value, ``–`` for none."""
    values = values.dropna()
    if values.empty:
        return "–"
    if len(values) == 1:
        return f"{values.iloc[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


Column = tuple[str, Callable[[Verdict], object]]
"""A column of :func:`verdicts_markdown`: its header and its cell of a verdict."""

CLAIM: Column = ("claim", lambda v: v.claim.name)
N: Column = ("n", lambda v: v.test.n)
HOLM: Column = ("p (Holm)", lambda v: format_p(v.p_holm))
TOST: Column = ("TOST p (Holm), margin", lambda v: f"{format_p(v.p_tost)}, ±{v.claim.margin:g}")
VERDICT: Column = ("verdict", lambda v: f"**{v.word}**")


def effect(digits: int = 3) -> Column:
    """The mean difference and its 95% confidence interval, to ``digits`` decimals."""

    def cell(v: Verdict) -> str:
        ci = f"[{format_diff(v.ci[0], digits)}, {format_diff(v.ci[1], digits)}]"
        return f"{format_diff(v.test.mean, digits)} {ci}"

    return ("mean difference [95% CI]", cell)


def label_column(header: str, key: str) -> Column:
    """The verdict's :attr:`~Verdict.extra` ``key`` (a label of its claim, or what the report added)."""
    return (header, lambda v: v.extra[key])


def default_columns(digits: int = 3) -> list[Column]:
    """Claim, n, mean difference [CI], Holm p, TOST p and margin, verdict."""
    return [CLAIM, N, effect(digits), HOLM, TOST, VERDICT]


def verdicts_markdown(verdicts: Sequence[Verdict], columns: Sequence[Column] | None = None) -> str:
    """A Markdown table of verdicts, one row each, in ``columns`` (default :func:`default_columns`)."""
    columns = default_columns() if columns is None else columns
    rows = [[cell(v) for _, cell in columns] for v in verdicts]
    return md_table([h for h, _ in columns], rows) + "\n"


def verdicts_json(records: Any) -> str:
    """``records`` (a list of :meth:`Verdict.record`, or an object holding them) as ``verdicts.json``
    writes them: indented one space, numpy scalars as floats, a final newline."""
    return json.dumps(records, indent=1, default=float) + "\n"


def write_verdicts(path: str | Path, records: Any) -> Path:
    """Write :func:`verdicts_json` of ``records`` to ``path``; return the path."""
    path = Path(path)
    path.write_text(verdicts_json(records))
    return path


# ---- survival: when an event happens, with censored units --------------------------------------
def km_curve(time: np.ndarray, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan–Meier estimate of P(no event after t) as a step function from (0, 1).

    ``time [n]``, ``event [n]`` (bool: the event, else censored there) → ``t [k + 1]``,
    ``S [k + 1]``: S holds from t[i] until t[i + 1] (``SurvfuncRight``'s event times, t = 0 first).
    """
    from statsmodels.duration.survfunc import SurvfuncRight

    fit = SurvfuncRight(np.asarray(time, dtype=float), np.asarray(event, dtype=int))
    return np.concatenate([[0.0], fit.surv_times]), np.concatenate([[1.0], fit.surv_prob])


def rmst(time: np.ndarray, event: np.ndarray, tau: float) -> float:
    """Restricted mean survival time: the area under the KM curve over [0, tau], in ``time``'s units."""
    t, s = km_curve(time, event)
    edges = np.append(np.clip(t, 0.0, tau), tau)
    return float(np.sum(s * np.diff(edges)))


def km_median(time: np.ndarray, event: np.ndarray) -> tuple[float, float, float]:
    """The KM median time to the event and its 95% CI (statsmodels; NaN where not reached or undefined)."""
    from statsmodels.duration.survfunc import SurvfuncRight

    fit = SurvfuncRight(np.asarray(time, dtype=float), np.asarray(event, dtype=int))
    if not np.any(event):
        return math.nan, math.nan, math.nan
    median = float(fit.quantile(0.5))
    try:
        with np.errstate(divide="ignore", invalid="ignore"):  # its log-log transform at S = 0 or 1
            low, high = (float(x) for x in fit.quantile_ci(0.5))
    except (ValueError, ZeroDivisionError, FloatingPointError, IndexError):
        low, high = math.nan, math.nan
    return median, low, high


def logrank(time: np.ndarray, event: np.ndarray, group: np.ndarray, strata: np.ndarray) -> tuple[float, float]:
    """statsmodels' log-rank test (``survdiff``) of ``group`` stratified by ``strata``: ``(χ², p)``,
    NaN without any event."""
    from statsmodels.duration.survfunc import survdiff

    if not np.any(event):
        return math.nan, math.nan
    try:
        chisq, p = survdiff(time, event.astype(int), group, strata=strata)
    except np.linalg.LinAlgError:  # no event in any stratum where both arms are at risk
        return math.nan, math.nan
    return float(chisq), float(p)


def event_order(
    time_a: np.ndarray, event_a: np.ndarray, time_b: np.ndarray, event_b: np.ndarray
) -> tuple[int, int, int]:
    """Per unit (``[n]`` each, paired by position): does ``a``'s event come later, in an unknown order, or earlier?

    ``a`` is later where ``b``'s event came before ``a``'s time (an event or censored there),
    earlier the other way round; equal times, and two censored units, leave the order unknown.
    """
    later = int(np.sum(event_b & (time_a > time_b)))
    earlier = int(np.sum(event_a & (time_b > time_a)))
    return later, len(time_a) - later - earlier, earlier


@dataclass(frozen=True)
class SurvivalTest:
    """Arm ``a`` against arm ``b``, paired by unit: does the event come later in ``a``?

    ``rmst_a``/``rmst_b``: restricted mean survival times up to ``tau`` (time without the event
    on average over the first tau); ``ci`` the bootstrap interval of their difference over
    units; ``chisq``/``p``: the log-rank test stratified by unit; ``p_holm`` across the family
    (:func:`holm_survival`); ``order``: units where ``a``'s event is later / in an unknown order /
    earlier (:func:`event_order`). ``labels``: the report's own columns, written into the record.
    """

    name: str
    n: int
    tau: float
    rmst_a: float
    rmst_b: float
    ci: tuple[float, float]
    chisq: float
    p: float
    p_holm: float = math.nan
    alpha: float = ALPHA
    order: tuple[int, int, int] = (0, 0, 0)
    labels: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def diff(self) -> float:
        return self.rmst_a - self.rmst_b

    @property
    def outcome(self) -> str:
        """``later`` / ``earlier`` (``a``'s event later or earlier than ``b``'s, Holm p < α) or ``inconclusive``."""
        if math.isnan(self.p_holm) or self.p_holm >= self.alpha:
            return "inconclusive"
        return "later" if self.diff > 0 else "earlier"

    def record(self) -> dict[str, Any]:
        """The test as a JSON-ready dict (``verdicts.json``): NaN becomes None; the labels follow the claim."""
        num = _json_number
        return {
            "claim": self.name,
            **self.labels,
            "n": self.n,
            "test": "log-rank, stratified by seed",
            "rmst_tau": self.tau,
            "rmst_a": self.rmst_a,
            "rmst_b": self.rmst_b,
            "mean_diff": self.diff,
            "ci_low": num(self.ci[0]),
            "ci_high": num(self.ci[1]),
            "seeds_later_tied_earlier": list(self.order),
            "chisq": num(self.chisq),
            "p": num(self.p),
            "p_holm": num(self.p_holm),
            "alpha": self.alpha,
            "verdict": self.outcome,
        }


def survival_test(
    name: str,
    time_a: np.ndarray,
    event_a: np.ndarray,
    time_b: np.ndarray,
    event_b: np.ndarray,
    *,
    rng: np.random.Generator,
    n_resamples: int = 999,
    alpha: float = ALPHA,
    labels: Mapping[str, Any] | None = None,
) -> SurvivalTest:
    """Arms ``a`` and ``b`` (``[n]`` times and event flags each, paired by unit): the log-rank test
    stratified by unit, the RMSTs up to the latest time of either, and the percentile bootstrap
    CI of their difference (``n_resamples`` draws of units with replacement, both arms together,
    keeping the pairing, from ``rng``; none with one unit). Holm-correct a family with
    :func:`holm_survival`."""
    n = len(time_a)
    time = np.concatenate([time_a, time_b]).astype(float)
    event = np.concatenate([event_a, event_b]).astype(bool)
    chisq, p = logrank(time, event, np.repeat([0, 1], n), np.tile(np.arange(n), 2))
    tau = float(time.max())
    ci = (math.nan, math.nan)
    if n > 1:
        draws = rng.integers(0, n, size=(n_resamples, n))
        diffs = [rmst(time_a[i], event_a[i], tau) - rmst(time_b[i], event_b[i], tau) for i in draws]
        low, high = np.quantile(diffs, [0.025, 0.975])
        ci = (float(low), float(high))
    return SurvivalTest(
        name,
        n,
        tau,
        rmst(time_a, event_a, tau),
        rmst(time_b, event_b, tau),
        ci,
        chisq,
        p,
        alpha=alpha,
        order=event_order(time_a, event_a, time_b, event_b),
        labels=dict(labels or {}),
    )


def holm_survival(tests: Sequence[SurvivalTest], alpha: float = ALPHA) -> list[SurvivalTest]:
    """The tests with their log-rank p Holm-adjusted across them (:func:`holm`)."""
    adjusted, _ = holm([t.p for t in tests], alpha)
    return [replace(t, p_holm=p) for t, p in zip(tests, adjusted, strict=True)]
