"""Ending an actor's process for real, even a stopped one, so that its replacement can be placed.

``ray.kill`` asks the actor's worker process to exit. A stopped process (SIGSTOP, a frozen
VM, a node swapping to a halt) never hears it: Ray marks the actor dead, but the process
stays, and so does its lease of CPUs and GPUs, so a replacement that needs them is never
placed. :func:`end_actor` therefore

1. reads the actor's process id and node from Ray's actor table (the GCS: no dashboard needed);
2. calls ``ray.kill`` (a member actor is not restarted; the archive actor is left to Ray,
   which restarts it);
3. sends SIGKILL, which reaches a stopped process: from this process when the actor runs on
   the driver's node, else from a task pinned to its node
   (:class:`~ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy`); either waits
   until the process is gone, which is when its node's raylet takes the lease back;
4. takes a node that does not run that task within ``node_answer_s`` as lost: the GCS is asked
   to remove it from the cluster (``drain_nodes``, the node removal Ray's autoscaler uses, which
   shuts its raylet down if it ever answers again), and the caller places no replacement on it
   (:class:`~popgrpo.runtime.ray_executor.RayExecutor` keeps such nodes out with a
   ``NodeLabelSchedulingStrategy``), since Ray itself may list a frozen node alive until its
   health checks give up on it.

Only a process that is still the actor's worker is signalled: the process title must be a
Ray worker's (``ray::…``) naming the actor's class, so a process id reused since is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError

__all__ = ["Ending", "end_actor", "end_actors", "is_stopped", "locate", "process_state", "sigkill_worker"]

log = logging.getLogger(__name__)

# Seconds a node has to run the pinned kill task before it is taken as lost. A live node
# starts a worker for it within a few seconds even when loaded; being wrong costs a healthy
# node, so this is generous.
NODE_ANSWER_S = 30.0


@dataclass(frozen=True)
class Ending:
    """How an actor was ended: its process and node (None: Ray had not started one), what was
    done (``how``), whether its node was taken as lost, and the seconds it all took."""

    pid: int | None
    node_id: str | None
    how: str
    node_lost: bool
    seconds: float

    def describe(self) -> str:
        """One line for the log and the event: ``pid 4242 on node 1a2b3c4d: SIGKILL from the driver (0.1 s)``."""
        where = "no process yet" if self.pid is None else f"pid {self.pid} on node {(self.node_id or '?')[:8]}"
        return f"{where}: {self.how} ({self.seconds:.1f} s)"


def locate(actor: Any) -> tuple[int | None, str | None, str]:
    """``(pid, node id, state)`` of ``actor`` from Ray's actor table; pid None when no worker has
    been given to it yet (pending creation), node None when not placed either."""
    from ray._private import state

    info = state.actors(actor_id=actor._actor_id.hex())
    if not info:
        return None, None, "UNKNOWN"
    node = info["Address"]["NodeID"] or None
    if node is not None and set(node) == {"f"}:  # Ray's nil id
        node = None
    return int(info["Pid"]) or None, node, str(info["State"])


_located: dict[str, tuple[int, str]] = {}  # actor id → (pid, node id), once Ray has given it a process


def is_stopped(actor: Any) -> bool:
    """Whether ``actor``'s process runs on this node and is stopped (SIGSTOP, a debugger: state
    ``T``), which it stays until someone continues it: a sure sign of a hang, seen without
    waiting for a deadline. False for a process on another node (only its deadline tells)."""
    key = actor._actor_id.hex()
    if key not in _located:
        try:
            pid, node, _ = locate(actor)
        except Exception:
            return False
        if pid is None or node is None:
            return False
        _located[key] = (pid, node)
    pid, node = _located[key]
    if node != ray.get_runtime_context().get_node_id():
        return False
    state = _state(pid)
    if state is None:  # gone: a restarted actor (the archive's) has a new process
        del _located[key]
    return state in ("T", "t")


def process_state(actor: Any, node_answer_s: float = NODE_ANSWER_S) -> str | None:
    """The state letter of ``actor``'s process (``R``, ``S``, ``T`` stopped…), read on its node
    (here, or by a task pinned there), without a call into the actor (whose queue may be long);
    None when it has no process (gone, or not started); ``"unreachable"`` when its node did
    not run the task within ``node_answer_s`` (a frozen node)."""
    pid, node, _ = locate(actor)
    if pid is None or node is None:
        return None
    if node == ray.get_runtime_context().get_node_id():
        return _state(pid)
    global _remote_state
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if _remote_state is None:
        _remote_state = ray.remote(num_cpus=0, max_retries=0)(_state)
    ref = _remote_state.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), name="popgrpo-process-state"
    ).remote(pid)
    try:
        return ray.get(ref, timeout=node_answer_s)
    except RayError:  # not cancelled: see _sigkill_on
        return "unreachable"


_remote_state: Any = None


def sigkill_worker(pid: int, class_name: str, wait_s: float = 10.0, grace_s: float = 0.0) -> str:
    """SIGKILL ``pid`` if it is still a Ray worker of ``class_name``, then wait until it is gone.

    ``grace_s``: first give a process that is not stopped that long to exit by itself (after
    ``ray.kill``), so that only what did not is killed. Returns ``"killed"``, ``"gone"`` (no such
    process, or one that is no longer that worker) or ``"still there"`` (it outlived ``wait_s``:
    not ours to kill, or the kernel is stuck). Runs on the actor's node (in the driver, or in a
    task pinned there).
    """
    proc = f"/proc/{pid}"
    if os.path.isdir("/proc"):
        try:
            with open(f"{proc}/cmdline", "rb") as fh:
                title = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return "gone"
        if not title.startswith("ray::") or class_name not in title:
            return "gone"  # the pid was reused, or is not a worker of that actor
    grace_end = time.monotonic() + grace_s
    while time.monotonic() < grace_end and _state(pid) not in ("T", "t", None):
        time.sleep(0.02)
    if _state(pid) is None:
        return "gone"
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "gone"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return "killed"
        time.sleep(0.02)
    return "still there"


def _state(pid: int) -> str | None:
    """``pid``'s state letter (``R``, ``S``, ``T`` stopped…; ``?`` where there is no /proc), None
    when there is no such live process (a zombie, waiting for its parent, is not one)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rpartition(")")[2].split()[0]
        return None if state in ("Z", "X") else state
    except OSError:
        if os.path.isdir("/proc"):
            return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "?"


