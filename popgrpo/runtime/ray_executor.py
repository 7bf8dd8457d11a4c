"""The Ray executor: members packed into actors; where the archives live depends on the config.

The pieces: :mod:`popgrpo.runtime.cluster` (an embedded Ray or an existing cluster, and whether
the population fits), :mod:`popgrpo.runtime.actors` (member groups and the archive actor),
:mod:`popgrpo.runtime.recovery` (what a rebuilt actor restarts from), and
:class:`RayExecutor` here, which drives them through a round. Member seeds are keyed by
member id (not by actor or process), so a run gives the same numbers here as on the
:class:`~popgrpo.runtime.executor.LocalExecutor`, whatever ``members_per_actor`` is.

Traffic per round: one ``train`` call per actor (T epochs each); the merged model is
``ray.put`` once and every actor receives the same object reference; each member mutates it
locally (Gaussian or SVD, from its own (member, round) stream).

Where the archives (MAP-Elites grid + novelty memory) live:

* **Private archives, no Redis** (``archive.shared: false``, ``archive.redis_url`` unset; the
  default): each member's :class:`LocalArchive` lives in its :class:`MemberGroup` actor and the
  member calls it in-process, as on the ``LocalExecutor``: no Ray call per GRPO step, and no
  archive actor. The driver fetches the archive states from the groups at each round's
  :meth:`RayExecutor.snapshot`, together with the member states (one call per actor); that is
  the checkpoint and the point a rebuilt actor restarts from, members and archives together,
  before it replays the round exactly.
* **Shared archive** (``archive.shared: true``): one archive must have one writer, so it lives
  in the named archive actor (:class:`ArchiveActor`), and each member makes one call to it per
  GRPO step (``step``: statuses and novelty together; QD-GRPO's bonuses need the statuses
  before the update).
* **Redis write-through** (``archive.redis_url`` set, private or shared): the archive actor
  keeps every archive and is called per step, as for a shared archive, so that every accepted
  elite is in Redis before its status returns to the member. Redis is what buys that guarantee;
  its price is the per-step round trip.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import ray
import torch
from ray.exceptions import ObjectLostError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from popgrpo.algorithms.archive_service import LocalArchive, LocalArchiveState
from popgrpo.algorithms.population import Adoption
from popgrpo.config import Config
from popgrpo.runtime.actors import ArchiveActor, MemberGroup, RestoreInfo, archives_in_groups
from popgrpo.runtime.archive_store import resolve_redis_password
from popgrpo.runtime.cluster import ClusterTooSmallError, SetupError, check_fits, connect
from popgrpo.runtime.deadlines import CallDeadlines
from popgrpo.runtime.executor import make_archives
from popgrpo.runtime.naming import (
    archive_actor_name,
    member_actor_name,
    rollout_worker_name,
    run_namespace,
    wait_until_free,
)
from popgrpo.runtime.recovery import RecoveryLog
from popgrpo.runtime.rollout_worker import RolloutWorker
from popgrpo.runtime.transport import pack, unpack
from popgrpo.telemetry.live import LiveMetrics

log = logging.getLogger(__name__)

__all__ = ["RayExecutor"]


# What a lost member actor's answer raises: the actor died or its node is gone (RayActorError),
# or the node went after the actor answered but before the driver fetched an answer too large
# to travel inline (ObjectLostError: a member call's result is never reconstructed, since a
# state-changing actor call must not run twice on its own).
LOST_ANSWER = (RayActorError, ObjectLostError)


def _loss_reason(exc: BaseException) -> str:
    """The first line of what a lost actor's answer raised. An actor whose ``__init__`` raised
    is a bug or bad input, not a lost process: that is raised again."""
    if isinstance(exc, RayActorError) and exc.actor_init_failed:
        raise exc
    if isinstance(exc, ObjectLostError):
        return f"its answer was lost with the node that held it ({type(exc).__name__})"
    return str(exc).splitlines()[0]


def _check_sent(sent: tuple[Any, ...], n_epochs: int) -> None:
    """A train call sent behind an adopt must be the one the round loop makes next: the actor runs it
    whatever happens, so a different one would train its members twice."""
    if sent[1] != n_epochs:
        raise RuntimeError(
            f"member actor {sent[0]}: a train call of {sent[1]} epochs was sent after its adopt, "
            f"but the round loop asks for {n_epochs}"
        )


class RayExecutor:
    """Members on Ray actors; the same interface as :class:`LocalExecutor`."""

    def __init__(self, config: Config, run_dir: str | Path | None = None, address: str | None = None) -> None:
        self.config = config
        self.n_members = config.population.size
        per_actor = config.population.members_per_actor
        res = config.population.resources
        ids = list(range(self.n_members))
        self._groups = [ids[i : i + per_actor] for i in range(0, len(ids), per_actor)]
        needed_cpus = len(self._groups) * res.num_cpus
        self._started_ray = connect(address, num_cpus=max(os.cpu_count() or 1, math.ceil(needed_cpus)))
        try:
            check_fits(len(self._groups), res.num_cpus, res.num_gpus, wait_s=res.wait_for_cluster_s)
        except ClusterTooSmallError:
            if self._started_ray:
                ray.shutdown()
            raise
        config_json = config.model_dump_json()
        self.run_id = uuid.uuid4().hex[:8]
        self.run_tag = Path(run_dir).name if run_dir else f"{config.run.name}-{self.run_id}"  # metrics tag
        self.metrics = LiveMetrics(self.run_tag)
        # Every actor is named after the run and what it holds, in this run's own namespace.
        self.namespace = run_namespace(self.run_tag, self.run_id)
        redis_password = None
        if config.archive.redis_url:
            redis_password = resolve_redis_password(config.archive.redis_url)
            self._check_redis(config.archive.redis_url, redis_password)
        run_key = f"{config.run.name}-{self.run_id}"  # keys the run's entries in Redis
        # Private archives without Redis live in the member actors: no archive actor at all.
        self._in_groups = archives_in_groups(config)
        # Actor handles are Any here: Ray types an actor method's .remote as the method itself.
        self.archive_actor: Any = None
        self._archive_pid: int | None = None
        if not self._in_groups:
            self.archive_actor = ArchiveActor.options(
                name=archive_actor_name(self.run_tag),
                namespace=self.namespace,
                # On the driver's node: a restarted archive actor reads the run directory's snapshot.
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
            ).remote(config_json, str(run_dir) if run_dir else None, run_key, redis_password)
            self._archive_pid = ray.get(self.archive_actor.pid.remote())
        self._config_json = config_json
        self.recovery = RecoveryLog([a.state_dict() for a in make_archives(config)])
        self._adopted: list[list[Any]] | None = None  # [members, archives] sent back by the last adopt
        self.restarts = 0
        self.events: list[dict] = []
        pop = config.population
        self._deadlines = CallDeadlines(pop.hang_deadline_factor, pop.hang_deadline_min_s)
        # Asynchronous rounds: per actor, the calls made since its members last adopted a merge.
        self._since_adopt: dict[int, list[tuple[str, tuple[Any, ...]]]] = {}
        # train_after_adopt: actor → epochs of the train call to send right after its adopt call,
        # then the handle of that call (as submit_train makes it), until the round loop asks for it.
        self._train_plan: dict[int, int] = {}
        self._sent_train: dict[int, tuple[Any, ...]] = {}
        self._group_of = {k: g for g, group in enumerate(self._groups) for k in group}
        self.rollout_worker: Any = self._start_rollout_worker(config)
        self._actors: list[Any] = [self._new_group(group) for group in self._groups]
        # The first call of each actor goes through _call like every later one: an actor lost
        # while it was being built (its node gone, an OOM while loading a model) answers it with
        # an actor error and is rebuilt, from its own initial state, like one lost mid-round.
        placements = self._call("placement", lambda g: ())
        # A member without the GPU it reserved is reported, not silently slower.
        for g, group in enumerate(self._groups):
            if placements[g]["warning"]:
                self.events.append({"event": "device_fallback", "members": group, "reason": placements[g]["warning"]})

    def _start_rollout_worker(self, config: Config) -> Any:
        """The run's :class:`RolloutWorker` when ``policy.causal_lm.rollout`` runs on one; None otherwise.

        An engine that cannot run there (vLLM not installed) is a :class:`SetupError` naming why.
        """
        rollout = config.policy.causal_lm.rollout
        if config.policy.kind != "causal_lm" or not rollout.on_worker():
            return None
        worker: Any = RolloutWorker.options(
            name=rollout_worker_name(self.run_tag), namespace=self.namespace, num_cpus=0, num_gpus=rollout.worker_gpus()
        ).remote(self._config_json)
        problem = ray.get(worker.ready.remote())
        if problem is not None:
            ray.kill(worker)
            if self._started_ray:
                ray.shutdown()
            raise SetupError(problem)
        return worker

    def _check_redis(self, url: str, password: str | None) -> None:
        """Reach Redis from the driver first: an archive actor that cannot would restart forever."""
        from urllib.parse import urlsplit

        from popgrpo.runtime.archive_store import RedisArchiveStore

        try:
            RedisArchiveStore(url, "probe", password).client.close()
        except Exception as exc:
            parts = urlsplit(url)
            where = f"{parts.hostname}:{parts.port or 6379}"  # never echo the password
            if self._started_ray:
                ray.shutdown()
            raise SetupError(f"archive.redis_url: cannot use Redis at {where}: {type(exc).__name__}: {exc}") from None

    def _new_group(self, group: Sequence[int], build: int = 0) -> Any:
        """A member actor for ``group``, named ``<run>/members-…`` (:mod:`popgrpo.runtime.naming`);
        ``build``: the run's restart count when it replaces a lost one. It takes its name once
        the actor it replaces has let go of it."""
        res = self.config.population.resources
        name = member_actor_name(self.run_tag, group)
        wait_until_free(name, self.namespace)
        return MemberGroup.options(
            name=name, namespace=self.namespace, num_cpus=res.num_cpus, num_gpus=res.num_gpus
        ).remote(self._config_json, group, self.archive_actor, self.run_tag, build, self.rollout_worker)

    # ---- calls that survive lost actors ----------------------------------------------------
    def _call(
        self,
        method: str,
        args_for: Callable[[int], tuple[Any, ...]],
        groups: Sequence[int] | None = None,
        replayable: bool = False,
        after_sent: Callable[[], None] | None = None,
    ) -> dict[int, Any]:
        """Call ``method`` on the given groups' actors; rebuild and retry any that are lost.

        Every call the driver makes on a member actor goes through here, from the first
        (``placement``, right after construction) to the last of a round (``train``,
        ``get_weights``, ``adopt``, ``snapshot``), so an actor lost at any point of its life —
        while being constructed, mid-call or idle between calls — is rebuilt from the restore
        point (the last :meth:`snapshot`, or its own initial state before the first) with the
        calls made since replayed (:class:`RecoveryLog`), and the call is retried.
        ``replayable`` (state-changing) calls are recorded for later replays. Returns each
        group's answer, whose type is the one ``method`` returns. ``after_sent()`` runs once
        every first call is sent, before any answer is awaited.
        """
        groups = range(len(self._actors)) if groups is None else groups
        epochs = (lambda g: int(args_for(g)[0])) if method == "train" else (lambda g: 1)
        refs: dict[int, Any] = {}
        started: dict[int, float] = {}
        for g in groups:
            sent = self._sent_train.pop(g, None) if method == "train" else None
            if sent is not None:  # sent right after its adopt
                _check_sent(sent, int(args_for(g)[0]))
                refs[g], started[g] = sent[2], sent[3]
            else:
                refs[g], started[g] = getattr(self._actors[g], method).remote(*args_for(g)), time.monotonic()
        if after_sent is not None:
            after_sent()
        results: dict[int, Any] = {}
        attempts = dict.fromkeys(refs, 0)
        while refs:
            waiting = {g: started[g] for g in refs}
            ready, _ = ray.wait(list(refs.values()), num_returns=1, timeout=self._wait_s(method, waiting, epochs))
            if not ready:  # some call is past its deadline: that actor is hung
                for g in self._hung(method, waiting, epochs):
                    del refs[g]
                    self._lost(
                        g, attempts, f"no answer to {method} within {time.monotonic() - started[g]:.0f} s (hung)"
                    )
                    refs[g] = getattr(self._actors[g], method).remote(*args_for(g))
                    started[g] = time.monotonic()
                continue
            g = next(g for g, ref in refs.items() if ref == ready[0])
            del refs[g]
            try:
                results[g] = ray.get(ready[0])
                self._deadlines.answered(method, time.monotonic() - started[g], epochs(g))
            except LOST_ANSWER as exc:
                self._lost(g, attempts, _loss_reason(exc), exc)
                refs[g] = getattr(self._actors[g], method).remote(*args_for(g))
                started[g] = time.monotonic()
        if replayable:
            self.recovery.record(method, args_for)
        return results

    def _wait_s(self, method: str, started: Mapping[int, float], epochs: Callable[[int], int]) -> float | None:
        """Seconds until the first of the calls started at ``started`` is past its deadline."""
        limits = [
            started[g] + limit for g in started if (limit := self._deadlines.limit(method, epochs(g))) is not None
        ]
        return max(0.0, min(limits) - time.monotonic()) if limits else None

    def _hung(self, method: str, started: Mapping[int, float], epochs: Callable[[int], int]) -> list[int]:
        now = time.monotonic()
        return [
            g
            for g in started
            if (limit := self._deadlines.limit(method, epochs(g))) is not None and now - started[g] >= limit
        ]

    def _lost(self, g: int, attempts: dict[int, int], reason: str, cause: BaseException | None = None) -> None:
        """Actor ``g`` died or hung during a call: rebuild it, unless it has been lost too often."""
        attempts[g] = attempts.get(g, 0) + 1
        limit = self.config.population.max_restarts
        if attempts[g] > limit:
            raise RuntimeError(
                f"member actor {g} (members {self._groups[g]}) was lost {attempts[g]} times in one call "
                f"(population.max_restarts={limit}; last: {reason}); giving up"
            ) from cause
        self._rebuild_group(g, reason=reason)

    def _rebuild_group(self, g: int, reason: str) -> None:
        group = self._groups[g]
        self.restarts += 1
        self.metrics.record_restart()
        self.events.append({"event": "member_actor_restarted", "actor": g, "members": group, "reason": reason})
        log.warning("member actor %d (members %s) lost: %s; rebuilding it from the last round", g, group, reason)
        ray.kill(self._actors[g], no_restart=True)
        self._sent_train.pop(g, None)  # sent to the lost actor: the round loop's call goes to the new one
        # Until Ray has noticed a lost node, a new actor may still be placed on it and die
        # there too: retry with backoff until one comes up on a live node.
        delay = 0.5
        for attempt in range(self.config.population.max_restarts + 1):
            actor = self._new_group(group, build=self.restarts)
            try:
                self.recovery.replay_into(actor, g, group, self._archive_home())
                self._redo_since_adopt(actor, g)
            except LOST_ANSWER as exc:
                ray.kill(actor, no_restart=True)
                init_failed = isinstance(exc, RayActorError) and exc.actor_init_failed
                if init_failed or attempt == self.config.population.max_restarts:
                    raise
                time.sleep(delay)
                delay *= 2
                continue
            self._actors[g] = actor
            return

    def _redo_since_adopt(self, actor: Any, g: int) -> None:
        """Asynchronous rounds: replay into a rebuilt actor the calls its members made since they
        last adopted (their restore point): the rounds they reported but have not yet merged."""
        for method, args in self._since_adopt.get(g, []):
            ray.get(getattr(actor, method).remote(*args))

    def _archive_home(self) -> Any:
        """Where a rebuilt actor's private archives are rolled back (:meth:`RecoveryLog.replay_into`)."""
        if self._in_groups:
            return "actor"
        return None if self.config.archive.shared else self.archive_actor

    # ---- the Executor interface --------------------------------------------------------------
    def train(self, n_epochs: int, round_index: int = 0) -> list[list[dict]]:
        self._adopted = None  # the members move on: those states are no snapshot any more
        self._train_plan = {}
        self.metrics.record_round(round_index)
        results: dict[int, list[dict]] = {}
        for part in self._call("train", lambda g: (n_epochs,), replayable=True).values():
            results.update(part)
        return [results[k] for k in range(self.n_members)]

    def get_weights(self, member_ids: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        wanted: dict[int, list[int]] = {}
        for k in member_ids:
            wanted.setdefault(self._group_of[k], []).append(k)
        weights: dict[int, dict] = {}
        for part in self._call("get_weights", lambda g: (wanted[g],), groups=list(wanted)).values():
            weights.update(unpack(part))
        return [weights[k] for k in member_ids]

    def adopt(
        self, bases: Mapping[str, Mapping[str, torch.Tensor]], adoptions: Mapping[int, Adoption], round_index: int
    ) -> dict[int, dict]:
        """The members in ``adoptions`` adopt their bases; the states every actor sends back with
        its answer serve the :meth:`snapshot` that follows (the round's checkpoint), without
        another call. Each distinct base is ``ray.put`` once; an actor gets the references of
        the bases its members need and fetches each once."""
        refs = {key: ray.put(pack(dict(base))) for key, base in bases.items()}
        mine = {g: {k: adoptions[k] for k in group if k in adoptions} for g, group in enumerate(self._groups)}
        needed = {g: {a.base for a in part.values() if a.base in refs} for g, part in mine.items()}
        args = lambda g: ({key: refs[key] for key in sorted(needed[g])}, mine[g], round_index)  # noqa: E731
        plan, self._train_plan = self._train_plan, {}

        def send_train() -> None:  # queued behind each actor's adopt: it trains on as soon as it has adopted
            for g, n_epochs in plan.items():
                self._sent_train[g] = self.submit_train(g, n_epochs)

        if self.config.scheduler.mode == "async":
            # Only the actors that reported: the others are training. What they send back
            # becomes their members' restore points (a lost actor restarts from there).
            adopting = [g for g, part in mine.items() if part]
            plan = {g: n for g, n in plan.items() if g in adopting}
            infos: dict[int, dict] = {}
            for part in map(unpack, self._call("adopt", args, groups=adopting, after_sent=send_train).values()):
                infos.update(part["infos"])
                self.recovery.set_member_points(self.n_members, part["members"], part["archives"])
            for g in adopting:
                self._since_adopt.pop(g, None)
            return {k: infos[k] for k in adoptions}
        parts = map(unpack, self._call("adopt", args, replayable=True, after_sent=send_train).values())
        merged_infos, *states = self._merge_parts(parts, ("infos", "members", "archives"))
        self._adopted = states
        return {k: merged_infos[k] for k in adoptions}

    def behaviours(self, member_ids: Sequence[int]) -> dict[int, list[list[float]]]:
        wanted: dict[int, list[int]] = {}
        for k in member_ids:
            wanted.setdefault(self._group_of[k], []).append(k)
        descriptors: dict[int, list[list[float]]] = {}
        for part in self._call("behaviours", lambda g: (wanted[g],), groups=list(wanted)).values():
            descriptors.update(part)
        return {k: descriptors[k] for k in member_ids}

    # ---- asynchronous rounds: one actor at a time (popgrpo.runtime.async_loop) ---------------
    @property
    def groups(self) -> list[list[int]]:
        """The members of each actor, which train and report together."""
        return [list(group) for group in self._groups]

    def submit_train(self, g: int, n_epochs: int) -> Any:
        """Start ``n_epochs`` of actor ``g``'s members; the handle goes to :meth:`wait_train`.

        A call :meth:`train_after_adopt` had sent already is handed over instead of a new one.
        """
        sent = self._sent_train.pop(g, None)
        if sent is not None:
            _check_sent(sent, n_epochs)
            return sent
        return (g, n_epochs, self._actors[g].train.remote(n_epochs), time.monotonic())

    def train_after_adopt(self, n_epochs: Mapping[int, int]) -> None:
        """At the next :meth:`adopt`, send actor ``g`` its next train call of ``n_epochs[g]`` epochs
        right behind its adopt call, without waiting for the answer: the actor runs one call after
        the other, so its members train on from what they adopted as soon as they have, while the
        driver still collects the adopt answers and writes the round. The round loop's next
        :meth:`train` (or :meth:`submit_train`) takes that call over. Results are unchanged."""
        self._train_plan = dict(n_epochs)

    def wait_train(self, handles: list[Any]) -> tuple[Any, dict[int, list[dict]]]:
        """The first of ``handles`` to finish, and its rows per member.

        An actor lost meanwhile is rebuilt from its members' restore points (the states its
        last ``adopt`` sent back, or its initial state) and its call is made again; the
        others keep training.
        """
        attempts: dict[int, int] = {}
        epochs = {h[0]: int(h[1]) for h in handles}
        while True:
            by_ref = {h[2]: h for h in handles}
            started = {h[0]: h[3] for h in handles}
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=self._wait_s("train", started, epochs.__getitem__))
            if not ready:  # some actor is past its deadline: hung
                for g in self._hung("train", started, epochs.__getitem__):
                    i = next(i for i, h in enumerate(handles) if h[0] == g)
                    self._lost(g, attempts, f"no answer to train within {time.monotonic() - started[g]:.0f} s (hung)")
                    handles[i] = self.submit_train(g, epochs[g])
                continue
            handle = by_ref[ready[0]]
            g, n_epochs, ref, start = handle
            try:
                rows = cast(dict[int, list[dict]], ray.get(ref))  # see _archive_states
                self._deadlines.answered("train", time.monotonic() - start, n_epochs)
                self._since_adopt.setdefault(g, []).append(("train", (n_epochs,)))
                return handle, rows
            except LOST_ANSWER as exc:
                self._lost(g, attempts, _loss_reason(exc), exc)
                handles[handles.index(handle)] = self.submit_train(g, n_epochs)

    def restore_points(self) -> tuple[list[dict], list[LocalArchiveState]]:
        """Each member's restore point and the archives' (see :class:`AsyncExecutor`)."""
        if self.recovery.members is None or any(state is None for state in self.recovery.members):
            self.recovery.set_restore_point(*self.snapshot())  # every actor is idle: their states now
        members = [state for state in self.recovery.members or [] if state is not None]
        if not self._in_groups:  # a shared archive (or Redis): the archive actor's states now
            return members, cast(list[LocalArchiveState], ray.get(self.archive_actor.state_dicts.remote()))
        return members, list(self.recovery.archives)

    def _merge_parts(self, parts: Iterable[Mapping[str, Mapping[int, Any]]], keys: Sequence[str]) -> list[list[Any]]:
        """Per-actor answers ``{key: {member id: value}}`` → for each key, the values in member order."""
        merged: dict[str, dict[int, Any]] = {key: {} for key in keys}
        for part in parts:
            for key in keys:
                merged[key].update(part[key])
        return [[merged[key].get(k) for k in range(self.n_members)] for key in keys]

    def _archive_states(self) -> list[LocalArchiveState]:
        if not self._in_groups:
            # cast: on an untyped ObjectRef, Ray's overloads of ray.get answer a list of Any.
            return cast(list[LocalArchiveState], ray.get(self.archive_actor.state_dicts.remote()))
        states: dict[int, LocalArchiveState] = {}
        for part in self._call("archive_states", lambda g: ()).values():
            states.update(unpack(part))
        return [states[k] for k in range(self.n_members)]

    def archives(self) -> list[LocalArchive]:
        archives: list[LocalArchive] = []
        for state in self._archive_states():
            local = LocalArchive()
            local.load_state_dict(state)
            archives.append(local)
        return archives

    def member_states(self) -> list[dict]:
        states: dict[int, dict] = {}
        for part in self._call("states", lambda g: ()).values():
            states.update(unpack(part))
        return [states[k] for k in range(self.n_members)]

    def snapshot(self) -> tuple[list[dict], list[LocalArchiveState]]:
        """Member and archive states for the round checkpoint; also the restart point of lost actors.

        One call per actor returns both where the archives live in the member actors; right
        after :meth:`adopt`, none: its answer carried the states.
        """
        fresh, self._adopted = self._adopted, None  # states sent back by adopt, if it was the last call
        if fresh is not None:
            members, archives = fresh
        else:
            members, archives = self._merge_parts(
                map(unpack, self._call("snapshot", lambda g: ()).values()), ("members", "archives")
            )
        if not self._in_groups:
            archives = cast(
                list[LocalArchiveState], ray.get(self.archive_actor.state_dicts.remote())
            )  # see _archive_states
            self._note_archive_restart()
        self.recovery.set_restore_point(members, archives)
        return members, self.recovery.archives

    def _note_archive_restart(self) -> None:
        """Report a restart of the archive actor that Ray performed during the round."""
        pid = cast(int, ray.get(self.archive_actor.pid.remote()))  # see _archive_states
        if pid != self._archive_pid:
            self._archive_pid = pid
            self.metrics.record_restart()
            info = cast(RestoreInfo, ray.get(self.archive_actor.restore_info.remote()))
            self.events.append(
                {
                    "event": "archive_actor_restarted",
                    "reason": f"restored from round {info['snapshot_round']} snapshot and {info['redis_elites']} Redis elites",
                }
            )

    def load_member_states(self, states: Sequence[dict]) -> None:
        self._adopted = None
        self.recovery.set_restore_point(members=states)
        self._call("load_states", lambda g: (pack({k: states[k] for k in self._groups[g]}),))

    def load_archive_states(self, states: Sequence[LocalArchiveState]) -> None:
        self._adopted = None
        self.recovery.set_restore_point(archives=states)
        if self._in_groups:
            self._call("load_archive_states", lambda g: (pack({k: states[k] for k in self._groups[g]}),))
        else:
            ray.get(self.archive_actor.load_state_dicts.remote(list(states)))

    def close(self) -> None:
        self.metrics.close()  # a finished run's gauges may expire now
        for actor in [*self._actors, self.archive_actor, self.rollout_worker]:
            if actor is not None:
                ray.kill(actor)
        if self._started_ray:
            ray.shutdown()
