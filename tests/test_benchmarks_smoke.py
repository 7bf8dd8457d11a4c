"""The benchmark suite runs end to end (``--quick``) and writes only between its markers.

No timing is asserted: the numbers depend on the machine and its load. The suite runs in a
subprocess, so its embedded Ray and clusters are its own and gone when it exits.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.suite import BEGIN, END, SECTION_TITLES, replace_generated

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent

# A header row of each section's table (the peer's belongs to benchmarks.peer_rllib).
TABLE_HEADERS = {
    "summary": "| § | figure | measured | target | status |",
    "floor": "| implementation | CPU ms/step (median) |",
    "profile": "| where the member's step goes (cumulative) |",
    "throughput": "| K | layout | actors × members @ CPUs | ideas/s |",
    "overhead": "| mode | merges | wall s | members' training s | wall ms per merge | outside member training |",
    "overhead parts": "| ms per merge | sync | async (B = K, S = 0) | async (B = 2, S = 2) |",
    "multinode": "| cluster | nodes holding members | ideas/s | vs 1 node |",
    "archive": "| series | size | µs per call |",
    "archive fit": "| series | fit: µs per call = a + b·size | R² |",
}


def test_region_replaced_or_appended():
    text = f"intro\n{BEGIN}\nold\n{END}\noutro\n"
    assert replace_generated(text, "new") == f"intro\n{BEGIN}\nnew\n{END}\noutro\n"
    assert replace_generated("# Title\n", "new") == f"# Title\n\n{BEGIN}\nnew\n{END}\n"
    assert replace_generated("", "new") == f"{BEGIN}\nnew\n{END}\n"


@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.slow  # every benchmark section end to end: make test-slow (docs/reference/tests.md)
@pytest.mark.benchmark_run
def test_quick_suite_writes_every_section(tmp_path):
    before = "# Benchmarks\n\nHand-written text above.\n\n"
    after = "\n## Kept\n\nHand-written text below.\n"
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(f"{before}{BEGIN}\nstale numbers\n{END}{after}")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        # The peer (section 6) has its own test, tests/test_benchmarks_peer.py.
        [sys.executable, "-m", "benchmarks", "--quick", "--skip-peer", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # about 220 s alone on 2 cores; make test-slow runs it beside another slow test
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()
    assert text.startswith(before + BEGIN) and text.endswith(END + after)
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "stale numbers" not in text
    region = text[text.index(BEGIN) : text.index(END)]
    assert "python -m benchmarks --quick --skip-peer --out" in region and "cores (`os.cpu_count()`)" in region
    for title in SECTION_TITLES.values():
        assert title in region
    for name, header in TABLE_HEADERS.items():
        assert header in region, f"{name} table missing"
    # A layout that raised is reported in its table row, not raised: none may have.
    ours = region[: region.index(SECTION_TITLES["peer"])]
    assert "failed: " not in ours, ours[ours.index("failed: ") - 300 : ours.index("failed: ") + 300]
    peer = region[region.index(SECTION_TITLES["peer"]) :]
    assert "Not run: `--skip-peer`." in peer


def test_compare_trees_alternates_two_checkouts_and_refuses_a_non_checkout(tmp_path):
    from benchmarks.compare_trees import compare, main, report

    with pytest.raises(SystemExit) as bad:
        main(["--before", str(tmp_path)])
    assert bad.value.code == 2
    result = compare(ROOT, ROOT, k=1, vectorize=False, epochs=1, pairs=1)
    assert len(result["rates"]["before"]) == len(result["rates"]["after"]) == len(result["ratios"]) == 1
    assert all(r > 0 for r in result["rates"]["before"] + result["rates"]["after"])
    assert result["ratios"][0] == pytest.approx(result["rates"]["after"][0] / result["rates"]["before"][0])
    assert report(result).splitlines()[2].startswith("| packed | 1 |")


def test_round_overhead_times_the_drivers_parts_and_the_background_writer():
    from benchmarks.round_overhead import PARTS, _train, measure
    from popgrpo.config import load_config, preset_path
    from popgrpo.runtime.executor import LocalExecutor

    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=3", "run.epochs=6", "scheduler.interval_epochs=2", "grpo.steps_per_epoch=2"],
    )
    timed, writer = _train(cfg, lambda c, d: LocalExecutor(c))
    assert [c.name for c in timed.calls].count("train") == 3
    assert [c.name for c in timed.calls].count("round_end") == 3  # each round handed over once
    assert writer.wall > 0 and writer.cpu > 0 and writer.logging > 0  # the writer's tasks ran, the loggers in them
    m = measure(timed, writer, cores=1)
    assert m["merges"] == 2
    # The driver's time outside training calls, split into parts none of which is counted twice.
    assert all(m["parts"][p] >= 0 for p in PARTS) and m["busy"] > 0


@pytest.mark.ray
def test_transport_cost_moves_the_same_states_both_ways_and_reports_them(tmp_path):
    from benchmarks.transport_cost import main

    out = tmp_path / "t.json"
    assert main(["--members", "2", "--repeats", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["tensors"] > 2 * 9 and data["bytes"] > 2 * 100_000  # two members' weights, Adam, generator
    for side in ("tensors", "packed"):
        assert len(data["times"][side]["put"]) == len(data["times"][side]["get"]) == 2
    assert main(["--report", str(out)]) == 0


def test_round_overhead_splits_the_outside_time_into_a_fixed_and_a_proportional_part():
    from benchmarks.round_overhead import crossing, fit_note, fixed_and_proportional, predicted_share

    def result(training_per_merge: float, noise: float = 0.0) -> dict:
        # outside = 0.05 s + 6% of the training (+ noise), for every mode; 4 merges, 2 runs
        outside = 0.05 + 0.06 * training_per_merge + noise
        run = {"members": 4 * training_per_merge, "window": 4 * (training_per_merge + outside), "merges": 4}
        share = 1 - run["members"] / run["window"]
        return {"arms": {"sync": [run, run], "async": [run, run]}, "shares": {"sync": share, "async": share},
                "cores": 2}  # fmt: skip

    sizes = [result(0.4), result(1.6), result(6.4)]
    for a, b in fixed_and_proportional(sizes).values():
        assert a == pytest.approx(0.05) and b == pytest.approx(0.06)
    assert predicted_share(0.05, 0.06, 0.4) == pytest.approx(sizes[0]["shares"]["sync"])
    note = fit_note(sizes, [1, 4, 16])
    assert "50 ms + 6.0% of the training, tending to 5.7%" in note
    assert "16×: 6.4% vs 6.4%" in note  # the line's share at the largest size against the one measured
    # 50 ms + 6% never gets under 5%; 50 ms + 3% crosses it where (0.05 + 0.03 t) / (0.05 + 1.03 t) = 5%.
    assert crossing(0.05, 0.06) is None and "never (it tends to 5.7%)" in note
    t = crossing(0.05, 0.03)
    assert t == pytest.approx(0.05 * 0.95 / (0.05 * 1.03 - 0.03)) and predicted_share(0.05, 0.03, t) == pytest.approx(
        0.05
    )
    # A point off the line moves the least-squares fit: it is not the line through the first two.
    a, b = fixed_and_proportional([result(0.4), result(1.6), result(6.4, noise=0.1)])["sync"]
    assert b > 0.06 and a < 0.05


def test_ray_call_cost_sets_the_least_calls_of_a_merge_against_the_5_percent_budget():
    from benchmarks.ray_call_cost import budget, markdown

    calls = {"started": "t", "actors": 5, "seconds": 8, "repeats": 3, "cores": 2, "calls": [100, 120, 110],
             "rest_cpu_per_s": [0.06, 0.07, 0.065], "cpu_per_call_s": [0.001, 0.002, 0.0015]}  # fmt: skip
    run = {"window": 10.0, "merges": 20}  # 0.5 s of wall per merge: 1,000 core-ms on 2 cores
    preset = {"arms": {"sync": [run]}, "cores": 2, "actors": 5,
              "at_rest": {"raylet": 0.02, "member actors, outside epochs": 0.01, "other processes": 0.005}}  # fmt: skip
    transport = {"members": 5, "times": {"packed": {"put": [0.004, 0.003], "get": [0.001, 0.002]}}}
    b = budget(calls, {"sizes": {"1": preset}}, transport)
    assert b["merge_core_ms"] == pytest.approx(1000) and b["budget_core_ms"] == pytest.approx(50)
    assert b["rest_core_ms"] == pytest.approx(30) and b["others_core_ms"] == pytest.approx(5)
    assert b["left_core_ms"] == pytest.approx(15)
    assert b["calls_core_ms"] == pytest.approx(5 * 2 * 1.5)  # 5 actors × train and adopt × the median call
    assert b["states_ms"] == pytest.approx(5.0)
    text = markdown(calls, {"sizes": {"1": preset}}, transport)
    assert "| one no-op actor call, driver + actor + Ray: CPU ms | 1.50 (1.00–2.00) |" in text
    assert "leaves 15 core-ms" in text and "cost 15 core-ms as no-op calls" in text and "takes 5.0 ms more" in text


@pytest.mark.ray
def test_ray_call_cost_measures_a_positive_cost_per_call_on_a_real_ray():
    from benchmarks.ray_call_cost import measure

    r = measure(actors=2, seconds=2.0, repeats=1)  # long enough that clock ticks are noise
    assert r["calls"][0] >= 2 and r["calls"][0] % 2 == 0  # one call per actor per batch
    assert r["rest_cpu_per_s"][0] > 0  # Ray's processes do some work at rest
    assert r["rest_with_dashboard_cpu_per_s"][0] > 0  # and on a Ray as `popgrpo train` starts it
    assert 0 < r["cpu_per_call_s"][0] < 0.1  # a call costs CPU, far less than 100 ms of it
