"""The second discovery study's report on a tiny synthetic study with known answers
(popgrpo.research.study.discovery2_report): instance-level claims, Holm and TOST by hand, and
`popgrpo report` redrawing it from the Parquet files."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from popgrpo.research.study.discovery import RANDOM_SEARCH
from popgrpo.research.study.discovery2 import CONTROL, PRIMARY, SECONDARY, Design2
from popgrpo.research.study.discovery2_report import RANDOM_FILE, power_table, render_discovery2, shrunken
from popgrpo.research.study.kinds import report_kind

METRICS = (*PRIMARY, *SECONDARY)
BASE = np.linspace(0.1, 0.8, 8)  # the control's instance means
# Each arm's instance-level differences from the control (in far_coverage's units; margin 0.05).
DIFFS = {
    "clear better": 0.2 + np.array([0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.0]),
    "clear equivalent": np.array([0.001, -0.001, 0.002, -0.002, 0.0, 0.001, -0.001, 0.0]),
    "inconclusive": np.array([0.3, -0.25, 0.2, -0.3, 0.1, -0.1, 0.25, -0.15]),
}
RANDOM_DIFF = -0.1 + np.array([0.02, -0.01, 0.0, 0.01, -0.02, 0.01, 0.0, -0.01])
SEED_OFFSETS = (-0.004, 0.004)  # two seeds per instance, their mean the instance mean


def _design() -> dict:
    return {
        "phase": "confirmatory",
        "arms": {
            CONTROL: ["scheduler.enabled=false"],
            "clear better": ["scheduler.population=repulsion"],
            "clear equivalent": ["scheduler.population=islands"],
            "inconclusive": ["scheduler.population=independent"],
        },
        "families": ["stepping_stones"],
        "primary_family": "stepping_stones",
        "instances": list(range(1, 9)),
        "seeds": [1, 2],
        "steps_per_epoch": 4,
        "epochs": 3,
        "threshold": 0.7,
        "metrics": {m: {"tier": "primary" if m in PRIMARY else "secondary", "margin": 0.05} for m in METRICS},
        "random_widths": {"stepping_stones": dict.fromkeys(METRICS, 1.0)},
    }


def _study(out):
    """A study directory holding only what the report reads: plan.json and the Parquet files."""
    design = _design()
    out.mkdir()
    plan = {"study": "discovery2", "quick": False, "design": design, "preregistration_sha256": "ab" * 32}
    plan.update(commit="c0ffee", started="2026-11-29T00:00:00+00:00", trials=[])
    (out / "plan.json").write_text(json.dumps(plan))
    values = {CONTROL: BASE, **{arm: BASE + d for arm, d in DIFFS.items()}}
    rows, curves = [], []
    for arm, means in values.items():
        for i, mean in enumerate(means):
            for seed, offset in zip((1, 2), SEED_OFFSETS, strict=True):
                key = f"{arm}-{i}-{seed}"
                rows.append(
                    {"key": key, "landscape": "stepping_stones", "instance": i + 1, "intensity": 4, "arm": arm,
                     "seed": seed, "samples": 100.0, "peaks": 1.0, "entropy": 1.1, **dict.fromkeys(METRICS, mean + offset)}
                )  # fmt: skip
                curves.append({"key": key, "epoch": 0, "samples": 100, "peaks": 1, "best_quality": mean})
    pd.DataFrame(rows).to_parquet(out / "discovery_trials.parquet")
    pd.DataFrame(curves).to_parquet(out / "discovery_curves.parquet")
    random = [
        {"landscape": "stepping_stones", "instance": i + 1, "seed": seed, "arm": RANDOM_SEARCH,
         **dict.fromkeys(METRICS, mean + offset), **{f"width_{m}": 1.0 for m in METRICS}}
        for i, mean in enumerate(BASE + RANDOM_DIFF) for seed, offset in zip((1, 2), SEED_OFFSETS, strict=True)
    ]  # fmt: skip
    pd.DataFrame(random).to_parquet(out / RANDOM_FILE)
    return values


def _holm(p):
    """Holm's adjusted p-values, by the formula: min(1, max_{j ≤ i} (m − j + 1)·p_(j))."""
    order = np.argsort(p)
    adjusted, running = np.empty(len(p)), 0.0
    for rank, index in enumerate(order):
        running = max(running, (len(p) - rank) * p[index])
        adjusted[index] = min(1.0, running)
    return adjusted