def _alive(pid: int) -> bool:
    return _state(pid) is not None


_remote_sigkill: Any = None


def _submit_sigkill(node_id: str, pid: int, class_name: str, grace_s: float = 0.0) -> Any:
    global _remote_sigkill
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if _remote_sigkill is None:
        _remote_sigkill = ray.remote(num_cpus=0, max_retries=0)(sigkill_worker)
    return _remote_sigkill.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), name="popgrpo-sigkill"
    ).remote(pid, class_name, grace_s=grace_s)


def _sigkill_on(node_id: str, pid: int, class_name: str, timeout_s: float) -> str | None:
    """:func:`sigkill_worker` in a task pinned to ``node_id``; None when the node did not run it in time."""
    ref = _submit_sigkill(node_id, pid, class_name)
    try:
        return ray.get(ref, timeout=timeout_s)
    except RayError:  # GetTimeoutError: the node did not run it; any other: it could not (node gone)
        # Not cancelled: ray.cancel racing the task's end crashed the driver's core worker
        # ("Tried to complete task that was not pending", Ray 2.60). Left pending on a frozen
        # node, it fails with the node, or kills only that actor's old process if it runs late.
        return None


def _node_alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def remove_node(node_id: str, timeout_s: float = 5.0) -> bool:
    """Ask the GCS to remove ``node_id`` from the cluster (``drain_nodes``: it shuts the node's
    raylet down once that answers) and wait up to ``timeout_s`` for Ray to report it dead; True
    if it did. A frozen raylet answers nothing, so Ray may list it alive until its health
    checks give up on it: the caller places nothing there meanwhile."""
    if not _node_alive(node_id):
        return True
    from ray._private.worker import global_worker

    gcs = global_worker.gcs_client  # pyright: ignore[reportAttributeAccessIssue]  (set once connected)
    try:
        gcs.drain_nodes(node_ids=[bytes.fromhex(node_id)], timeout=timeout_s)
    except Exception as exc:
        log.warning("the GCS did not remove node %s: %s", node_id[:8], exc)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _node_alive(node_id):
            return True
        time.sleep(0.1)
    return False


