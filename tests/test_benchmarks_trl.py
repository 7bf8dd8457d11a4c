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


def test_cpu_budget_gives_cpu_per_token_and_the_rate_all_cores_would_give():
    def block(tokens, seconds, cpu_s):
        return {"tokens": tokens, "seconds": seconds, "completions": 4, "load": 1.0, "cpu_s": cpu_s, "profile": {}}

    popgrpo = [block(1000, 1.0, 1.6), block(1000, 1.0, 2.0), block(1000, 2.0, 1.8)]
    trl = [block(500, 1.0, 1.0), block(500, 1.0, 1.0), block(500, 1.0, None)]  # a block without /proc/stat
    payload = {"results": {"popgrpo": popgrpo, "trl": trl}, "cores": 2}
    budget = trl_throughput.cpu_budget(payload)
    assert budget["popgrpo member"]["cpu_per_1k"] == pytest.approx(1.8)
    assert budget["popgrpo member"]["busy"] == pytest.approx(1.6)  # median of 1.6, 2.0, 0.9
    assert budget["popgrpo member"]["ceiling"] == pytest.approx(2 * 1000 / 1.8)
    assert budget["TRL GRPOTrainer"]["cpu_per_1k"] == pytest.approx(2.0)
    assert budget["TRL GRPOTrainer"]["rate"] == pytest.approx(500)
    assert trl_throughput.cpu_budget({"results": {"popgrpo": [block(1, 1.0, None)], "trl": []}, "cores": 2}) == {}
    payload.update(profile={"popgrpo": {"step": 1.0}, "trl": {"step": 1.0}}, population={})
    payload.update(trl_throughput.ratio_summary(popgrpo, trl))
    assert "| popgrpo member | 1.80 | 1.60 | 1000 | 1111 |" in trl_throughput.report_markdown(payload)


def test_machine_cpu_counts_busy_time():
    first = trl_throughput.machine_cpu()
    if first is None:
        pytest.skip("no /proc/stat on this machine")
    sum(i * i for i in range(2_000_000))  # some CPU of this process
    assert trl_throughput.machine_cpu() > first
