"""A worker node lost from a real multi-node Ray cluster: its members move, the run completes.

The driver runs in a subprocess (tests/cluster/scenarios.py), so losing a node can end only it.
"""

import json

import pandas as pd
import pytest

pytest.importorskip("ray")

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
from tests.cluster import scenarios
from tests.driving import drive

# A 3-node cluster in a subprocess: make test-slow (docs/reference/tests.md).
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.solo]


def test_worker_node_removed_mid_round(tmp_path):
    result = scenarios.run("node_loss", tmp_path)
    cfg = load_config(preset_path("pop_grpo"), scenarios.CONFIGS["node_loss"])
    reference_rows, _ = drive(cfg, LocalExecutor(cfg))
    assert result["removed"]
    assert result["restarts"] >= 1 and result["restart_events"] == result["restarts"]
    assert not result["victim_still_used"]
    # the lost members replayed their round exactly (frame comparison: NaN equals NaN)
    pd.testing.assert_frame_equal(pd.DataFrame(result["rows"]), pd.DataFrame(reference_rows))


def test_worker_node_removed_after_an_actor_answered_before_the_driver_fetched_the_answer(tmp_path):
    """The node goes after its actor answered but before the driver fetched the answer (stored
    in that node's object store): the answer is lost with the node, the actor is rebuilt on the
    other node and asked again, and the numbers are the undisturbed in-process run's."""
    result = scenarios.run("answer_lost", tmp_path)
    cfg = load_config(preset_path("pop_grpo"), scenarios.CONFIGS["node_loss"])
    reference_rows, _ = drive(cfg, LocalExecutor(cfg))
    assert result["removed"] and result["object_size"] > 100 * 1024  # too large to travel inline
    assert result["restarts"] >= 1 and not result["victim_still_used"]
    assert any("lost" in reason.lower() for reason in result["restart_reasons"]), result["restart_reasons"]
    pd.testing.assert_frame_equal(pd.DataFrame(result["rows"]), pd.DataFrame(reference_rows))


def test_worker_node_removed_mid_round_in_async_rounds(tmp_path):
    """scheduler.mode=async with S = 0: the lost actors are rebuilt from their members' restore
    points and redo their round; the numbers are the undisturbed in-process run's."""
    from popgrpo.train import train

    result = scenarios.run("node_loss_async", tmp_path)
    assert result["removed"] and result["restarts"] >= 1
    cfg = load_config(preset_path("pop_grpo"), [*scenarios.CONFIGS["node_loss"], "run.loggers=[]"])
    train(cfg, tmp_path / "reference", progress=False)
    reference = pd.read_parquet(tmp_path / "reference" / "metrics.parquet").drop(columns=["seconds"], errors="ignore")
    # Both through JSON (the scenario's result is JSON): the same value types on either side.
    pd.testing.assert_frame_equal(
        pd.DataFrame(result["rows"]), pd.DataFrame(json.loads(json.dumps(reference.to_dict("records"))))
    )


def test_a_frozen_worker_node_is_taken_as_lost_and_its_members_move(tmp_path):
    """Every process of a worker node SIGSTOPped mid-round (a frozen VM): its actor is taken as
    hung, the node as lost when it does not run the kill task, the actor is rebuilt on the
    other node, and the numbers are the undisturbed in-process run's."""
    result = scenarios.run("frozen_node", tmp_path)
    cfg = load_config(preset_path("pop_grpo"), [*scenarios.CONFIGS["node_loss"], *scenarios.FROZEN_DEADLINES])
    reference_rows, _ = drive(cfg, LocalExecutor(cfg))
    print(result["finished_after_s"], result["restart_reasons"])  # pytest -s
    assert result["frozen"] and result["restarts"] >= 1
    assert any("did not run the kill task" in reason for reason in result["restart_reasons"]), result
    assert result["lost_nodes"] == [result["victim"]] and not result["victim_still_used"]
    pd.testing.assert_frame_equal(pd.DataFrame(result["rows"]), pd.DataFrame(reference_rows))
