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
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import ray
import torch
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError
from ray.util.scheduling_strategies import (
    LabelMatchExpressionsT,
    NodeAffinitySchedulingStrategy,
    NodeLabelSchedulingStrategy,
    NotIn,
)

from popgrpo.algorithms.archive_service import LocalArchive, LocalArchiveState
from popgrpo.algorithms.policy_kinds import policy_kind
from popgrpo.algorithms.population import Adoption
from popgrpo.config import Config
from popgrpo.runtime.actors import ArchiveActor, EvaluatorActor, MemberGroup, RestoreInfo, archives_in_groups
from popgrpo.runtime.archive_store import resolve_redis_password
from popgrpo.runtime.cluster import SetupError, check_fits, connect, embedded_cpus
from popgrpo.runtime.deadlines import (
    ARCHIVE_CONSTRUCTION,
    EVALUATOR_BUILD,
    EVALUATOR_CONSTRUCTION,
    CallDeadlines,
    CallTimeout,
)
from popgrpo.runtime.executor import make_archives
from popgrpo.runtime.naming import (
    archive_actor_name,
    epoch_counter_name,
    evaluator_actor_name,
    member_actor_name,
    rollout_worker_name,
    run_namespace,
    wait_until_free,
)
from popgrpo.runtime.progress import EpochCounter, read_counter
from popgrpo.runtime.reaper import Ending, end_actor, end_actors, is_stopped, process_state
from popgrpo.runtime.recovery import RecoveryLog
from popgrpo.runtime.rollout_worker import RolloutWorker
from popgrpo.runtime.transport import pack, unpack
from popgrpo.telemetry.live import LiveMetrics

log = logging.getLogger(__name__)

__all__ = ["RayExecutor", "RebuildFailed", "first_answered"]


# Seconds between looks at whether an actor that is past population.hang_deadline_min_s without
# answering has a stopped process (reaper.is_stopped): such an actor is hung whatever its deadline.
STOPPED_POLL_S = 2.0
# How long worker_pids and epoch_cpu_seconds wait for every actor's answer (they answer from
# memory between calls; a timer that asks during a hang gets a GetTimeoutError, not a hang).
ACCOUNTING_TIMEOUT_S = 60.0

# What a lost member actor's answer raises: the actor died or its node is gone (RayActorError),
# or the node went after the actor answered but before the driver fetched an answer too large
# to travel inline (ObjectLostError: a member call's result is never reconstructed, since a
# state-changing actor call must not run twice on its own).
LOST_ANSWER = (RayActorError, ObjectLostError)


class RebuildFailed(RuntimeError):
    """A lost or hung actor could not be replaced: one line saying which, how often it was tried and why not."""


def _loss_reason(exc: BaseException) -> str:
    """The first line of what a lost actor's answer raised. An actor whose ``__init__`` raised
    is a bug or bad input, not a lost process: that is raised again."""
    if isinstance(exc, RayActorError) and exc.actor_init_failed:
        raise exc
    if isinstance(exc, ObjectLostError):
        return f"its answer was lost with the node that held it ({type(exc).__name__})"
    if isinstance(exc, CallTimeout):
        return f"{exc} (hung)"
    return str(exc).splitlines()[0]


def _check_sent(sent: tuple[Any, ...], n_epochs: int) -> None:
    """A train call sent behind an adopt must be the one the round loop makes next: the actor runs it
    whatever happens, so a different one would train its members twice."""
    if sent[1] != n_epochs:
        raise RuntimeError(
            f"member actor {sent[0]}: a train call of {sent[1]} epochs was sent after its adopt, "
            f"but the round loop asks for {n_epochs}"
        )


def first_answered(refs: list[Any], timeout: float) -> list[Any]:
    """The first of the calls behind ``refs`` that its actor has finished (a list of at most one
    ref), waiting up to ``timeout`` seconds; empty when none has.

    A call is answered once its actor has finished it, wherever its answer lies: pulling a large
    answer to this node is the fetch's, within a deadline of its own (:meth:`RayExecutor._fetch`).
    A wait that also pulled (Ray's default, ``fetch_local=True``) would report an answer not yet
    on this node as not ready whenever it is asked with no time left, as it is when the driver
    comes back from rebuilding another actor past this call's deadline, and a healthy actor
    that had answered would be taken as hung.
    """
    ready, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
    return ready


class _PutOnce:
    """Each base ``ray.put`` once, and put anew once an actor has been rebuilt since.

    A member that fetched a base holds a copy on its node, and Ray lists that node among the
    object's locations. When that node freezes, a fetch elsewhere may pick the frozen copy and
    wait out Ray's pull timeout (``object_manager_pull_timeout_ms``, 10 s) before it tries
    another: longer than a short call's deadline, so the retried call would be taken as hung
    again and again. A base put after the rebuild has one location, the driver's node.
    """

    def __init__(self, bases: Mapping[str, Mapping[str, torch.Tensor]], generation: Callable[[], int]) -> None:
        self.bases, self.generation = bases, generation
        self._refs: dict[str, Any] = {}
        self._put_at = -1

    def refs(self, keys: Iterable[str]) -> dict[str, Any]:
        if self._put_at != self.generation():
            self._refs = {key: ray.put(pack(dict(base))) for key, base in self.bases.items()}
            self._put_at = self.generation()
        return {key: self._refs[key] for key in keys}


