"""The Ray executor: members packed into actors; where the archives live depends on the config.

Thin by design: actors hold :class:`~popgrpo.algorithms.member.Member` objects and
:class:`~popgrpo.algorithms.archive_service.LocalArchive` objects and call their methods;
all math stays in ``popgrpo.core`` / ``popgrpo.algorithms``. Member seeds are keyed by
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import make_member, resolve_device
from popgrpo.config import Config
from popgrpo.core.merge import Mutation
from popgrpo.runtime.archive_store import resolve_redis_password
from popgrpo.runtime.executor import make_archives, new_archive
from popgrpo.telemetry.live import LiveMetrics

log = logging.getLogger(__name__)

__all__ = [
    "ArchiveActor",
    "ClusterTooSmallError",
    "MemberGroup",
    "RayExecutor",
    "SetupError",
    "archives_in_groups",
    "connect",
    "force_loopback",
    "start_local_ray",
]


class SetupError(RuntimeError):
    """The run cannot start as configured on this cluster (the CLI exits 2 with the message)."""


class ClusterTooSmallError(SetupError):
    """The population's resource request can never be met by the cluster."""


def force_loopback() -> None:
    """Make every Ray process this one starts bind to 127.0.0.1, nothing else.

    ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough on Linux: Ray rewrites a
    loopback node address to the machine's interface address so that other machines could
    join. Nodes started from this process (an embedded Ray, or a test's
    ``ray.cluster_utils.Cluster``) never have other machines, so we switch that rewrite off
    the way Ray does on macOS/Windows (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``): the
    environment variable reaches Ray's child processes, the module constant this process.
    Never used when attaching to a real cluster.
    """
    import ray._private.ray_constants as ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def start_local_ray(
    num_cpus: int | None = None,
    temp_dir: str | None = None,
    include_dashboard: bool = True,
    dashboard_port: int | None = None,
    **kwargs,
):
    """Start an embedded single-node Ray bound to 127.0.0.1 only (see :func:`force_loopback`).

    The dashboard (and with it the per-node metrics agent that serves ``popgrpo_*`` metrics
    to Prometheus) listens on 127.0.0.1 too.
    """
    force_loopback()
    if include_dashboard:
        kwargs.update(dashboard_host="127.0.0.1")
        if dashboard_port is not None:
            kwargs.update(dashboard_port=dashboard_port)
    return ray.init(
        num_cpus=num_cpus,
        include_dashboard=include_dashboard,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp_dir,
        configure_logging=False,
        **kwargs,
    )


