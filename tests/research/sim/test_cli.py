"""``popgrpo simulate`` from the command line: its table, its JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from popgrpo.cli import main
from popgrpo.research.sim.costs import CostModel, Linear

COSTS = CostModel(epoch_s=0.05, weight_bytes=100_000, call_s=0.001, driver_s=Linear(0.02, 0.001), start_s=1.0)


@pytest.fixture
def costs_file(tmp_path):
    path = tmp_path / "costs.json"
    COSTS.save(path)
    return path


def test_both_modes_in_one_table(costs_file, capsys):
    code = main(
        ["simulate", "--costs", str(costs_file), "--set", "population.size=16", "--nodes", "2",
         "--cores-per-node", "8", "--straggler-sigma", "1", "--buffer", "4", "--max-staleness", "2", "--seeds", "0,1"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "K = 16 members in 16 actors on 2 × 8 cores" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("sync", "async"))}
    assert set(lines) == {"sync", "async"}
    assert lines["async"].split()[1:3] == ["4", "2"] and lines["sync"].split()[1] == "16"
    assert lines["sync"].rstrip().endswith("2/2")


def test_json_matches_the_model(costs_file, capsys):
    from popgrpo.research.sim.model import ClusterShape, Scheduling, Workload, simulate

    assert main(["simulate", "--costs", str(costs_file), "--mode", "sync", "--json", "--seeds", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    run = data["results"][0]["runs"][0]
    work = Workload(members=5, epochs=120, interval=10, top_m=3)  # the pop_grpo preset
    direct = simulate(COSTS, work, ClusterShape(1, 2), Scheduling("sync"), seed=3)
    assert run["wall_s"] == pytest.approx(direct.wall_s)
    assert data["costs"]["epoch_s"] == COSTS.epoch_s


def test_epoch_override_scales_the_run(costs_file, capsys):
    assert main(["simulate", "--costs", str(costs_file), "--mode", "sync", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)["results"][0]["runs"][0]["wall_s"]
    assert main(["simulate", "--costs", str(costs_file), "--mode", "sync", "--json", "--epoch-s", "0.5"]) == 0
    slow = json.loads(capsys.readouterr().out)["results"][0]["runs"][0]["wall_s"]
    assert slow > 5 * base


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--costs", "/nonexistent/costs.json"], "--costs /nonexistent/costs.json: FileNotFoundError"),
        (["--seeds", "a,b"], "--seeds: expected integers"),
        (["--nodes", "0"], "--nodes and --cores-per-node must be at least 1"),
        (["--set", "population.size=0"], "population.size"),
        (["--hang-probability", "1.5"], "--hang-probability in [0, 1)"),
    ],
)
def test_bad_input_exits_2_with_one_line(costs_file, capsys, argv, message):
    args = ["simulate", *argv] if "--costs" in argv else ["simulate", "--costs", str(costs_file), *argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_file_that_is_not_a_cost_model(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"epoch_s": 1.0, "weight_bytes": 1, "colour": "red"}))
    assert main(["simulate", "--costs", str(bad)]) == 2
    assert "not a cost model: unknown cost fields: colour" in capsys.readouterr().err
