"""The Ray actors of a run: member groups (several members per actor), the archive actor and
the evaluator actor.

Thin by design: actors hold :class:`~popgrpo.algorithms.member.Member` and
:class:`~popgrpo.algorithms.archive_service.LocalArchive` objects and call their methods; all
math stays in ``popgrpo.core`` / ``popgrpo.algorithms``. Where the archives live is described
in :mod:`popgrpo.runtime.ray_executor`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
import psutil
import ray
import torch

import popgrpo
from popgrpo.algorithms.archive_service import ArchiveHandle, LocalArchive, LocalArchiveState, StepResult
from popgrpo.algorithms.async_rounds import straggler_delay
from popgrpo.algorithms.evaluation import WeightsEvaluator
from popgrpo.algorithms.initial_weights import round0_weights
from popgrpo.algorithms.member import Member, resolve_device
from popgrpo.algorithms.policy_kinds import group_trainer, policy_kind
from popgrpo.algorithms.population import Adoption
from popgrpo.config import Config
from popgrpo.runtime.executor import adopt_one, make_archives, new_archive
from popgrpo.runtime.naming import describe_group, member_label
from popgrpo.runtime.progress import EpochReporter
from popgrpo.runtime.rollout_worker import RemoteRolloutService
from popgrpo.runtime.transport import pack, unpack
from popgrpo.telemetry.live import LiveMetrics

__all__ = ["ArchiveActor", "EvaluatorActor", "MemberGroup", "RemoteArchive", "archives_in_groups", "take_niceness"]

log = logging.getLogger(__name__)

# How long a member waits for another actor (the archive actor's answer to a step, a base the
# driver put): a backstop, never reached in a run whose driver watches: the driver takes a call
# that stalls as hung long before (its deadlines, popgrpo.runtime.deadlines) and restarts the
# archive actor, or replaces this one. Past it the member's call fails with GetTimeoutError.
MEMBER_WAIT_S = 600.0


class RestoreInfo(TypedDict):
    """What :class:`ArchiveActor` brought back when it started: the snapshot's round (None: no
    snapshot) and the number of elites replayed from Redis."""

    snapshot_round: int | None
    redis_elites: int


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class ArchiveActor:
    """Owns the run's archive(s) and novelty memories: one shared, or one per member.

    Only with a shared archive or with ``archive.redis_url`` (see the module docstring);
    private archives without Redis live in the member actors instead.

    Ray restarts it if its process dies, and retries the calls that were in flight. A
    restarted actor rebuilds its state from the run directory's last round snapshot (it is
    pinned to the driver's node, where the run directory is) and then, with
    ``archive.redis_url``, from Redis, which holds every elite ever accepted. Without Redis,
    elites accepted since the last round's snapshot are lost; with it, nothing accepted is.
    The novelty memories always come from the snapshot.
    """

    def __init__(self, config_json: str, run_dir: str | None, run_key: str, redis_password: str | None) -> None:
        config = Config.model_validate_json(config_json)
        self.holds = "1 shared archive" if config.archive.shared else "private archives"
        self.archives = make_archives(config)
        self.store = None
        if config.archive.redis_url:
            from popgrpo.runtime.archive_store import RedisArchiveStore

            self.store = RedisArchiveStore(config.archive.redis_url, run_key, redis_password)
        # A fresh run has no snapshot yet and a Redis key of its own, so this restores
        # nothing; after Ray restarts this actor it brings back what the run had.
        self.restored: RestoreInfo = {"snapshot_round": None, "redis_elites": 0}
        self._restore(run_dir)

    def __repr__(self) -> str:
        """``archive: 1 shared archive, restored from …`` (the run is in the actor's name): read by
        Ray when the constructor returns, so also after each restart Ray performs
        (:mod:`popgrpo.runtime.naming`)."""
        info: RestoreInfo | None = getattr(self, "restored", None)  # None while the constructor runs
        if info is None:
            return f"archive: {self.holds}, starting"
        if info["snapshot_round"] is None and not info["redis_elites"]:
            return f"archive: {self.holds}, new"
        snapshot = "no snapshot" if info["snapshot_round"] is None else f"the round {info['snapshot_round']} snapshot"
        return f"archive: {self.holds}, restored from {snapshot} and {info['redis_elites']} Redis elites"

    def _restore(self, run_dir: str | None) -> None:
        from popgrpo.telemetry.checkpoint import Checkpointer

        checkpointer = Checkpointer(run_dir) if run_dir else None
        info = checkpointer.latest() if checkpointer else None
        if checkpointer is not None and info is not None:
            for archive, state in zip(self.archives, checkpointer.load_archives(info), strict=True):
                archive.load_state_dict(state)
            self.restored["snapshot_round"] = info["round"]
        if self.store is not None:
            for archive_id, archive in enumerate(self.archives):
                elites = self.store.read(archive_id)
                if len(elites["reward"]):
                    archive.grid.add(elites["behaviour"], elites["reward"], elites["idea"])
                    self.restored["redis_elites"] += len(elites["reward"])

    def restore_info(self) -> RestoreInfo:
        return RestoreInfo(**self.restored)

    def step(
        self,
        archive_id: int,
        behaviours: np.ndarray,
        rewards: np.ndarray,
        ideas: np.ndarray,
        keep: np.ndarray,
        novelty: bool,
    ) -> StepResult:
        statuses, scores = self.archives[archive_id].step(behaviours, rewards, ideas, keep, novelty)
        if self.store is not None:
            stored = statuses > 0
            if stored.any():
                archive = self.archives[archive_id].grid
                self.store.write(
                    archive_id, archive.cell_of(behaviours[stored]), rewards[stored], behaviours[stored], ideas[stored]
                )
        return statuses, scores

    def stats(self, archive_id: int) -> dict[str, float]:
        return self.archives[archive_id].stats()

    def count(self, archive_id: int, behaviours: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """:meth:`LocalArchive.count` on archive ``archive_id`` (the outcome-count bonus, pooled when shared)."""
        return self.archives[archive_id].count(behaviours, keep)

    def state_dicts(self) -> list[LocalArchiveState]:
        return [a.state_dict() for a in self.archives]

    def load_state_dicts(self, states: list[LocalArchiveState]) -> None:
        self.load_states(dict(enumerate(states)))

    def load_states(self, states: Mapping[int, LocalArchiveState]) -> None:
        """Set individual archives (a resume, or a lost member's private archive rolled back)."""
        for archive_id, state in states.items():
            self.archives[archive_id].load_state_dict(state)
            if self.store is not None:
                self.store.replace(archive_id, self.archives[archive_id].grid.elites())

    def pid(self) -> int:
        return os.getpid()


def take_niceness(target: int) -> int:
    """Run every thread of this process at niceness ``target`` when that is lower (a higher
    priority) than theirs and the OS allows it (root, ``CAP_SYS_NICE`` or ``RLIMIT_NICE``);
    otherwise leave them as they are. On Linux a niceness belongs to each thread, so each is
    set. Returns the niceness this thread runs at afterwards."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if target >= current:
        return current
    task = "/proc/self/task"
    threads = [int(t) for t in os.listdir(task)] if os.path.isdir(task) else [0]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except PermissionError:
            log.warning(
                "the evaluator actor stays at niceness %d (its driver runs at %d): this user may not raise "
                "a process's priority, so the round's end waits on a process that competes with training",
                current,
                target,
            )
            break
    return os.getpriority(os.PRIO_PROCESS, 0)


@ray.remote(num_cpus=0)
class EvaluatorActor:
    """Whatever the round's end needs a policy for, so that the driver never builds one: held-out
    evaluation of weights no member holds (:class:`~popgrpo.algorithms.evaluation.WeightsEvaluator`,
    for greedy soup and ``eval.merged``) and θ_0 (:func:`~popgrpo.algorithms.initial_weights.round0_weights`).

    The Ray executor starts it once the member actors are placed, when the scheduler is on (or at the first
    call that needs it), pinned to the driver's node (where the pre-run checks found the model),
    and replaces it when it dies or hangs (:meth:`~popgrpo.runtime.ray_executor.RayExecutor.evaluate`).
    It builds its scratch policy at its first evaluation. It reserves no CPU and holds
    nothing a new one must bring back: its scratch policy is built from the config, and every
    evaluation draws from its own ``(round, purpose)`` stream.

    The round's end waits for its answers, as it waited for the driver's own work, so it runs at
    the driver's niceness (``driver_niceness``) where the OS allows (:func:`take_niceness`), not
    at that of Ray's workers (``RAY_worker_niceness``, 15 by default), which would leave it a
    small share of the cores beside training members.
    """

    def __init__(self, config_json: str, driver_niceness: int) -> None:
        take_niceness(driver_niceness)
        self.config = Config.model_validate_json(config_json)
        torch.set_num_threads(self.config.run.torch_threads)
        self.evaluator: WeightsEvaluator | None = None

    def __repr__(self) -> str:
        return "evaluator: held-out evaluation and θ_0 at a round's end"

    def prepare(self, evaluate: bool) -> float:
        """With ``evaluate``, build the scratch policy and environment now (once), so that the
        driver waits for the build under a construction deadline; when it returned
        (``time.time()``: the driver measures the actor's start with it)."""
        if evaluate and self.evaluator is None:
            self.evaluator = WeightsEvaluator(self.config)
        return time.time()

    def evaluate(self, weights: dict[str, Any], round_index: int, purpose: int) -> dict[str, float]:
        """:meth:`RayExecutor.evaluate`; ``weights`` packed (:func:`~popgrpo.runtime.transport.pack`)."""
        self.prepare(evaluate=True)
        assert self.evaluator is not None
        return self.evaluator(unpack(weights), round_index, purpose)

    def round0(self, member_ids: list[int]) -> dict[str, Any]:
        """θ_0 of ``member_ids``, packed."""
        return pack(round0_weights(self.config, member_ids))


def archives_in_groups(config: Config) -> bool:
    """True when each member's private archive lives in its member actor (no per-step archive calls)."""
    return not config.archive.shared and not config.archive.redis_url


class RemoteArchive:
    """ArchiveService that forwards each step to the archive actor (one round trip)."""

    def __init__(self, handle: Any, archive_id: int) -> None:
        self.handle, self.archive_id = handle, archive_id  # handle: the ArchiveActor's ActorHandle

    def step(
        self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray, keep: np.ndarray, novelty: bool
    ) -> StepResult:
        return self.result(self.submit(behaviours, rewards, ideas, keep, novelty))

    def submit(
        self, behaviours: np.ndarray, rewards: np.ndarray, ideas: np.ndarray, keep: np.ndarray, novelty: bool
    ) -> ArchiveHandle:
        # One caller's calls run on the actor in submission order, so a shared archive sees
        # packed members' batches in member order.
        return self.handle.step.remote(self.archive_id, behaviours, rewards, ideas, keep, novelty)

    def result(self, handle: ArchiveHandle) -> StepResult:
        return ray.get(handle, timeout=MEMBER_WAIT_S)

    def stats(self) -> dict[str, float]:
        return ray.get(self.handle.stats.remote(self.archive_id), timeout=MEMBER_WAIT_S)

    def count(self, behaviours: np.ndarray, keep: np.ndarray) -> np.ndarray:
        # After this caller's submitted steps: one caller's calls run on the actor in order.
        return ray.get(self.handle.count.remote(self.archive_id, behaviours, keep), timeout=MEMBER_WAIT_S)


class StartTimes(TypedDict):
    """:meth:`MemberGroup.start_times`: when each phase of a member actor's start ended, as
    ``time.time()`` on its node. ``process``: its worker process started (earlier than the
    actor's creation when Ray had started the worker beforehand); ``import_started``: it began
    importing popgrpo (what the actor class needs, torch with it, is imported before the
    constructor runs); ``init_started`` / ``init_ended``: its constructor ran;
    ``first_train_s``: the seconds of its first ``train`` call (None before one)."""

    process: float
    import_started: float
    init_started: float
    init_ended: float
    first_train_s: float | None


class GroupSnapshot(TypedDict):
    """:meth:`MemberGroup.snapshot`: member states and the archives held in the group, by member id."""

    members: dict[int, dict[str, Any]]
    archives: dict[int, LocalArchiveState]


@ray.remote
class MemberGroup:
    """Several members packed into one actor (``population.members_per_actor``).

    With ``archive_handle`` None each member's private archive lives here and is called
    in-process (:func:`archives_in_groups`); otherwise members call the archive actor. With a
    ``rollout_worker`` (:class:`~popgrpo.runtime.rollout_worker.RolloutWorker`) the members
    generate there.
    """

    def __init__(
        self,
        config_json: str,
        member_ids: Sequence[int],
        archive_handle: Any,
        run_tag: str,
        build: int = 0,
        rollout_worker: Any = None,
        epoch_counter: Any = None,
    ) -> None:
        init_started = time.time()
        config = Config.model_validate_json(config_json)
        # Finished epochs, told to the run's EpochCounter as they end (the progress bar's moves).
        self.reporter = None if epoch_counter is None else EpochReporter(epoch_counter)
        # What __repr__ tells (popgrpo.runtime.naming.describe_group); `build`: the run's
        # restart count when the driver rebuilt this actor, 0 for one the run started with.
        self.label = member_label(member_ids)  # the actor's name without the run, which the name carries
        self.build = build
        self.total_epochs, self.interval_epochs = config.run.epochs, config.scheduler.interval_epochs
        self.seed, self.straggler = config.run.seed, config.population.straggler
        self.state_known = False  # nothing trained or loaded yet: round and epoch are not known
        self.last_reward_mean: dict[int, float] = {}
        torch.set_num_threads(config.run.torch_threads)
        self.metrics = LiveMetrics(run_tag)
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self.device, self.device_warning = resolve_device(config.policy.device, bool(self.gpu_ids))
        if self.device_warning:
            log.warning("members %s: %s", list(member_ids), self.device_warning)
        self.archives: dict[int, LocalArchive] = {}
        if archive_handle is None:
            self.archives = {k: new_archive(config) for k in member_ids}
        kind = policy_kind(config.policy.kind)
        shared = kind.shared(config, list(member_ids), self.device)  # e.g. one base model for all members
        self.members = {
            k: Member(
                k,
                config,
                self.archives[k]
                if archive_handle is None
                else RemoteArchive(archive_handle, 0 if config.archive.shared else k),
                device=self.device,
                rollout_service=None if rollout_worker is None else RemoteRolloutService(rollout_worker),
                shared=shared,
            )
            for k in member_ids
        }
        self.train_cpu_s: list[float] = []
        # How the members step together (packed, one mixed-adapter batch); None: one after another.
        self.trainer = group_trainer(config, list(self.members.values()))
        self._start = StartTimes(
            process=_process_started(),
            import_started=popgrpo.IMPORT_STARTED_AT,
            init_started=init_started,
            init_ended=time.time(),
            first_train_s=None,
        )

    def train(self, n_epochs: int) -> dict[int, list[dict]]:
        """Epoch by epoch across the packed members, publishing live metrics after each; then,
        with ``population.straggler`` on, sleep the members' seeded delays for this round."""
        started = time.time()
        delay = self.round_delay()
        rows: dict[int, list[dict]] = {k: [] for k in self.members}
        cpu = 0.0
        for _ in range(n_epochs):
            start = time.thread_time()
            if self.trainer is not None:
                epoch = dict(zip(self.members, (r[0] for r in self.trainer.train_epochs(1)), strict=True))
            else:
                epoch = {k: member.train_epochs(1)[0] for k, member in self.members.items()}
            cpu += time.thread_time() - start
            for k, row in epoch.items():
                rows[k].append(row)
                self.metrics.record_epoch(row)
                self.last_reward_mean[k] = float(row.get("reward_mean", math.nan))
            if self.reporter is not None:
                self.reporter.add(len(epoch))
        if self.reporter is not None:
            self.reporter.flush()
        self.train_cpu_s.append(cpu)
        self.state_known = True
        if self._start["first_train_s"] is None:
            self._start["first_train_s"] = time.time() - started
        if delay > 0:
            time.sleep(delay)
        return rows

    def round_delay(self) -> float:
        """Seconds of seeded straggler delay of the round about to be trained: the sum over this
        actor's members (they train one after another), 0 when ``population.straggler`` is off."""
        if self.straggler.scale_s == 0:
            return 0.0
        round_index = next(iter(self.members.values())).epochs_done // self.interval_epochs
        return sum(
            straggler_delay(self.seed, k, round_index, self.straggler.scale_s, self.straggler.sigma)
            for k in sorted(self.members)
        )

    def __repr__(self) -> str:
        """Members, device, round, epoch and each member's last mean reward (:func:`describe_group`)."""
        members = getattr(self, "members", None)  # None while the constructor runs
        epochs_done = next(iter(members.values())).epochs_done if members and self.state_known else None
        return describe_group(
            self.label,
            str(getattr(self, "device", "?")),
            self.build,
            epochs_done,
            self.total_epochs,
            self.interval_epochs,
            self.last_reward_mean,
        )

    def start_times(self) -> StartTimes:
        """When each phase of this actor's start ended (:class:`StartTimes`; benchmarks)."""
        return StartTimes(**self._start)

    def train_cpu_seconds(self) -> list[float]:
        """CPU seconds this actor's members spent training, one entry per ``train`` call (benchmarks)."""
        return list(self.train_cpu_s)

    # What goes back to the driver and comes from it travels packed (popgrpo.runtime.transport).
    def get_weights(self, member_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        return pack({k: self.members[k].get_weights() for k in member_ids})

    def adopt(self, bases: Mapping[str, Any], adoptions: Mapping[int, Adoption], round_index: int) -> dict:
        """This group's members adopt their bases: ``{"infos": {k: mutation description}, **snapshot()}``.

        ``bases`` maps the base keys these members need to object references (fetched here,
        once each). The round's checkpoint is taken right after, so the states come back with
        the answer: one round of actor calls less per round.
        """
        fetched = {
            key: unpack(ray.get(ref, timeout=MEMBER_WAIT_S) if isinstance(ref, ray.ObjectRef) else ref)
            for key, ref in bases.items()
        }
        infos = {k: adopt_one(self.members[k], fetched, a, round_index) for k, a in adoptions.items()}
        return {"infos": infos, **self.snapshot()}

    def behaviours(self, member_ids: Sequence[int]) -> dict[int, list[list[float]]]:
        return {k: self.members[k].behaviour_descriptors() for k in member_ids}

    def pid(self) -> int:
        return os.getpid()

    def placement(self) -> dict:
        """Where this actor's members compute: device, the GPUs Ray gave it, and any fallback."""
        return {"device": str(self.device), "gpu_ids": self.gpu_ids, "warning": self.device_warning}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def states(self) -> dict[int, dict]:
        return pack({k: m.state_dict() for k, m in self.members.items()})

    def load_states(self, states: Mapping[int, dict]) -> None:
        for k, state in unpack(dict(states)).items():
            self.members[k].load_state_dict(state)
        self.state_known = True

    # The archives held here (archives_in_groups); empty otherwise.
    def archive_states(self) -> dict[int, LocalArchiveState]:
        return pack({k: a.state_dict() for k, a in self.archives.items()})

    def load_archive_states(self, states: Mapping[int, LocalArchiveState]) -> None:
        for k, state in unpack(dict(states)).items():
            self.archives[k].load_state_dict(state)  # in place: the member keeps its reference

    def snapshot(self) -> GroupSnapshot:
        """Member states and the archives held here, in one call."""
        return {"members": self.states(), "archives": self.archive_states()}


def _process_started() -> float:
    """When this process started (``time.time()``)."""
    return psutil.Process().create_time()