def end_actor(
    actor: Any,
    class_name: str,
    restart: bool = False,
    node_answer_s: float = NODE_ANSWER_S,
    lost_nodes: Collection[str] = (),
) -> Ending:
    """End ``actor``'s process for real (module docstring) and return how.

    ``restart``: leave the actor to Ray to restart (its ``max_restarts``), as for the archive
    actor; otherwise it is killed for good. ``lost_nodes``: nodes already taken as lost, whose
    processes are not asked again. Never raises for an actor that is already gone.
    """
    start = time.monotonic()
    try:
        pid, node, _ = locate(actor)
    except Exception as exc:  # the GCS did not answer: ray.kill is all that is left
        log.warning("cannot read the actor table (%s): ray.kill only", exc)
        pid, node = None, None
    if not restart:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    node_lost = False
    if pid is None or node is None:
        how = "ray.kill (no process yet)"
    elif node in lost_nodes:
        how, node_lost = "ray.kill; its node was taken as lost before", True
    elif node == ray.get_runtime_context().get_node_id():
        how = f"SIGKILL from the driver: {sigkill_worker(pid, class_name)}"
    elif not _node_alive(node):
        how, node_lost = "its node is gone (Ray reports it dead)", True
    else:
        answer = _sigkill_on(node, pid, class_name, node_answer_s)
        if answer is not None:
            how = f"SIGKILL from a task on its node: {answer}"
        elif not _node_alive(node):  # it went while the task was sent
            how, node_lost = "its node is gone (Ray reports it dead)", True
        else:
            node_lost = True
            removed = remove_node(node)
            how = f"its node did not run the kill task within {node_answer_s:g} s: taken as lost, " + (
                "removed from the cluster" if removed else "its removal asked of the GCS"
            )
    if not restart:
        _wait_dead(actor, start + node_answer_s)
    ending = Ending(pid, node, how, node_lost, time.monotonic() - start)
    log.info("ended %s actor: %s", class_name, ending.describe())
    return ending


def _wait_dead(actor: Any, deadline: float) -> None:
    """Until Ray's actor table says DEAD (it frees the name and the lease), or ``deadline``."""
    while time.monotonic() < deadline:
        try:
            if locate(actor)[2] == "DEAD":
                return
        except Exception:
            return
        time.sleep(0.05)


def end_actors(actors: Sequence[tuple[Any, str]], node_answer_s: float = 10.0) -> None:
    """End many ``(actor, class name)`` at once, for good (a run's close): ``ray.kill`` each,
    then SIGKILL what is left of their processes, the tasks on other nodes all sent together
    and waited for ``node_answer_s`` at most. A node that does not answer is left to Ray."""
    located = []
    for actor, class_name in actors:
        try:
            pid, node, _ = locate(actor)
        except Exception:
            pid, node = None, None
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        if pid is not None and node is not None:
            located.append((pid, node, class_name))
    here = ray.get_runtime_context().get_node_id()
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]} if located else set()
    refs = []
    for pid, node, class_name in located:
        if node not in alive:  # gone with its node
            continue
        if node == here:
            sigkill_worker(pid, class_name, wait_s=1.0, grace_s=2.0)
        else:
            refs.append(_submit_sigkill(node, pid, class_name, grace_s=2.0))
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=node_answer_s)  # the rest left pending: see _sigkill_on
