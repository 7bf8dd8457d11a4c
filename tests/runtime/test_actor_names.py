"""Who is who on a real Ray: every actor of a run is named after the run and what it holds, two
runs on one cluster keep their names apart, a rebuilt actor takes the lost one's name, and a
member actor's repr tells its round, epoch and rewards (read by Ray once, live afterwards)."""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.state import list_actors

from popgrpo.runtime.ray_executor import RayExecutor
from tests.configs import pop_grpo
from tests.driving import sigkill

pytestmark = [pytest.mark.ray, pytest.mark.heavy]


# Two members, one to an actor, merged every 2 epochs of one step.
TWO_ACTORS = (
    "population.size=2",
    "population.members_per_actor=1",
    "population.resources.num_cpus=0.5",
    "run.epochs=4",
    "scheduler.interval_epochs=2",
    "grpo.steps_per_epoch=1",
    "scheduler.top_m=2",
)


def _actors(namespace: str, state: str | None = None) -> list:
    filters = [("ray_namespace", "=", namespace)] + ([("state", "=", state)] if state else [])
    # The connected cluster's own address: another Ray on this machine (a parallel test worker's)
    # would make the state API's search for one ambiguous.
    address = ray.get_runtime_context().gcs_address
    return list_actors(address=address, filters=filters, detail=True, raise_on_missing_output=False)


def _live_repr(actor) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: repr(self)))


def test_two_concurrent_runs_with_one_run_name_keep_their_names_apart(ray_local, tmp_path):
    """Same run name and even the same run directory name: each run's actors live in its own
    namespace, under names that say what they hold, and each name finds its own run's actor."""
    first = RayExecutor(pop_grpo(*TWO_ACTORS, "archive.shared=true"), run_dir=tmp_path / "a" / "run")
    second = RayExecutor(pop_grpo(*TWO_ACTORS), run_dir=tmp_path / "b" / "run")
    try:
        assert first.namespace != second.namespace
        # each run's evaluator actor, started once its members were placed, has answered
        for executor in (first, second):
            executor.round0_weights([0])
        every_run = {"run/member-0", "run/member-1", "run/evaluator"}
        assert {a.name for a in _actors(first.namespace, "ALIVE")} == {*every_run, "run/archive"}
        assert {a.name for a in _actors(second.namespace, "ALIVE")} == every_run
        for executor in (first, second):
            for k, actor in enumerate(executor._actors):
                found = ray.get_actor(f"run/member-{k}", namespace=executor.namespace)
                assert ray.get(found.pid.remote()) == ray.get(actor.pid.remote())
        # Ray's Repr column: what each actor said when its constructor returned.
        reprs = {a.name: a.repr_name for a in _actors(first.namespace, "ALIVE")}
        assert reprs["run/member-0"] == "member-0 [cpu] new"
        assert reprs["run/archive"] == "archive: 1 shared archive, new"
        assert reprs["run/evaluator"] == "evaluator: held-out evaluation and θ_0 at a round's end"
        # Both train side by side; the live repr follows the members, the Repr column does not.
        first.train(2, 0)
        second.train(1, 0)
        assert _live_repr(first._actors[1]).startswith("member-1 [cpu] round 1, epoch 2/4, last reward mean 1: ")
        assert _live_repr(second._actors[0]).startswith("member-0 [cpu] round 0, epoch 1/4, last reward mean 0: ")
        assert {a.repr_name for a in _actors(first.namespace, "ALIVE")} == set(reprs.values())
    finally:
        first.close()
        second.close()


def test_a_rebuilt_member_actor_takes_the_lost_ones_name(ray_local, tmp_path):
    executor = RayExecutor(pop_grpo(*TWO_ACTORS), run_dir=tmp_path / "rebuilt-run")
    try:
        executor.snapshot()  # the restore point: the initial states
        lost_pid = ray.get(executor._actors[0].pid.remote())
        assert sigkill(lost_pid)
        executor.train(1, 0)  # finds member 0's actor lost, rebuilds it, replays, retries
        assert executor.restarts == 1
        name = "rebuilt-run/member-0"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the state API learns of the death a moment later
            named = [a for a in _actors(executor.namespace) if a.name == name]
            if sorted(a.state for a in named) == ["ALIVE", "DEAD"]:
                break
            time.sleep(0.5)
        assert sorted(a.state for a in named) == ["ALIVE", "DEAD"]
        [alive] = [a for a in named if a.state == "ALIVE"]
        assert alive.repr_name == "member-0 [cpu] rebuilt (restart 1)"
        found = ray.get_actor(name, namespace=executor.namespace)
        assert ray.get(found.pid.remote()) == ray.get(executor._actors[0].pid.remote()) != lost_pid
        assert _live_repr(found).startswith("member-0 [cpu] round 0, epoch 1/4, last reward mean 0: ")
    finally:
        executor.close()