class RayExecutor:
    """Members on Ray actors; the same interface as :class:`LocalExecutor`."""

    def __init__(
        self,
        config: Config,
        run_dir: str | Path | None = None,
        address: str | None = None,
        say: Callable[[str], None] | None = None,
        count_epochs: bool = False,
    ) -> None:
        """``say``: told when Ray is up and the member actors are being placed (a start-up line).
        ``count_epochs``: the member actors count their epochs as they end, for a progress bar
        (:meth:`member_epochs`; one more small actor, ``<run>/epoch-counter``)."""
        self.config = config
        self.n_members = config.population.size
        per_actor = config.population.members_per_actor
        res = config.population.resources
        ids = list(range(self.n_members))
        self._groups = [ids[i : i + per_actor] for i in range(0, len(ids), per_actor)]
        self._started_ray = connect(address, num_cpus=embedded_cpus(len(self._groups), res.num_cpus))
        config_json = config.model_dump_json()
        self.run_id = uuid.uuid4().hex[:8]
        self.run_tag = Path(run_dir).name if run_dir else f"{config.run.name}-{self.run_id}"  # metrics tag
        self.metrics = LiveMetrics(self.run_tag)
        # What close() ends, set before anything starts: a start that fails part-way (a cluster
        # too small, Redis out of reach, a member actor that cannot be placed) ends what it
        # started, and the Ray it started, before the error goes on.
        # Actor handles are Any here: Ray types an actor method's .remote as the method itself.
        self._actors: list[Any] = []
        self.archive_actor: Any = None
        self.rollout_worker: Any = None
        self.epoch_counter: Any = None
        # The evaluator actor: held-out evaluation and θ_0 at a round's end (_ready_evaluator).
        self.evaluator_actor: Any = None
        try:
            check_fits(len(self._groups), res.num_cpus, res.num_gpus, wait_s=res.wait_for_cluster_s)
            if say is not None:
                each = f", {per_actor} members each" if per_actor > 1 else ""
                say(f"Ray is up; placing {len(self._groups)} member actor(s){each}")
            # Every actor is named after the run and what it holds, in this run's own namespace.
            self.namespace = run_namespace(self.run_tag, self.run_id)
            redis_password = None
            if config.archive.redis_url:
                redis_password = resolve_redis_password(config.archive.redis_url)
                self._check_redis(config.archive.redis_url, redis_password)
            run_key = f"{config.run.name}-{self.run_id}"  # keys the run's entries in Redis
            # Private archives without Redis live in the member actors: no archive actor at all.
            self._in_groups = archives_in_groups(config)
            self._archive_pid: int | None = None
            pop = config.population
            self._deadlines = CallDeadlines(
                pop.hang_deadline_factor,
                pop.hang_deadline_min_s,
                pop.first_call_deadline_s,
                config.scheduler.interval_epochs,
                pop.construction_deadline_factor,
            )
            self._lost_nodes: set[str] = set()  # nodes that did not answer: no actor is placed there again
            # When a hung archive actor (or rollout worker) was last replaced (time.monotonic): the
            # calls that were waiting for it count their deadlines from then.
            self._archive_back_at = 0.0
            self.restarts = 0
            self.events: list[dict] = []
            self.metrics_restarts: dict[str, int] = {}  # restarts by cause, as popgrpo_restarts_total counts them
            if not self._in_groups:
                self.archive_actor = ArchiveActor.options(
                    name=archive_actor_name(self.run_tag),
                    namespace=self.namespace,
                    # On the driver's node: a restarted archive actor reads the run directory's snapshot.
                    scheduling_strategy=NodeAffinitySchedulingStrategy(
                        ray.get_runtime_context().get_node_id(), soft=False
                    ),
                ).remote(config_json, str(run_dir) if run_dir else None, run_key, redis_password)
                self._archive_pid = self._archive_get("pid", kind=ARCHIVE_CONSTRUCTION)
            self._config_json = config_json
            self.recovery = RecoveryLog([a.state_dict() for a in make_archives(config)])
            self._adopted: list[list[Any]] | None = None  # [members, archives] sent back by the last adopt
            # Asynchronous rounds: per actor, the calls made since its members last adopted a merge.
            self._since_adopt: dict[int, list[tuple[str, tuple[Any, ...]]]] = {}
            # train_after_adopt: actor → epochs of the train call to send right after its adopt call,
            # then the handle of that call (as submit_train makes it), until the round loop asks for it.
            self._train_plan: dict[int, int] = {}
            self._sent_train: dict[int, tuple[Any, ...]] = {}
            self._group_of = {k: g for g, group in enumerate(self._groups) for k in group}
            # its first call, and when it was created (time.monotonic(), time.time())
            self._evaluator_starting: tuple[Any, float, float] | None = None
            self._evaluator_prepared = False  # whether it has built its scratch policy
            self.rollout_worker = self._start_rollout_worker(config)
            # Counts member epochs as they end, for the progress bar (popgrpo.runtime.progress).
            if count_epochs:
                name = epoch_counter_name(self.run_tag)
                self.epoch_counter = EpochCounter.options(name=name, namespace=self.namespace).remote()
            for group in self._groups:  # one by one: a failure part-way ends those already started
                self._actors.append(self._new_group(group))
            # The first call of each actor goes through _call like every later one: an actor lost
            # while it was being built (its node gone, an OOM while loading a model) answers it with
            # an actor error and is rebuilt, from its own initial state, like one lost mid-round.
            placements = self._call("placement", lambda g: ())
            if config.scheduler.enabled:
                # Started once the members are placed, so that its start (torch and the policy's
                # imports) does not take CPU from theirs, and before the first round, so that the
                # round's end does not wait for it; it builds its scratch policy at its first evaluation.
                self._start_evaluator()
            # A member without the GPU it reserved is reported, not silently slower.
            for g, group in enumerate(self._groups):
                if placements[g]["warning"]:
                    self.events.append(
                        {"event": "device_fallback", "members": group, "reason": placements[g]["warning"]}
                    )
        except BaseException:
            self.close()
            raise

    def _start_rollout_worker(self, config: Config) -> Any:
        """The run's :class:`RolloutWorker` when ``policy.causal_lm.rollout`` runs on one; None otherwise.

        An engine that cannot run there (vLLM not installed) is a :class:`SetupError` naming why.
        """
        rollout = config.policy.causal_lm.rollout
        if not policy_kind(config.policy.kind).uses_rollout_worker(config):
            return None
        worker: Any = RolloutWorker.options(
            name=rollout_worker_name(self.run_tag), namespace=self.namespace, num_cpus=0, num_gpus=rollout.worker_gpus()
        ).remote(self._config_json)
        try:
            problem = self._wait_for(worker.ready.remote(), "rollout_worker.placement")
        except (CallTimeout, RayActorError) as exc:
            problem = f"the rollout worker did not start: {_loss_reason(exc)}"
        if problem is not None:
            end_actor(worker, "RolloutWorker")
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
            raise SetupError(f"archive.redis_url: cannot use Redis at {where}: {type(exc).__name__}: {exc}") from None

    def _new_group(self, group: Sequence[int], build: int = 0) -> Any:
        """A member actor for ``group``, named ``<run>/members-…`` (:mod:`popgrpo.runtime.naming`);
        ``build``: the run's restart count when it replaces a lost one. It takes its name once
        the actor it replaces has let go of it."""
        res = self.config.population.resources
        name = member_actor_name(self.run_tag, group)
        wait_until_free(name, self.namespace)
        # Never on a node that did not answer (a frozen node Ray has not yet found dead).
        strategy = None
        if self._lost_nodes:
            avoid: LabelMatchExpressionsT = {"ray.io/node-id": NotIn(*sorted(self._lost_nodes))}
            strategy = NodeLabelSchedulingStrategy(hard=avoid)
        return MemberGroup.options(
            name=name,
            namespace=self.namespace,
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus,
            scheduling_strategy=strategy,
        ).remote(
            self._config_json, group, self.archive_actor, self.run_tag, build, self.rollout_worker, self.epoch_counter
        )

    # ---- calls that survive lost and hung actors ------------------------------------------
    def _call(
        self,
        method: str,
        args_for: Callable[[int], tuple[Any, ...]],
        groups: Sequence[int] | None = None,
        replayable: bool = False,
        after_sent: Callable[[], None] | None = None,
    ) -> dict[int, Any]:
        """Call ``method`` on the given groups' actors; rebuild and retry any that are lost or hung.

        Every call the driver makes on a member actor goes through here, from the first
        (``placement``, right after construction) to the last of a round (``train``,
        ``get_weights``, ``adopt``, ``snapshot``), so an actor lost at any point of its life —
        while being constructed, mid-call or idle between calls — is rebuilt from the restore
        point (the last :meth:`snapshot`, or its own initial state before the first) with the
        calls made since replayed (:class:`RecoveryLog`), and the call is retried. An actor
        that does not answer within the call's deadline (:class:`CallDeadlines`) is taken as
        hung and replaced the same way, its process ended for real (:func:`end_actor`).
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
            ready = first_answered(list(refs.values()), self._wait_s(method, waiting, epochs))
            if not ready:  # some call may be past its deadline, or its process stopped: that actor is hung
                hung = self._hung(method, waiting, epochs)
                if hung and (self._archive_stalled() or self._rollout_stalled()):  # they were waiting for it
                    continue
                for g, reason in hung.items():
                    del refs[g]
                    self._lost(g, attempts, reason)
                    refs[g] = getattr(self._actors[g], method).remote(*args_for(g))
                    started[g] = time.monotonic()
                continue
            g = next(g for g, ref in refs.items() if ref == ready[0])
            del refs[g]
            try:
                results[g] = self._fetch(ready[0], method, started[g], epochs(g))
            except (*LOST_ANSWER, CallTimeout) as exc:
                self._lost(g, attempts, _loss_reason(exc), exc)
                refs[g] = getattr(self._actors[g], method).remote(*args_for(g))
                started[g] = time.monotonic()
        if replayable:
            self.recovery.record(method, args_for)
        return results

    def _wait_s(self, method: str, started: Mapping[int, float], epochs: Callable[[int], int]) -> float:
        """Seconds until the first of the calls started at ``started`` is past its deadline, or
        until the next look at whether an actor that is past the floor is stopped (:meth:`_hung`)."""
        now = time.monotonic()
        started = {g: max(start, self._archive_back_at) for g, start in started.items()}
        deadline = min(started[g] + self._deadlines.limit(method, epochs(g)) for g in started) - now
        floor = min(started.values()) + self._deadlines.min_s - now
        return max(0.0, min(deadline, floor if floor > 0 else STOPPED_POLL_S))

    def _hung(self, method: str, started: Mapping[int, float], epochs: Callable[[int], int]) -> dict[int, str]:
        """The actors taken as hung, with why: a call past its deadline, or, sooner, one past the
        floor (``population.hang_deadline_min_s``) whose process is found stopped (on the driver's
        node: :func:`is_stopped`). A call that was waiting when the archive actor was restarted
        counts from the restart: it was waiting for the archive."""
        now = time.monotonic()
        hung: dict[int, str] = {}
        for g, start in started.items():
            waited = now - max(start, self._archive_back_at)
            if waited >= self._deadlines.limit(method, epochs(g)):
                hung[g] = f"no answer to {method} within {waited:.0f} s (hung)"
            elif waited >= self._deadlines.min_s and is_stopped(self._actors[g]):
                hung[g] = f"no answer to {method} within {waited:.0f} s, its process stopped (hung)"
        return hung

    def _fetch(self, ref: Any, method: str, start: float, n_epochs: int) -> Any:
        """The answer of a call started at ``start`` that ``ray.wait`` found ready.

        Fetching it may still wait (a large answer on a node that froze since): within the
        call's deadline, else :class:`CallTimeout`. Its time is measured for the deadlines.
        """
        limit = self._deadlines.limit(method, n_epochs)
        try:
            answer = ray.get(ref, timeout=limit)
        except GetTimeoutError:
            raise CallTimeout(f"its answer to {method} could not be fetched within {limit:.0f} s") from None
        self._deadlines.answered(method, time.monotonic() - start, n_epochs)
        return answer

    def _wait_for(
        self,
        ref: Any,
        kind: str,
        n_epochs: int = 1,
        actor: Any = None,
        sent: float | None = None,
        record: bool = True,
    ) -> Any:
        """The answer of the call behind ``ref`` (a call of ``kind`` on ``actor``, sent at ``sent``,
        ``time.monotonic()``; default now), within its deadline counted from then, else
        :class:`CallTimeout`; sooner when ``actor``'s process is found stopped past the floor (as
        in :meth:`_hung`). Ray's actor errors pass through. With ``record``, the time it took
        counts towards ``kind``'s deadline; without, the caller measures it."""
        limit = self._deadlines.limit(kind, n_epochs)
        start = time.monotonic() if sent is None else sent
        while True:
            waited = time.monotonic() - start
            step = limit - waited
            if actor is not None:
                step = min(step, max(self._deadlines.min_s - waited, STOPPED_POLL_S))
            ready = first_answered([ref], max(0.0, step))
            if ready:
                break
            waited = time.monotonic() - start
            if waited >= limit:
                raise CallTimeout(f"no answer to {kind} within {limit:.0f} s")
            if actor is not None and waited >= self._deadlines.min_s and is_stopped(actor):
                raise CallTimeout(f"no answer to {kind} within {waited:.0f} s, its process stopped")
        try:
            answer = ray.get(ref, timeout=limit)
        except GetTimeoutError:
            raise CallTimeout(f"its answer to {kind} could not be fetched within {limit:.0f} s") from None
        if record:
            self._deadlines.answered(kind, time.monotonic() - start, n_epochs)
        return answer

    def _lost(self, g: int, attempts: dict[int, int], reason: str, cause: BaseException | None = None) -> None:
        """Actor ``g`` died or hung during a call: rebuild it, unless it has been lost too often."""
        attempts[g] = attempts.get(g, 0) + 1
        limit = self.config.population.max_restarts
        if attempts[g] > limit:
            raise RebuildFailed(
                f"member actor {g} (members {self._groups[g]}) was lost {attempts[g]} times in one call "
                f"(population.max_restarts={limit}; last: {reason}); giving up"
            ) from cause
        self._rebuild_group(g, reason=reason)

    def _end(self, actor: Any, class_name: str, restart: bool = False) -> Ending:
        """End ``actor``'s process for real (:func:`end_actor`); remember a node that did not answer."""
        ending = end_actor(actor, class_name, restart=restart, lost_nodes=self._lost_nodes)
        if ending.node_lost and ending.node_id is not None:
            self._lost_nodes.add(ending.node_id)
        return ending

    def _rebuild_group(self, g: int, reason: str) -> None:
        """Replace actor ``g``: end its process for real, then build a new actor and bring it to
        where the lost one was, every call within its deadline. A try that fails (the new actor
        lost or hung too, or placed on a node Ray has not yet found dead) is ended and retried
        with backoff, ``population.max_restarts`` times; then :class:`RebuildFailed`."""
        group = self._groups[g]
        start = time.monotonic()
        ended = self._end(self._actors[g], "MemberGroup")
        self._sent_train.pop(g, None)  # sent to the lost actor: the round loop's call goes to the new one
        self.restarts += 1
        log.warning(
            "member actor %d (members %s) lost: %s; its process: %s; rebuilding it from its restore point",
            g,
            group,
            reason,
            ended.describe(),
        )
        tries = self.config.population.max_restarts + 1
        delay, last = 0.5, ""
        for attempt in range(1, tries + 1):
            actor = None
            try:
                actor = self._new_group(group, build=self.restarts)
                self.recovery.replay_into(actor, g, group, self._archive_home(), partial(self._wait_for, actor=actor))
                self._redo_since_adopt(actor, g)
            except (*LOST_ANSWER, TimeoutError) as exc:  # TimeoutError: CallTimeout, or the name still held
                last = str(exc) if type(exc) is TimeoutError else _loss_reason(exc)
                if actor is not None:
                    self._end(actor, "MemberGroup")
                if isinstance(exc, CallTimeout):
                    self._archive_stalled()  # a replay into a private archive on the archive actor
                log.warning("member actor %d: rebuild try %d of %d failed: %s", g, attempt, tries, last)
                if attempt < tries:
                    time.sleep(delay)
                    delay *= 2
                continue
            self._actors[g] = actor
            seconds = time.monotonic() - start
            line = f"{reason}; replaced in {seconds:.1f} s ({attempt} {'try' if attempt == 1 else 'tries'}); old process: {ended.describe()}"
            self._restarted("member_actor_restarted", reason, line, seconds, actor=g, members=group, tries=attempt)
            log.warning("member actor %d (members %s) replaced: %s", g, group, line)
            return
        raise RebuildFailed(
            f"member actor {g} (members {group}) could not be rebuilt in {tries} tries "
            f"(population.max_restarts={tries - 1}) after it was lost ({reason}); last try: {last}"
        )

    def _restarted(self, event: str, reason: str, line: str, seconds: float | None, **fields: Any) -> None:
        """Count and report one replaced actor (a member actor, the archive actor, the rollout
        worker, the evaluator actor): ``event`` with ``fields``, its ``line``, its cause (``hung``
        when ``reason`` ends with "(hung)", else ``lost``) and the ``seconds`` it took, where the
        driver saw them (not for a restart Ray made on its own)."""
        cause = "hung" if reason.endswith("(hung)") else "lost"
        self.metrics.record_restart(cause)
        self.metrics_restarts[cause] = self.metrics_restarts.get(cause, 0) + 1
        timing = {} if seconds is None else {"seconds": round(seconds, 3)}
        self.events.append({"event": event, **fields, "reason": line, "cause": cause, **timing})

    def _redo_since_adopt(self, actor: Any, g: int) -> None:
        """Asynchronous rounds: replay into a rebuilt actor the calls its members made since they
        last adopted (their restore point): the rounds they reported but have not yet merged."""
        for method, args in self._since_adopt.get(g, []):
            n_epochs = int(args[0]) if method == "train" else 1
            self._wait_for(getattr(actor, method).remote(*args), method, n_epochs, actor=actor)

    # ---- the archive actor: every call within a deadline; a stopped one is restarted -------
    def _archive_get(self, method: str, *args: Any, kind: str | None = None) -> Any:
        """The archive actor's answer to ``method(*args)``, within the deadline of ``kind``
        (default ``archive.<method>``). An archive actor that does not answer is ended for real
        and restarted by Ray (:meth:`_restart_archive`), and the call made again
        (:meth:`_answer_or_replace`)."""
        kind = kind or f"archive.{method}"

        def call() -> Any:
            return self._wait_for(getattr(self.archive_actor, method).remote(*args), kind, actor=self.archive_actor)

        return self._answer_or_replace("archive actor", method, call, (CallTimeout,), self._restart_archive)

    def _answer_or_replace(
        self,
        who: str,
        method: str,
        call: Callable[[], Any],
        catch: tuple[type[BaseException], ...],
        replace: Callable[[str], None],
    ) -> Any:
        """``call()``'s answer, in ``population.max_restarts + 1`` tries: after a try that raises
        one of ``catch``, ``replace(reason)`` ends the actor and brings up another before the next
        try; after the last, :class:`RebuildFailed`."""
        tries = self.config.population.max_restarts + 1
        last = ""
        for attempt in range(tries):
            try:
                return call()
            except catch as exc:
                last = _loss_reason(exc)
                if attempt + 1 < tries:
                    replace(last)
        raise RebuildFailed(f"the {who} did not answer {method} in {tries} tries ({last}); giving up")

    def _archive_stalled(self) -> bool:
        """Whether the archive actor is what the members wait for: with one (shared archive or
        Redis), members call it at every step, so a stopped archive actor stalls every member.
        One whose process is stopped, or that does not answer a probe (``pid``) within
        ``population.hang_deadline_min_s``, is restarted (:meth:`_restart_archive`): True."""
        if self.archive_actor is None:
            return False
        if is_stopped(self.archive_actor):
            self._restart_archive("its process stopped (hung)")
            return True
        seconds = self._deadlines.min_s
        ready, _ = ray.wait([self.archive_actor.pid.remote()], timeout=seconds)
        if ready:
            return False
        self._restart_archive(f"no answer to a probe within {seconds:.0f} s (hung)")
        return True

    def _rollout_stalled(self) -> bool:
        """Whether the rollout worker is what the members wait for (every language-model member
        generates there): its process is stopped, or its node does not answer (read on the node,
        not through the worker's queue of generations, :func:`process_state`). If so it is
        replaced (:meth:`_replace_rollout_worker`): True."""
        if self.rollout_worker is None:
            return False
        state = process_state(self.rollout_worker)
        if state not in ("T", "t", "unreachable"):
            return False
        why = "its process stopped" if state != "unreachable" else "its node did not answer"
        self._replace_rollout_worker(f"{why} while members waited for it (hung)")
        return True

    def _replace_rollout_worker(self, reason: str) -> None:
        """End the rollout worker's process for real, start a new one (under the same name), and
        end every member actor: they hold the old worker's handle, so each is rebuilt as lost
        (from its restore point, pushing its adapter to the new worker as a first push)."""
        start = time.monotonic()
        ended = self._end(self.rollout_worker, "RolloutWorker")
        log.warning("rollout worker lost: %s; its process: %s; starting a new one", reason, ended.describe())
        wait_until_free(rollout_worker_name(self.run_tag), self.namespace)
        self.rollout_worker = self._start_rollout_worker(self.config)
        for actor in self._actors:
            self._end(actor, "MemberGroup")
        seconds = time.monotonic() - start
        self._archive_back_at = time.monotonic()
        line = f"{reason}; replaced in {seconds:.1f} s, every member actor rebuilt; old process: {ended.describe()}"
        self._restarted("rollout_worker_restarted", reason, line, seconds)
        log.warning("rollout worker replaced: %s", line)

    def _restart_archive(self, reason: str) -> None:
        """End the archive actor's process for real and wait until Ray has restarted it (it
        restores the last snapshot, and Redis's elites); :class:`RebuildFailed` when it does
        not come back in ``population.max_restarts + 1`` tries."""
        start = time.monotonic()
        tries = self.config.population.max_restarts + 1
        last = ""
        for attempt in range(1, tries + 1):
            ended = self._end(self.archive_actor, "ArchiveActor", restart=True)
            log.warning("archive actor lost: %s; its process: %s; Ray restarts it", reason, ended.describe())
            try:
                self._archive_pid = self._wait_for(
                    self.archive_actor.pid.remote(), ARCHIVE_CONSTRUCTION, actor=self.archive_actor
                )
                info = cast(
                    RestoreInfo, self._wait_for(self.archive_actor.restore_info.remote(), "archive.restore_info")
                )
            except CallTimeout as exc:
                last = str(exc)
                continue
            seconds = time.monotonic() - start
            self._archive_back_at = time.monotonic()
            line = (
                f"{reason}; restarted in {seconds:.1f} s ({attempt} {'try' if attempt == 1 else 'tries'}), "
                f"restored from round {info['snapshot_round']} snapshot and {info['redis_elites']} Redis elites; "
                f"old process: {ended.describe()}"
            )
            self._restarted("archive_actor_restarted", reason, line, seconds)
            log.warning("archive actor replaced: %s", line)
            return
        raise RebuildFailed(f"the archive actor did not come back in {tries} tries after {reason}; last: {last}")

    # ---- the evaluator actor: held-out evaluation and θ_0, off the driver -------------------
    def _evaluator_get(self, method: str, *args: Any, sent: tuple[Any, Any, float] | None = None) -> Any:
        """The evaluator actor's answer to ``method(*args)``, within the deadline of
        ``evaluator.<method>``. The actor is started on the driver's node when there is none
        and prepared for the call (:meth:`_ready_evaluator`). ``sent``: the same call already
        made, ``(actor, reference, time.monotonic() when sent)``, whose answer the first try
        waits for.

        One that dies, or does not answer in time (hung, or stopped), is ended for real and
        replaced (:meth:`_replace_evaluator`), and the call made again
        (:meth:`_answer_or_replace`).
        """
        kind = f"evaluator.{method}"
        pending = [sent] if sent is not None else []

        def call() -> Any:
            if pending:
                actor, ref, at = pending.pop()
                return self._wait_for(ref, kind, actor=actor, sent=at)
            actor = self._ready_evaluator(evaluate=method == "evaluate")
            return self._wait_for(getattr(actor, method).remote(*args), kind, actor=actor)

        return self._answer_or_replace(
            "evaluator actor", method, call, (CallTimeout, RayActorError), self._replace_evaluator
        )

    def _start_evaluator(self) -> Any:
        """Start the evaluator actor on the driver's node (where the pre-run checks found the
        model) and have it import what it needs, without waiting for it."""
        name = evaluator_actor_name(self.run_tag)
        wait_until_free(name, self.namespace)
        actor: Any = EvaluatorActor.options(
            name=name,
            namespace=self.namespace,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        ).remote(self._config_json, os.getpriority(os.PRIO_PROCESS, 0))
        self.evaluator_actor = actor
        self._evaluator_starting = (actor.prepare.remote(False), time.monotonic(), time.time())
        self._evaluator_prepared = False
        return actor

    def _ready_evaluator(self, evaluate: bool) -> Any:
        """The evaluator actor, started if there is none, once it has started; before its first
        evaluation it builds its scratch policy and environment. Both wait under a construction
        deadline of their own (``population.first_call_deadline_s`` until one is measured), the
        start's counted from when the actor was created. The start's duration is the actor's
        own: from its creation to when its first call returned on the driver's node (same
        clock), however much later the driver first needs it."""
        actor = self._start_evaluator() if self.evaluator_actor is None else self.evaluator_actor
        if self._evaluator_starting is not None:
            (starting, sent, created), self._evaluator_starting = self._evaluator_starting, None
            ready_at = self._wait_for(starting, EVALUATOR_CONSTRUCTION, actor=actor, sent=sent, record=False)
            self._deadlines.answered(EVALUATOR_CONSTRUCTION, max(0.0, ready_at - created))
        if evaluate and not self._evaluator_prepared:
            self._wait_for(actor.prepare.remote(True), EVALUATOR_BUILD, actor=actor)
            self._evaluator_prepared = True
        return actor

    def _replace_evaluator(self, reason: str) -> None:
        """End the evaluator actor's process for good; the next call starts a new one."""
        start = time.monotonic()
        ended = self._end(self.evaluator_actor, "EvaluatorActor")
        self.evaluator_actor = None
        line = f"{reason}; its process: {ended.describe()}; a new one is started"
        self._restarted("evaluator_actor_restarted", reason, line, time.monotonic() - start)
        log.warning("evaluator actor lost: %s", line)

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
        out = [results[k] for k in range(self.n_members)]
        self.metrics.record_rows((row for rows in out for row in rows), self.n_members)  # population gauges
        return out

    def evaluate(self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int) -> dict[str, float]:
        """On the run's :class:`EvaluatorActor` (the driver builds no policy)."""
        return self.submit_evaluate(weights, round_index, purpose)()

    def submit_evaluate(
        self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int
    ) -> Callable[[], dict[str, float]]:
        """Sent now to the run's :class:`EvaluatorActor` when it is up and has built its scratch
        policy; otherwise the returned call starts or prepares it first (:meth:`_evaluator_get`).
        The call waits for the answer, with the deadline counted from the sending."""
        args = (pack(dict(weights)), round_index, purpose)
        actor, sent = self.evaluator_actor, None
        if actor is not None and self._evaluator_starting is None and self._evaluator_prepared:
            sent = (actor, actor.evaluate.remote(*args), time.monotonic())
        return lambda: dict(self._evaluator_get("evaluate", *args, sent=sent))

    def round0_weights(self, member_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """Built on the run's :class:`EvaluatorActor` (the driver builds no policy)."""
        return unpack(self._evaluator_get("round0", list(member_ids)))

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
        another call. Each distinct base is ``ray.put`` once (anew after a rebuild:
        :class:`_PutOnce`); an actor gets the references of the bases its members need and
        fetches each once."""
        put = _PutOnce(bases, lambda: self.restarts)
        mine = {g: {k: adoptions[k] for k in group if k in adoptions} for g, group in enumerate(self._groups)}
        needed = {g: {a.base for a in part.values() if a.base in bases} for g, part in mine.items()}
        args = lambda g: (put.refs(sorted(needed[g])), mine[g], round_index)  # noqa: E731
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

    @property
    def n_actors(self) -> int:
        """Member actors, one per group."""
        return len(self._groups)

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
            ready = first_answered(list(by_ref), self._wait_s("train", started, epochs.__getitem__))
            if not ready:  # some actor is past its deadline: hung
                hung = self._hung("train", started, epochs.__getitem__)
                if hung and (self._archive_stalled() or self._rollout_stalled()):  # they were waiting for it
                    continue
                for g, reason in hung.items():
                    i = next(i for i, h in enumerate(handles) if h[0] == g)
                    self._lost(g, attempts, reason)
                    handles[i] = self.submit_train(g, epochs[g])
                continue
            handle = by_ref[ready[0]]
            g, n_epochs, ref, start = handle
            try:
                rows = cast(dict[int, list[dict]], self._fetch(ref, "train", start, n_epochs))  # see _archive_states
                self._since_adopt.setdefault(g, []).append(("train", (n_epochs,)))
                self.metrics.record_rows((row for part in rows.values() for row in part), self.n_members)
                return handle, rows
            except (*LOST_ANSWER, CallTimeout) as exc:
                self._lost(g, attempts, _loss_reason(exc), exc)
                handles[handles.index(handle)] = self.submit_train(g, n_epochs)

    def restore_points(self) -> tuple[list[dict], list[LocalArchiveState]]:
        """Each member's restore point and the archives' (see :class:`AsyncExecutor`)."""
        if self.recovery.members is None or any(state is None for state in self.recovery.members):
            self.recovery.set_restore_point(*self.snapshot())  # every actor is idle: their states now
        members = [state for state in self.recovery.members or [] if state is not None]
        if not self._in_groups:  # a shared archive (or Redis): the archive actor's states now
            return members, cast(list[LocalArchiveState], self._archive_get("state_dicts"))
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
            return cast(list[LocalArchiveState], self._archive_get("state_dicts"))
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
            archives = cast(list[LocalArchiveState], self._archive_get("state_dicts"))
            self._note_archive_restart()
        self.recovery.set_restore_point(members, archives)
        return members, self.recovery.archives

    def _note_archive_restart(self) -> None:
        """Report a restart of the archive actor that Ray performed during the round."""
        pid = cast(int, self._archive_get("pid"))
        if pid != self._archive_pid:
            self._archive_pid = pid
            info = cast(RestoreInfo, self._archive_get("restore_info"))
            line = f"restored from round {info['snapshot_round']} snapshot and {info['redis_elites']} Redis elites"
            self._restarted("archive_actor_restarted", "restarted by Ray", line, None)

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
            self._archive_get("load_state_dicts", list(states))

    # ---- process accounting: what the round timers of calibration and benchmarks read ----
    def worker_pids(self) -> list[int]:
        """The process id of each member actor, in group order (one round trip to every actor)."""
        refs = [actor.pid.remote() for actor in self._actors]
        return [int(pid) for pid in ray.get(refs, timeout=ACCOUNTING_TIMEOUT_S)]

    def worker_node_ids(self) -> list[str]:
        """The Ray node id of each member actor, in group order (one round trip to every actor)."""
        refs = [actor.node_id.remote() for actor in self._actors]
        return [str(node) for node in ray.get(refs, timeout=ACCOUNTING_TIMEOUT_S)]

    def epoch_cpu_seconds(self) -> list[list[float]]:
        """Per member actor, in group order: the CPU seconds its members spent training in each
        ``train`` call so far (an actor rebuilt after a loss counts from its rebuild)."""
        refs = [a.train_cpu_seconds.remote() for a in self._actors]
        return [list(per_call) for per_call in ray.get(refs, timeout=ACCOUNTING_TIMEOUT_S)]

    def member_epochs(self) -> int | None:
        """Member epochs finished so far, as the member actors reported them (None: not counted
        without ``count_epochs``, or no answer in time)."""
        return None if self.epoch_counter is None else read_counter(self.epoch_counter)

    def close(self) -> None:
        self.metrics.close()  # a finished run's gauges may expire now
        # For real: ray.kill alone leaves a stopped process (and its lease) behind.
        actors = [*((a, "MemberGroup") for a in self._actors), (self.archive_actor, "ArchiveActor")]
        others = [
            (self.rollout_worker, "RolloutWorker"),
            (self.epoch_counter, "EpochCounter"),
            (self.evaluator_actor, "EvaluatorActor"),
        ]
        end_actors([(a, name) for a, name in [*actors, *others] if a is not None])
        if self._started_ray:
            ray.shutdown()