def connect(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Attach to Ray; return True when this call started an embedded local instance.

    ``address=None`` inside a Ray job (or with ``RAY_ADDRESS`` set) attaches to that
    cluster; otherwise it starts an embedded loopback-only Ray (:func:`start_local_ray`)
    with ``num_cpus`` logical CPUs (members then share the physical cores), its dashboard on
    ``$POPGRPO_RAY_DASHBOARD_PORT`` (default 8265).
    """
    if ray.is_initialized():
        return False
    if address is None and not os.environ.get("RAY_ADDRESS"):
        port = os.environ.get("POPGRPO_RAY_DASHBOARD_PORT")
        start_local_ray(num_cpus, dashboard_port=int(port) if port else None)
        return True
    ray.init(address=address, configure_logging=False)
    return False


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
        self.archives = make_archives(config)
        self.store = None
        if config.archive.redis_url:
            from popgrpo.runtime.archive_store import RedisArchiveStore

            self.store = RedisArchiveStore(config.archive.redis_url, run_key, redis_password)
        # A fresh run has no snapshot yet and a Redis key of its own, so this restores
        # nothing; after Ray restarts this actor it brings back what the run had.
        self.restored = {"snapshot_round": None, "redis_elites": 0}
        self._restore(run_dir)

    def _restore(self, run_dir: str | None) -> None:
        from popgrpo.telemetry.checkpoint import Checkpointer

        checkpointer = Checkpointer(run_dir) if run_dir else None
        info = checkpointer.latest() if checkpointer else None
        if info is not None:
            for archive, state in zip(self.archives, checkpointer.load_archives(info), strict=True):
                archive.load_state_dict(state)
            self.restored["snapshot_round"] = info["round"]
        if self.store is not None:
            for archive_id, archive in enumerate(self.archives):
                elites = self.store.read(archive_id)
                if len(elites["reward"]):
                    archive.archive.add(elites["behaviour"], elites["reward"], elites["idea"])
                    self.restored["redis_elites"] += len(elites["reward"])

    def restore_info(self) -> dict:
        return dict(self.restored)

    def step(self, archive_id: int, behaviours, rewards, ideas, keep, novelty: bool):
        statuses, scores = self.archives[archive_id].step(behaviours, rewards, ideas, keep, novelty)
        if self.store is not None:
            stored = statuses > 0
            if stored.any():
                archive = self.archives[archive_id].archive
                self.store.write(
                    archive_id, archive.cell_of(behaviours[stored]), rewards[stored], behaviours[stored], ideas[stored]
                )
        return statuses, scores

    def stats(self, archive_id: int) -> dict[str, float]:
        return self.archives[archive_id].stats()

    def state_dicts(self) -> list[dict]:
        return [a.state_dict() for a in self.archives]

    def load_state_dicts(self, states: list[dict]) -> None:
        self.load_states(dict(enumerate(states)))

    def load_states(self, states: Mapping[int, dict]) -> None:
        """Set individual archives (a resume, or a lost member's private archive rolled back)."""
        for archive_id, state in states.items():
            self.archives[archive_id].load_state_dict(state)
            if self.store is not None:
                self.store.replace(archive_id, self.archives[archive_id].archive.elites())

    def pid(self) -> int:
        return os.getpid()


def archives_in_groups(config: Config) -> bool:
    """True when each member's private archive lives in its member actor (no per-step archive calls)."""
    return not config.archive.shared and not config.archive.redis_url


class _RemoteArchive:
    """ArchiveService that forwards each step to the archive actor (one round trip)."""

    def __init__(self, handle, archive_id: int) -> None:
        self.handle, self.archive_id = handle, archive_id

    def step(self, behaviours, rewards, ideas, keep, novelty: bool):
        return self.result(self.submit(behaviours, rewards, ideas, keep, novelty))

    def submit(self, behaviours, rewards, ideas, keep, novelty: bool):
        # One caller's calls run on the actor in submission order, so a shared archive sees
        # packed members' batches in member order.
        return self.handle.step.remote(self.archive_id, behaviours, rewards, ideas, keep, novelty)

    def result(self, handle):
        return ray.get(handle)

    def stats(self) -> dict[str, float]:
        return ray.get(self.handle.stats.remote(self.archive_id))


@ray.remote
class MemberGroup:
    """Several members packed into one actor (``population.members_per_actor``).

    With ``archive_handle`` None each member's private archive lives here and is called
    in-process (:func:`archives_in_groups`); otherwise members call the archive actor.
    """

    def __init__(self, config_json: str, member_ids: Sequence[int], archive_handle, run_tag: str) -> None:
        config = Config.model_validate_json(config_json)
        torch.set_num_threads(config.run.torch_threads)
        self.metrics = LiveMetrics(run_tag)
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self.device, self.device_warning = resolve_device(config.policy.device, bool(self.gpu_ids))
        if self.device_warning:
            log.warning("members %s: %s", list(member_ids), self.device_warning)
        self.archives: dict[int, LocalArchive] = {}
        if archive_handle is None:
            self.archives = {k: new_archive(config) for k in member_ids}
        self.members = {
            k: make_member(
                k,
                config,
                self.archives[k]
                if archive_handle is None
                else _RemoteArchive(archive_handle, 0 if config.archive.shared else k),
                device=self.device,
            )
            for k in member_ids
        }
        self.packed = None
        self.train_cpu_s: list[float] = []
        if config.population.vectorize:
            from popgrpo.algorithms.packed import PackedMembers

            self.packed = PackedMembers(list(self.members.values()))

    def train(self, n_epochs: int) -> dict[int, list[dict]]:
        """Epoch by epoch across the packed members, publishing live metrics after each."""
        rows: dict[int, list[dict]] = {k: [] for k in self.members}
        cpu = 0.0
        for _ in range(n_epochs):
            start = time.thread_time()
            if self.packed is not None:  # population.vectorize: one batched step for all members
                epoch = dict(zip(self.members, (r[0] for r in self.packed.train_epochs(1)), strict=True))
            else:
                epoch = {k: member.train_epochs(1)[0] for k, member in self.members.items()}
            cpu += time.thread_time() - start
            for k, row in epoch.items():
                rows[k].append(row)
                self.metrics.record_epoch(row)
        self.train_cpu_s.append(cpu)
        return rows

    def train_cpu_seconds(self) -> list[float]:
        """CPU seconds this actor's members spent training, one entry per ``train`` call (benchmarks)."""
        return list(self.train_cpu_s)

    def get_weights(self, member_ids: Sequence[int]) -> dict[int, dict[str, torch.Tensor]]:
        return {k: self.members[k].get_weights() for k in member_ids}

    def reseed(self, base: Mapping[str, torch.Tensor], mutation: Mutation | float, round_index: int) -> dict:
        """Re-seed every member: ``{"infos": {k: mutation description}, **snapshot()}``.

        The round's checkpoint is taken right after the re-seed, so the states come back with it:
        one round of actor calls less per round.
        """
        infos = {k: m.reseed(base, mutation, round_index) for k, m in self.members.items()}
        return {"infos": infos, **self.snapshot()}

    def pid(self) -> int:
        return os.getpid()

    def placement(self) -> dict:
        """Where this actor's members compute: device, the GPUs Ray gave it, and any fallback."""
        return {"device": str(self.device), "gpu_ids": self.gpu_ids, "warning": self.device_warning}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def states(self) -> dict[int, dict]:
        return {k: m.state_dict() for k, m in self.members.items()}

    def load_states(self, states: Mapping[int, dict]) -> None:
        for k, state in states.items():
            self.members[k].load_state_dict(state)

    # The archives held here (archives_in_groups); empty otherwise.
    def archive_states(self) -> dict[int, dict]:
        return {k: a.state_dict() for k, a in self.archives.items()}

    def load_archive_states(self, states: Mapping[int, dict]) -> None:
        for k, state in states.items():
            self.archives[k].load_state_dict(state)  # in place: the member keeps its reference

    def snapshot(self) -> dict[str, dict[int, dict]]:
        """Member states and the archives held here, in one call."""
        return {"members": self.states(), "archives": self.archive_states()}


class RayExecutor:
    """Members on Ray actors; the same interface as :class:`LocalExecutor`."""

    def __init__(self, config: Config, run_dir: str | None = None, address: str | None = None) -> None:
        self.config = config
        self.n_members = config.population.size
        per_actor = config.population.members_per_actor
        res = config.population.resources
        ids = list(range(self.n_members))
        self._groups = [ids[i : i + per_actor] for i in range(0, len(ids), per_actor)]
        needed_cpus = len(self._groups) * res.num_cpus
        self._started_ray = connect(address, num_cpus=max(os.cpu_count() or 1, math.ceil(needed_cpus)))
        try:
            _check_fits(len(self._groups), res.num_cpus, res.num_gpus, wait_s=res.wait_for_cluster_s)
        except ClusterTooSmallError:
            if self._started_ray:
                ray.shutdown()
            raise
        config_json = config.model_dump_json()
        self.run_id = uuid.uuid4().hex[:8]
        self.run_tag = Path(run_dir).name if run_dir else f"{config.run.name}-{self.run_id}"  # metrics tag
        self.metrics = LiveMetrics(self.run_tag)
        self._round = -1
        redis_password = None
        if config.archive.redis_url:
            redis_password = resolve_redis_password(config.archive.redis_url)
            self._check_redis(config.archive.redis_url, redis_password)
        run_key = f"{config.run.name}-{self.run_id}"  # names the archive actor and its Redis keys
        # Private archives without Redis live in the member actors: no archive actor at all.
        self._in_groups = archives_in_groups(config)
        self.archive = None
        self._archive_pid: int | None = None
        if not self._in_groups:
            self.archive = ArchiveActor.options(
                name=f"popgrpo-archive-{run_key}",
                # On the driver's node: a restarted archive actor reads the run directory's snapshot.
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
            ).remote(config_json, str(run_dir) if run_dir else None, run_key, redis_password)
            self._archive_pid = ray.get(self.archive.pid.remote())
        self._config_json = config_json
        self._actors = [self._new_group(group) for group in self._groups]
        self._group_of = {k: g for g, group in enumerate(self._groups) for k in group}
        # Where a rebuilt actor restarts from (None: the initial state a new actor has), and
        # the state-changing calls made since, which it replays.
        self._restore_members: list[dict] | None = None
        self._after_reseed: list[list[dict]] | None = None  # [members, archives] sent back by the last reseed
        self._since_restore: list[tuple[str, Callable[[int], tuple]]] = []
        self._restore_archives: list[dict] = [a.state_dict() for a in make_archives(config)]
        self.restarts = 0
        self.events: list[dict] = []
        # A member without the GPU it reserved is reported, not silently slower.
        for group, place in zip(self._groups, ray.get([a.placement.remote() for a in self._actors]), strict=True):
            if place["warning"]:
                self.events.append({"event": "device_fallback", "members": group, "reason": place["warning"]})

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

    def _new_group(self, group: Sequence[int]):
        res = self.config.population.resources
        return MemberGroup.options(num_cpus=res.num_cpus, num_gpus=res.num_gpus).remote(
            self._config_json, group, self.archive, self.run_tag
        )

    # ---- calls that survive lost actors ----------------------------------------------------
    def _call(
        self,
        method: str,
        args_for: Callable[[int], tuple],
        groups: Sequence[int] | None = None,
        replayable: bool = False,
    ) -> dict[int, object]:
        """Call ``method`` on the given groups' actors; rebuild and retry any that are lost.

        A lost actor (process killed, node gone) is rebuilt from the restore point (the last
        :meth:`snapshot`), replays the state-changing calls made since then (``train``,
        ``reseed``), and the call is retried. Replays are exact: a member's results depend
        only on its state and its own random stream. ``replayable`` calls are recorded for
        later replays.
        """
        groups = range(len(self._actors)) if groups is None else groups
        refs = {g: getattr(self._actors[g], method).remote(*args_for(g)) for g in groups}
        results: dict[int, object] = {}
        attempts = dict.fromkeys(refs, 0)
        while refs:
            ready, _ = ray.wait(list(refs.values()), num_returns=1)
            g = next(g for g, ref in refs.items() if ref == ready[0])
            del refs[g]
            try:
                results[g] = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:  # died, or its node is gone
                attempts[g] += 1
                limit = self.config.population.max_restarts
                if attempts[g] > limit:
                    raise RuntimeError(
                        f"member actor {g} (members {self._groups[g]}) was lost {attempts[g]} times in one call "
                        f"(population.max_restarts={limit}); giving up"
                    ) from exc
                self._rebuild_group(g, reason=str(exc).splitlines()[0])
                refs[g] = getattr(self._actors[g], method).remote(*args_for(g))
        if replayable:
            self._since_restore.append((method, args_for))
        return results

    def _rebuild_group(self, g: int, reason: str) -> None:
        group = self._groups[g]
        self.restarts += 1
        self.metrics.record_restart()
        self.events.append({"event": "member_actor_restarted", "actor": g, "members": group, "reason": reason})
        log.warning("member actor %d (members %s) lost: %s; rebuilding it from the last round", g, group, reason)
        ray.kill(self._actors[g], no_restart=True)
        # Until Ray has noticed a lost node, a new actor may still be placed on it and die
        # there too: retry with backoff until one comes up on a live node.
        delay = 0.5
        for attempt in range(self.config.population.max_restarts + 1):
            actor = self._new_group(group)
            try:
                if self._restore_members is not None:
                    ray.get(actor.load_states.remote({k: self._restore_members[k] for k in group}))
                else:
                    ray.get(actor.pid.remote())
                if self._in_groups:  # its members' private archives, from the same restore point
                    ray.get(actor.load_archive_states.remote({k: self._restore_archives[k] for k in group}))
                elif not self.config.archive.shared:  # roll them back in the archive actor
                    ray.get(self.archive.load_states.remote({k: self._restore_archives[k] for k in group}))
                for method, args_for in self._since_restore:
                    ray.get(getattr(actor, method).remote(*args_for(g)))
            except ray.exceptions.RayActorError:
                ray.kill(actor, no_restart=True)
                if attempt == self.config.population.max_restarts:
                    raise
                time.sleep(delay)
                delay *= 2
                continue
            self._actors[g] = actor
            return

    # ---- the Executor interface --------------------------------------------------------------
    def train(self, n_epochs: int) -> list[list[dict]]:
        self._round += 1
        self._after_reseed = None  # the members move on: those states are no snapshot any more
        self.metrics.record_round(self._round)
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
            weights.update(part)
        return [weights[k] for k in member_ids]

    def reseed(self, base: Mapping[str, torch.Tensor], mutation: Mutation | float, round_index: int) -> list[dict]:
        """Every member re-seeds from ``base``; the states the actors send back with their answer
        serve the :meth:`snapshot` that follows (the round's checkpoint), without another call."""
        ref = ray.put(dict(base))  # one copy in the object store, shared by every actor
        parts = self._call("reseed", lambda g: (ref, mutation, round_index), replayable=True).values()
        infos, *states = self._merge_parts(parts, ("infos", "members", "archives"))
        self._after_reseed = states
        return infos

    def _merge_parts(self, parts, keys: Sequence[str]) -> list[list]:
        """Per-actor answers ``{key: {member id: value}}`` → for each key, the values in member order."""
        merged: dict[str, dict] = {key: {} for key in keys}
        for part in parts:
            for key in keys:
                merged[key].update(part[key])
        return [[merged[key].get(k) for k in range(self.n_members)] for key in keys]

    def _archive_states(self) -> list[dict]:
        if not self._in_groups:
            return ray.get(self.archive.state_dicts.remote())
        states: dict[int, dict] = {}
        for part in self._call("archive_states", lambda g: ()).values():
            states.update(part)
        return [states[k] for k in range(self.n_members)]

    def archives(self) -> list[LocalArchive]:
        archives = []
        for state in self._archive_states():
            local = LocalArchive()
            local.load_state_dict(state)
            archives.append(local)
        return archives

    def member_states(self) -> list[dict]:
        states: dict[int, dict] = {}
        for part in self._call("states", lambda g: ()).values():
            states.update(part)
        return [states[k] for k in range(self.n_members)]

    def snapshot(self) -> tuple[list[dict], list[dict]]:
        """Member and archive states for the round checkpoint; also the restart point of lost actors.

        One call per actor returns both where the archives live in the member actors; right
        after :meth:`reseed`, none: its answer carried the states.
        """
        fresh, self._after_reseed = self._after_reseed, None  # states sent back by reseed, if it was the last call
        if fresh is not None:
            members, archives = fresh
        else:
            members, archives = self._merge_parts(
                self._call("snapshot", lambda g: ()).values(), ("members", "archives")
            )
        self._restore_members, self._restore_archives, self._since_restore = members, archives, []
        if self._in_groups:
            return self._restore_members, self._restore_archives
        self._restore_archives = ray.get(self.archive.state_dicts.remote())
        pid = ray.get(self.archive.pid.remote())
        if pid != self._archive_pid:  # Ray restarted it during the round
            self._archive_pid = pid
            self.metrics.record_restart()
            info = ray.get(self.archive.restore_info.remote())
            self.events.append(
                {
                    "event": "archive_actor_restarted",
                    "reason": f"restored from round {info['snapshot_round']} snapshot and {info['redis_elites']} Redis elites",
                }
            )
        return self._restore_members, self._restore_archives

    def load_member_states(self, states: Sequence[dict]) -> None:
        self._after_reseed = None
        self._round = states[0]["epochs_done"] // self.config.scheduler.interval_epochs - 1
        self._restore_members = list(states)
        self._since_restore = []
        self._call("load_states", lambda g: ({k: states[k] for k in self._groups[g]},))

    def load_archive_states(self, states: Sequence[dict]) -> None:
        self._after_reseed = None
        self._restore_archives = list(states)
        if self._in_groups:
            self._call("load_archive_states", lambda g: ({k: states[k] for k in self._groups[g]},))
        else:
            ray.get(self.archive.load_state_dicts.remote(list(states)))

    def close(self) -> None:
        self.metrics.close()  # a finished run's gauges may expire now
        for actor in [*self._actors, self.archive]:
            if actor is not None:
                ray.kill(actor)
        if self._started_ray:
            ray.shutdown()


def _check_fits(n_actors: int, cpus_each: float, gpus_each: float, wait_s: float = 0.0) -> None:
    """Fail fast instead of leaving actors pending forever on a cluster that is too small.

    On an autoscaling cluster the nodes may not exist yet: with ``wait_s > 0`` the
    population's bundles are requested from the autoscaler (``request_resources``) and the
    check is repeated until they fit or ``wait_s`` has passed.
    """
    need = {"CPU": n_actors * cpus_each, "GPU": n_actors * gpus_each}

    def shortfall() -> str | None:
        total = ray.cluster_resources()
        for name, amount in need.items():
            if amount > total.get(name, 0.0) + 1e-9:
                return (
                    f"the population needs {amount:g} {name}s (actors × population.resources.num_{name.lower()}s) "
                    f"but the Ray cluster has {total.get(name, 0.0):g}"
                )
        return None

    missing = shortfall()
    if missing and wait_s > 0:
        from ray.autoscaler.sdk import request_resources

        bundle = {k: v for k, v in (("CPU", cpus_each), ("GPU", gpus_each)) if v > 0}
        if bundle:
            request_resources(bundles=[bundle] * n_actors)
        log.warning("%s; waiting up to %gs for the cluster to grow", missing, wait_s)
        deadline = time.monotonic() + wait_s
        while missing and time.monotonic() < deadline:
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            missing = shortfall()
    if missing:
        waited = f" after waiting {wait_s:g}s" if wait_s > 0 else ""
        raise ClusterTooSmallError(
            f"{missing}{waited}: raise population.members_per_actor, lower population.resources.num_cpus/num_gpus, "
            "or on an autoscaling cluster set population.resources.wait_for_cluster_s"
        )