def test_the_report_judges_known_answers_with_holm_and_tost_by_hand(tmp_path):
    out = tmp_path / "study"
    values = _study(out)
    written = render_discovery2(out)
    saved = json.loads((out / "verdicts.json").read_text())
    assert saved["preregistration_sha256"] == "ab" * 32 and saved["commit"] == "c0ffee"
    primary = [r for r in saved["verdicts"] if r["tier"] == "primary"]
    # Per primary metric: 3 arms vs best-of-K, 3 arms and the control vs random search: 7 claims.
    assert len(primary) == 7 * len(PRIMARY)
    assert len([r for r in saved["verdicts"] if r["tier"] == "secondary"]) == 7 * len(SECONDARY)
    by = {(r["arm"], r["comparator"], r["metric"]): r for r in saved["verdicts"]}
    for metric in PRIMARY:
        assert by[("clear better", CONTROL, metric)]["verdict"] == "better"
        assert by[("clear equivalent", CONTROL, metric)]["verdict"] == "equivalent within ±0.05"
        assert by[("inconclusive", CONTROL, metric)]["verdict"] == "inconclusive"
        assert by[(CONTROL, RANDOM_SEARCH, metric)]["verdict"] == "better"
        assert by[("clear better", CONTROL, metric)]["instances"] == 8
    # Hand computation over the primary family: t-tests on the instance means, then Holm.
    random = BASE + RANDOM_DIFF
    raw, tost, keys = [], [], []
    for metric in PRIMARY:
        for arm, comparator in [
            *((a, CONTROL) for a in DIFFS),
            *((a, RANDOM_SEARCH) for a in DIFFS),
            (CONTROL, RANDOM_SEARCH),
        ]:
            a = values[arm]
            b = random if comparator == RANDOM_SEARCH else values[CONTROL]
            d = a - b
            raw.append(stats.ttest_rel(a, b).pvalue)
            lower = stats.ttest_1samp(d, -0.05, alternative="greater").pvalue
            upper = stats.ttest_1samp(d, 0.05, alternative="less").pvalue
            tost.append(max(lower, upper))
            keys.append((arm, comparator, metric))
    for key, p, p_holm, p_tost in zip(keys, raw, _holm(np.array(raw)), _holm(np.array(tost)), strict=True):
        assert by[key]["p"] == pytest.approx(p, rel=1e-6)
        assert by[key]["p_holm"] == pytest.approx(p_holm, rel=1e-6)
        assert by[key]["p_tost_holm"] == pytest.approx(p_tost, rel=1e-6)
        low, high = by[key]["ci_low"], by[key]["ci_high"]
        assert low <= by[key]["mean_diff"] <= high
    better = by[("clear better", CONTROL, "far_coverage")]
    assert better["mean_diff"] == pytest.approx(DIFFS["clear better"].mean())
    assert 0.18 < better["ci_low"] < better["ci_high"] < 0.22
    page = (out / "verdicts.md").read_text()
    assert "clear equivalent" in page and "**equivalent within ±0.05**" in page
    assert "entropy" in (out / "arms.md").read_text()  # reported beside, not judged
    assert not any(r["metric"] == "entropy" for r in saved["verdicts"])
    assert (out / "fig_effects.png").stat().st_size > 1000 and out / "fig_effects.png" in written
    # `popgrpo report DIR`: the kind its plan.json names redraws every page from the Parquet alone.
    before = (out / "verdicts.json").read_text()
    for path in written:
        if path.suffix in (".md", ".png", ".json"):
            path.unlink()
    assert report_kind(out).redraw(out) == written
    assert (out / "verdicts.json").read_text() == before


