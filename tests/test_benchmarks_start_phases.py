"""benchmarks/start_phases.py: its parsing and tables against hand-made data, its --quick run end to
end (in a fresh interpreter, as a user runs it), and BENCHMARKS.md's section against its committed data.

No timing is asserted: the numbers depend on the machine and its load.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.start_phases import BEGIN, END, PHASES, e2e_table, parse_start, phases_table, render

ROOT = Path(__file__).resolve().parent.parent


def test_parse_start_reads_the_seconds_of_the_two_lines():
    stderr = (
        "popgrpo: run pop_grpo: 5 member(s) × 120 epochs, into runs/x (0.5 s)\n"
        "Token authentication is enabled (3.0 s)\n"
        "popgrpo: starting Ray (embedded, on 127.0.0.1 only; Ray's own lines follow) (0.9 s)\n"
        "popgrpo: Ray is up; placing 5 member actor(s) (6.8 s)\n"
        "popgrpo: round 0 begins (epoch 0 of 120) (14.9 s)\n"
    )
    assert parse_start(stderr) == {"ray_up_s": 6.8, "round0_s": 14.9}
    assert parse_start("nothing\n") == {"ray_up_s": None, "round0_s": None}


def _run(k, repeat, executor, phase_values, replaced=1.5):
    return {
        "k": k,
        "actors": k,
        "members_per_actor": 1,
        "repeat": repeat,
        "ray_start_s": 5.0 + repeat,
        "executor_s": executor,
        "floor": 4.0,
        "phases": {p: list(phase_values) for p in PHASES},
        "ready_s": [executor],
        "first_epoch_call_s": 0.2,
        "first_epoch_s": [0.1, 0.3, 0.2],
        "restart_call_s": 3.0 + repeat,
        "replaced_in_s": replaced,
        "fresh_actor_s": 2.5,
        "restarts": 1,
    }


def test_phases_table_gives_medians_over_repeats_and_actors():
    before = {**_run(5, 0, 20.0, [0.0]), "tree": "A", "phases": None, "first_epoch_s": []}
    runs = [
        before,
        {**_run(5, 0, 9.0, [1.0, 2.0, 9.0]), "tree": "B"},
        {**_run(5, 1, 11.0, [3.0, 4.0, 5.0]), "tree": "B"},
    ]
    data = {"tree": "bbb", "trees": {"A": "aaa", "B": "bbb"}, "date": "d", "runs": runs}
    rows = [line for line in phases_table(data).splitlines() if line.startswith("| 5 ")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    # K, actors, tree, Ray start (5, 6), executor (9, 11), floor, 4 phases (medians over actors 2
    # and 4), first epoch (median of 0.1..0.3 per run), replaced in, restart call (3, 4)
    assert cells[1] == ["5", "5", "after (bbb)", "5.5 (5.0–6.0)", "10.0 (9.0–11.0)", "4.0 (4.0–4.0)"] + [
        "3.0 (2.0–4.0)"
    ] * 4 + ["0.2 (0.2–0.2)", "2.5 (2.5–2.5)", "1.5 (1.5–1.5)", "3.5 (3.0–4.0)"]
    # a tree whose actors do not tell their phases: its totals, "–" for the phases
    assert cells[0] == ["5", "5", "before (aaa)", "5.0", "20.0", "4.0"] + ["–"] * 5 + ["2.5", "1.5", "3.0"]


def test_e2e_table_per_tree():
    data = {
        "order": "ABBA",
        "trees": {"A": "aaa", "B": "bbb"},
        "date": "d",
        "runs": [
            {"tree": "A", "ray_up_s": 8.0, "round0_s": 26.0, "total_s": 40.0},
            {"tree": "B", "ray_up_s": 7.0, "round0_s": 15.0, "total_s": 30.0},
            {"tree": "B", "ray_up_s": 6.0, "round0_s": 16.0, "total_s": 28.0},
            {"tree": "A", "ray_up_s": 9.0, "round0_s": 25.0, "total_s": 38.0},
        ],
    }
    table = e2e_table(data)
    assert "| before (aaa) | 2 | 8.5 (8.0–9.0) | 25.5 (25.0–26.0) | 39.0 (38.0–40.0) |" in table
    assert "| after (bbb) | 2 | 6.5 (6.0–7.0) | 15.5 (15.0–16.0) | 29.0 (28.0–30.0) |" in table


def test_benchmarks_md_section_is_the_render_of_its_committed_data():
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    names = re.findall(r"benchmarks/data/(start_phases_\w+\.json)", section)
    assert names, "the section names its data file"
    phases = json.loads((ROOT / "benchmarks" / "data" / names[0]).read_text())
    e2e_files = re.findall(r"benchmarks/data/(start_e2e_\w+\.json)", section)
    e2e = json.loads((ROOT / "benchmarks" / "data" / e2e_files[0]).read_text()) if e2e_files else None
    assert section == render(phases, e2e, f"benchmarks/data/{e2e_files[0]}" if e2e_files else "").strip()


@pytest.mark.heavy
@pytest.mark.ray
def test_quick_run_measures_every_phase_and_one_restart(tmp_path):
    out = tmp_path / "quick.json"
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.start_phases", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "not a result" in res.stdout
    (run,) = json.loads(out.read_text())["runs"]
    assert run["k"] == 5 and run["actors"] == 5
    for phase in PHASES:
        assert len(run["phases"][phase]) == 5 and all(v >= 0 for v in run["phases"][phase]), phase
    assert run["restarts"] == 1 and run["replaced_in_s"] > 0  # the killed actor was replaced once
    assert run["fresh_actor_s"] > 0
    assert all(s > 0 for s in run["first_epoch_s"]) and run["floor"] > 0
