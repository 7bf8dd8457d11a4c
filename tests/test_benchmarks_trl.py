"""benchmarks.trl_throughput refuses a model directory that is not one, before loading anything."""

import pytest

from benchmarks import trl_throughput


def test_missing_model_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        trl_throughput.main(["--model", str(tmp_path / "nowhere")])
    assert exc.value.code == 2
    assert "popgrpo lm pretrain" in capsys.readouterr().err


def test_ratio_is_the_geometric_mean_of_paired_rounds_with_its_intervals():
    popgrpo = [{"tokens": t, "seconds": 1.0} for t in (200, 300, 400)]
    trl = [{"tokens": t, "seconds": 1.0} for t in (100, 100, 400)]  # ratios 2, 3, 1
    summary = trl_throughput.ratio_summary(popgrpo, trl)
    assert summary["ratio"] == pytest.approx(6 ** (1 / 3))
    assert summary["per_round"] == [2.0, 3.0, 1.0]
    for key in ("bootstrap_ci95", "t_ci95"):
        lo, hi = summary[key]
        assert lo < summary["ratio"] < hi
    lo, hi = summary["bootstrap_ci95"]
    # resampled means stay within the rounds' range (the t interval need not)
    assert lo >= 1.0 - 1e-9 and hi <= 3.0 + 1e-9


def test_report_renders_the_tables_from_the_json():
    block = {"tokens": 100, "seconds": 1.0, "completions": 4, "load": 2.0, "profile": {"generation": 0.5, "step": 1.0}}
    payload = {
        "results": {"popgrpo": [block, block], "trl": [block, block]},
        "profile": {"popgrpo": {"generation": 0.5, "rest": 0.25, "step": 1.0}, "trl": {"generation": 0.7, "step": 1.0}},
        "population": {},
        **trl_throughput.ratio_summary([block, block], [block, block]),
    }
    text = trl_throughput.report_markdown(payload)
    assert "| one trainer each | **1.00** | 1.00–1.00 |" in text
    assert "| generation | 0.500 | 0.700 |" in text and "| rest | 0.250 | — |" in text
