"""What each Ray actor of a run is called, and how a member actor describes itself.

The Ray dashboard's Actors page lists actors by class (``MemberGroup``), which says nothing
about who is who. Every actor popgrpo starts is therefore named after the run and what it
holds, in a namespace of its own run:

========================  =====================================================
``<run>/member-3``        a member actor holding member 3
``<run>/members-0-7``     a packed member actor (``population.members_per_actor``)
``<run>/archive``         the archive actor (shared archive or Redis write-through)
``<run>/epoch-counter``   counts member epochs for the progress bar (popgrpo.runtime.progress)
``<run>/evaluator``       held-out evaluation and θ_0 at a round's end (when the scheduler is on)
========================  =====================================================

``<run>`` is the run directory's name (what ``popgrpo train`` prints as ``run directory:``),
or ``<run.name>-<id>`` for a run without one. The namespace is that label plus a
per-invocation id (:func:`run_namespace`), so two runs on one cluster never collide on a
name, even two with the same run directory name. A rebuilt actor (a lost process or node,
:meth:`~popgrpo.runtime.ray_executor.RayExecutor._call`) takes the same name once the lost
one is gone (:func:`wait_until_free`), and a resumed run (same run directory) the same
names in a new namespace.

Ray reads an actor's ``__repr__`` once, when its constructor returns: that string is the
dashboard's Repr column and the prefix of the actor's log lines for its whole life. Later
calls of ``repr`` (the ``repr=`` of a failed call's error) see the live state.
:func:`describe_group` says at both times what is true then.

Everything here but :func:`wait_until_free` is pure and imports no Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

__all__ = [
    "archive_actor_name",
    "describe_group",
    "epoch_counter_name",
    "evaluator_actor_name",
    "member_actor_name",
    "member_label",
    "rollout_worker_name",
    "run_namespace",
    "wait_until_free",
]


def run_namespace(run_label: str, run_id: str) -> str:
    """The Ray namespace of one run: ``popgrpo.<run label>.<run id>``.

    ``run_id`` is new at every invocation, so two runs (or a run and its resume) never share
    a namespace, whatever their labels.
    """
    if not run_label or not run_id:
        raise ValueError("a run namespace needs a run label and a run id")
    return f"popgrpo.{run_label}.{run_id}"


def member_label(member_ids: Sequence[int]) -> str:
    """``member-3`` for one member; ``members-0-7`` for a contiguous pack; ``members-0-2,5``
    (runs joined by commas) otherwise. ``member_ids`` in any order, no repeats."""
    ids = sorted(member_ids)
    if not ids:
        raise ValueError("a member actor holds at least one member")
    if len(set(ids)) != len(ids) or ids[0] < 0:
        raise ValueError(f"member ids must be distinct and non-negative: {list(member_ids)}")
    if len(ids) == 1:
        return f"member-{ids[0]}"
    runs: list[tuple[int, int]] = []
    for k in ids:
        if runs and k == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], k)
        else:
            runs.append((k, k))
    return "members-" + ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def member_actor_name(run_label: str, member_ids: Sequence[int]) -> str:
    """``<run>/member-3`` or ``<run>/members-0-7`` (:func:`member_label`)."""
    return f"{run_label}/{member_label(member_ids)}"


def archive_actor_name(run_label: str) -> str:
    """``<run>/archive``: the run's one archive actor."""
    return f"{run_label}/archive"


def epoch_counter_name(run_label: str) -> str:
    """``<run>/epoch-counter``: the run's :class:`~popgrpo.runtime.progress.EpochCounter`."""
    return f"{run_label}/epoch-counter"


def evaluator_actor_name(run_label: str) -> str:
    """``<run>/evaluator``: the run's :class:`~popgrpo.runtime.actors.EvaluatorActor`."""
    return f"{run_label}/evaluator"


def rollout_worker_name(run_label: str) -> str:
    """``<run>/rollout-worker``: the run's shared rollout worker (:mod:`popgrpo.runtime.rollout_worker`)."""
    return f"{run_label}/rollout-worker"


def describe_group(
    label: str,
    device: str,
    build: int,
    epochs_done: int | None,
    total_epochs: int,
    interval_epochs: int,
    last_reward_mean: Mapping[int, float],
) -> str:
    """A member actor's ``repr``: which members, then where they are.

    ``label``: the actor's :func:`member_label` (the run is in the actor's name and
    namespace, beside the repr on the dashboard); ``build``: 0 for an actor the run started
    with, n for one built at the run's n-th restart of a lost actor; ``epochs_done``: the
    members' finished epochs, None until the actor has trained or been given a state (until
    then it has nothing true to say about round and epoch: a rebuilt actor, or one of a
    resumed run, is about to be restored); ``last_reward_mean``: each member's mean reward in
    its last epoch, by member id.

    The round is the one the members are in, ``epochs_done // interval_epochs``, the
    scheduler's rounds being ``interval_epochs`` long (the last one possibly shorter).

    >>> describe_group("members-0-1", "cpu", 0, 25, 120, 10, {0: 0.4121, 1: -0.38})
    'members-0-1 [cpu] round 2, epoch 25/120, last reward mean 0: 0.412, 1: -0.380'
    >>> describe_group("member-3", "cpu", 2, None, 120, 10, {})
    'member-3 [cpu] rebuilt (restart 2)'
    """
    head = f"{label} [{device}]"
    if epochs_done is None:
        return f"{head} rebuilt (restart {build})" if build else f"{head} new"
    if epochs_done >= total_epochs:
        where = f"done, epoch {epochs_done}/{total_epochs}"
    else:
        where = f"round {epochs_done // max(1, interval_epochs)}, epoch {epochs_done}/{total_epochs}"
    if not last_reward_mean:
        return f"{head} {where}"
    rewards = ", ".join(f"{k}: {_number(v)}" for k, v in sorted(last_reward_mean.items()))
    return f"{head} {where}, last reward mean {rewards}"


def _number(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else str(value)


def wait_until_free(name: str, namespace: str, timeout_s: float = 60.0) -> None:
    """Return once no live actor holds ``name`` in ``namespace`` (at once when none does).

    A killed actor gives its name back when Ray has marked it dead, which may lag the kill
    (a lost node is noticed late); its replacement must not be created before. Raises
    TimeoutError after ``timeout_s``.
    """
    import ray

    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:  # Ray's answer for "no live actor of that name"
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"actor name {name!r} is still held in namespace {namespace!r} after {timeout_s:g}s")
        time.sleep(delay)
        delay = min(1.0, delay * 2)