def test_shrunken_effects_and_the_instances_for_power():
    assert shrunken(2.0) == pytest.approx(0.6) and shrunken(-5.0) == -1.0 and np.isnan(shrunken(float("nan")))
    from statsmodels.stats.power import TTestPower

    frame = pd.DataFrame(
        [{"landscape": "stepping_stones", "instance": i, "seed": 1, "arm": arm, **dict.fromkeys(METRICS, v)}
         for i in range(4) for arm, v in ((CONTROL, 0.0), ("clear better", [1.0, 2.0, 1.5, 2.5][i]))]
    )  # fmt: skip
    design = _design() | {"phase": "tuning", "arms": {CONTROL: ["scheduler.enabled=false"], "clear better": []}}
    design["random_widths"] = {}
    table = power_table(frame, Design2.from_json(design))
    row = table[(table["arm"] == "clear better") & (table["metric"] == "far_coverage")].iloc[0]
    d = np.array([1.0, 2.0, 1.5, 2.5])
    assert row["dz"] == pytest.approx(d.mean() / d.std(ddof=1))
    assert row["dz_shrunk"] == pytest.approx(min(1.0, 0.3 * row["dz"]))
    expected = TTestPower().solve_power(effect_size=row["dz_shrunk"], alpha=0.05 / 60, power=0.8)
    assert row["instances_for_power"] == pytest.approx(expected)


def test_entropy_control_reads_each_runs_entropy_and_alpha_by_hand(tmp_path):
    """Per trial: last-quarter entropy, each member's lowest entropy averaged, the share of
    member-epochs with α > 0, the largest α and the last quarter's α; written once, then read."""
    from popgrpo.research.study.discovery2_report import ENTROPY_FILE, entropy_control

    epochs = np.arange(8)
    trials = []
    for key, alpha in (("a", np.zeros(8)), ("b", np.array([0, 0, 0.5, 0, 0, 0, 0.2, 0.4]))):
        run = tmp_path / "runs" / key
        run.mkdir(parents=True)
        frame = pd.DataFrame(
            {"epoch": np.tile(epochs, 2), "member": np.repeat([0, 1], 8),
             "entropy": np.concatenate([1.0 - 0.1 * epochs, 2.0 - 0.2 * epochs]), "alpha": np.tile(alpha, 2)}
        )  # fmt: skip
        frame.to_parquet(run / "metrics.parquet")
        trials.append({"key": key, "arm": key, "landscape": "collapse", "instance": 1})
    table = entropy_control(tmp_path, {"trials": trials}).set_index("key")
    # Last quarter: epochs >= 7 * 3/4 = 5.25, so epochs 6 and 7 of both members.
    last = np.mean([1.0 - 0.6, 1.0 - 0.7, 2.0 - 1.2, 2.0 - 1.4])
    assert table.loc["a", "entropy_last_quarter"] == pytest.approx(last)
    assert table.loc["a", "entropy_lowest"] == pytest.approx(np.mean([1.0 - 0.7, 2.0 - 1.4]))
    assert table.loc["a", "alpha_positive"] == 0 and table.loc["a", "alpha_max"] == 0
    assert table.loc["b", "alpha_positive"] == pytest.approx(3 / 8) and table.loc["b", "alpha_max"] == 0.5
    assert table.loc["b", "alpha_last_quarter"] == pytest.approx(0.3)
    assert (tmp_path / ENTROPY_FILE).exists()
    shutil.rmtree(tmp_path / "runs")  # the Parquet file is all a redraw needs
    assert entropy_control(tmp_path, {"trials": trials}).equals(table.reset_index())
    assert entropy_control(tmp_path / "elsewhere", {"trials": trials}) is None
