"""`popgrpo report` turns a small hand-made Parquet set into the tables, every figure and the claims."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from popgrpo.cli import main
from popgrpo.config import load_config, preset_path
from popgrpo.research.study.plan import ABLATIONS, MERGE_STRATEGIES, METHODS, build_plan
from popgrpo.research.study.report import FIGURES, check_claims, claims_markdown, holds, load, trial_table

EPOCHS = 12


def _synthetic_rows(trial: dict, rng: np.random.Generator) -> pd.DataFrame:
    """Per-epoch metrics shaped so the paper's claims hold: GRPO collapses, Pop-GRPO's best member
    beats it, MaxEnt is the most diverse and complex and earns least."""
    preset, seed = trial["preset"], trial["seed"]
    members = load_config(preset_path(preset), trial["overrides"]).population.size
    epoch = np.arange(EPOCHS)
    rows = []
    for k in range(members):
        collapse = 1.0 - 0.4 * epoch / EPOCHS if preset in ("grpo", "qd_grpo") else np.ones(EPOCHS)
        maxent = preset == "maxent_grpo"
        frame = pd.DataFrame(
            {
                "trial": trial["key"],
                "seed": seed,
                "epoch": epoch,
                "member": k,
                "reward_mean": 0.01 if maxent else 0.3 + 0.01 * rng.random(EPOCHS),
                "reward_max": (0.4 if maxent else 1.5) + 0.1 * k + 0.01 * rng.random(EPOCHS),
                "diversity": 0.999 if maxent else 0.9 * collapse,
                "complexity": 29.0 if maxent else 3.5 * collapse,
                "entropy": 3.4 if maxent else 1.0,
                "archive_coverage": 0.5 + 0.3 * (preset == "qd_grpo") + 0.001 * seed / 442,
            }
        )
        for q in (10, 25, 50, 75, 90):
            frame[f"complexity_p{q}"] = frame["complexity"] * (0.5 + q / 100)
        rows.append(frame)
    return pd.concat(rows)


@pytest.fixture
def study_dir(tmp_path):
    return _make_study(tmp_path)


@pytest.fixture
def regime_study_dir(tmp_path):
    return _make_study(tmp_path, regime=True)


def _make_study(tmp_path, regime: bool = False):
    trials = [t.to_json() for t in build_plan(seeds=(42, 142), epochs=EPOCHS, regime=regime)]
    (tmp_path / "plan.json").write_text(json.dumps({"quick": True, "trials": trials}))
    rng = np.random.default_rng(0)
    pd.concat([_synthetic_rows(t, rng) for t in trials]).to_parquet(tmp_path / "metrics.parquet")
    for t in trials:  # each run directory's config and final archive, as a real run leaves them
        run = tmp_path / "runs" / t["key"]
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(load_config(preset_path(t["preset"]), t["overrides"]).to_yaml())
        cells = [0, 11, 57, 99]
        pq.write_table(
            pa.table(
                {
                    "archive": [0] * 4,
                    "cell": cells,
                    "behaviour": [[0.1, 0.2]] * 4,
                    "reward": [0.1, 0.5, 0.9, 1.3],
                    "idea": [[0.0] * 16] * 4,
                }
            ),
            run / "archive.parquet",
        )
    return tmp_path


def test_report_writes_the_tables_and_every_figure(study_dir, capsys):
    assert main(["report", str(study_dir)]) == 0
    printed = capsys.readouterr().out.split()
    for name in (*FIGURES, "table1.md", "claims.md", *(f"archive_{p}.png" for p in METHODS.values())):
        path = study_dir / name
        assert str(path) in printed
        assert path.stat().st_size > (1000 if name.endswith(".png") else 100), name
    table1 = (study_dir / "table1.md").read_text()
    for method in METHODS:
        assert f"| {method} |" in table1
    assert "*0.8412*" in table1  # the paper's GRPO max R printed beside ours
    for study in ABLATIONS:
        assert f"({ABLATIONS[study][0]}), mean ± std over seeds" in table1
    for strategy in MERGE_STRATEGIES:
        assert f"| {strategy} |" in table1
    assert "- best on population_max_reward: **" in table1
    verdicts = json.loads((study_dir / "verdicts.json").read_text())
    assert str(study_dir / "verdicts.json") in printed
    assert {"paper_claim", "comparison", "expected", "mean_diff", "ci_low", "p_holm", "verdict"} <= verdicts[0].keys()
    assert verdicts[0]["comparison"].startswith("GRPO diversity") and verdicts[0]["verdict"] == "worse"


def test_trial_table_averages_the_last_ten_epochs_over_members(study_dir):
    plan, metrics = load(study_dir)
    table = trial_table(plan, metrics)
    grpo = table[(table.study == "table1") & (table.label == "GRPO") & (table.seed == 42)].iloc[0]
    raw = metrics[metrics.trial == grpo.trial]
    expected = raw[raw.epoch >= EPOCHS - 10].diversity.mean()
    assert grpo.diversity == pytest.approx(expected)
    pop = table[(table.study == "table1") & (table.label == "Pop-GRPO") & (table.seed == 42)].iloc[0]
    assert pop.population_max_reward == pytest.approx(pop.max_reward + 0.2, abs=0.02)  # best of 5 members (+0.1·k)

    # a trial serving two cells (MaxEnt at H* = 1) appears under both, with the same numbers
    both = table[table.trial == table[(table.study == "entropy_target") & (table.value == 1.0)].trial.iloc[0]]
    assert set(both.study) == {"table1", "entropy_target"} and both.diversity.nunique() == 1


def test_merge_winner_counts_seeds_where_the_best_mean_strategy_was_best():
    from popgrpo.research.study.report import merge_winner

    rows = pd.DataFrame(
        {"label": ["a", "b", "a", "b", "a", "b"], "seed": [1, 1, 2, 2, 3, 3], "x": [1.0, 0.0, 0.0, 0.5, 2.0, 0.1]}
    )
    assert merge_winner(rows, "x") == ("a", 2)


def test_claim_verdicts_follow_the_numbers(study_dir):
    plan, metrics = load(study_dir)
    claims = check_claims(trial_table(plan, metrics))
    by_claim: dict[str, list] = {}
    for c in claims:
        by_claim.setdefault(c.extra["paper_claim"].split(":")[0].split(" (")[0], []).append(c)
    collapse = by_claim["GRPO's diversity and complexity fall over training"]
    assert [c.word for c in collapse] == ["worse", "worse"] and all(holds(c) for c in collapse)
    assert all(c.word == "better" for c in by_claim["Pop-GRPO's max reward beats GRPO's"])
    maxent = by_claim["MaxEnt-GRPO has the highest diversity and complexity and the lowest reward."]
    assert len(maxent) == 4 and all(holds(c) for c in maxent)
    assert [c.word for c in by_claim["QD-GRPO covers more of the archive than GRPO."]] == ["better"]
    # every comparison is one member of one Holm family
    assert all(c.record()["p_holm"] is None or c.record()["p_holm"] >= c.record()["p"] for c in claims)
    # flip the data: GRPO no longer collapses, so the first claim must fail
    metrics.loc[metrics.trial.isin(metrics[metrics.trial.str.startswith("grpo-")].trial), "diversity"] = 0.9
    metrics.loc[metrics.trial.str.startswith("grpo-"), "complexity"] = 3.5
    claims = check_claims(trial_table(plan, metrics))
    assert claims[0].word == "equivalent within ±0.02" and not holds(claims[0])
    assert "| GRPO's diversity and complexity fall" in claims_markdown(claims)


def test_ablation_parts_need_a_paired_difference_beyond_the_margin(study_dir):
    plan, metrics = load(study_dir)
    table = trial_table(plan, metrics)
    key = "diversity, H* = 4 − H* = 0 (entropy_target)"
    flat = {c.claim.name: c for c in check_claims(table)}[key]
    assert flat.word == "equivalent within ±0.02" and not holds(flat)  # a flat curve is no rise
    table.loc[(table.study == "entropy_target") & (table.value == 4), "diversity"] += 0.1
    risen = {c.claim.name: c for c in check_claims(table)}[key]
    assert risen.word == "better" and holds(risen)


def test_report_on_a_directory_without_a_study_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "plan.json is missing" in capsys.readouterr().err


def test_controls_score_best_of_k_like_the_population_and_decide_whether_the_claim_survives(study_dir):
    from popgrpo.research.study.plan import CONTROLS

    plan, metrics = load(study_dir)
    table = trial_table(plan, metrics)
    controls = table[table.study == "controls"]
    assert set(controls.label) == set(CONTROLS) and set(controls.seed) == {42, 142}
    control = controls[(controls.label == "best-of-K GRPO") & (controls.seed == 42)].iloc[0]
    raw = metrics[(metrics.trial == control.trial) & (metrics.epoch >= EPOCHS - 10)]
    best_of_k = raw.groupby("epoch").reward_max.max().mean()  # the best of the K runs, epoch by epoch
    assert control.population_max_reward == pytest.approx(best_of_k)
    assert control.max_reward == pytest.approx(raw.reward_max.mean())  # and the member mean beside it
    # a population below its control in every seed: the claim is refuted; above it: it holds
    pop = table[(table.study == "controls") & (table.label == "Pop-GRPO")].trial.unique()
    metrics.loc[metrics.trial.isin(pop), "reward_max"] -= 1.0
    claims = {c.extra["paper_claim"]: c.word for c in check_claims(trial_table(plan, metrics))}
    key = next(k for k in claims if k.startswith("Pop-GRPO's best member beats the best of K"))
    assert claims[key] == "worse"
    metrics.loc[metrics.trial.isin(pop), "reward_max"] += 2.0
    claims = {c.extra["paper_claim"]: c.word for c in check_claims(trial_table(plan, metrics))}
    assert claims[key] == "better"
    assert "## Controls: Pop-GRPO against the best of K" in main_report_text(study_dir)


def main_report_text(study_dir) -> str:
    assert main(["report", str(study_dir)]) == 0
    return (study_dir / "table1.md").read_text()


def test_regime_map_reports_each_intensity_and_follows_the_numbers(regime_study_dir):
    from popgrpo.research.study.plan import REGIME_INTENSITIES
    from popgrpo.research.study.report import REGIME_FIGURE, regime_rows

    study_dir = regime_study_dir
    plan, metrics = load(study_dir)
    regime = regime_rows(trial_table(plan, metrics))
    assert regime.updates_per_epoch.tolist() == list(REGIME_INTENSITIES)
    assert (regime.grpo_complexity_ratio < 1).all()  # the synthetic GRPO collapses at every intensity
    assert regime.pop_ahead.tolist() == ["0/2"] * len(regime) or regime.pop_minus_control.abs().max() < 0.05
    assert set(regime.pop_verdict) <= {"better", "worse", "inconclusive", "equivalent within ±0.05"}
    # the synthetic Pop-GRPO is the most diverse and MaxEnt next: the paper's order at the top
    assert (regime.ordering > 0).all()
    text = main_report_text(study_dir)
    assert "## Regime map" in text and (study_dir / REGIME_FIGURE).stat().st_size > 1000
    flat = metrics.copy()
    flat.loc[flat.trial.str.startswith("grpo-"), "complexity"] = 3.5
    assert (regime_rows(trial_table(plan, flat)).grpo_complexity_ratio == 1.0).all()


@pytest.mark.parametrize("landscape", ["paper", "collapse"])
def test_the_committed_study_redraws_its_tables_unchanged(landscape, tmp_path):
    """docs/results/<landscape> holds the study's per-epoch data: `popgrpo report` on a copy
    writes the committed tables and verdicts again, without training."""
    import shutil
    from pathlib import Path

    committed = Path("docs/results") / landscape
    copy = tmp_path / landscape
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("*.png", "*.md", "verdicts.json"))
    assert main(["report", str(copy)]) == 0
    for name in ("table1.md", "claims.md", "verdicts.json"):
        assert (copy / name).read_text() == (committed / name).read_text(), name
