"""benchmarks/shared_base.py end to end on the tiny model: both sides, fixed-length completions,
the section written between its markers. No timing is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.shared_base import BEGIN, END
from tests.services import require_module

pytestmark = pytest.mark.heavy

require_module("peft")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_shared_base_benchmark_times_both_sides_and_writes_its_section(tiny_lm, tmp_path):
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# Benchmarks\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "benchmarks.shared_base", "--model", str(tiny_lm), "--members", "1,2"]
    command += ["--repeats", "1", "--steps", "1", "--prompts", "1", "--group", "2", "--tokens", "4", "--threads", "1"]
    done = subprocess.run(
        [*command, "--json", str(out), "--write", str(page)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    runs = {(r["mode"], r["m"]): r for r in result["runs"]}
    assert set(runs) == {(mode, m) for mode in ("separate", "shared") for m in (1, 2)}
    for (_, m), run in runs.items():
        assert run["tokens"] == m * 1 * 2 * 4  # exactly max_new_tokens per completion, one timed step
        assert run["tokens_per_s"] > 0 and set(run["phases_s"]) == {"generation", "reference", "update"}
        assert run["peak_rss_bytes"] >= run["rss_after_load_bytes"] > 0
    text = page.read_text()
    assert "old" not in text and text.endswith("after\n") and "| M | separate tokens/s |" in text
    again = subprocess.run(
        [sys.executable, "-m", "benchmarks.shared_base", "--render", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert again.returncode == 0 and again.stdout.strip() in text
