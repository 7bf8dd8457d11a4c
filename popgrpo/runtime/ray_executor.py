"""The Ray executor: members packed into actors, one named archive actor per run.

Thin by design: actors hold :class:`~popgrpo.algorithms.member.Member` objects and
:class:`~popgrpo.algorithms.archive_service.LocalArchive` objects and call their methods;
all math stays in ``popgrpo.core`` / ``popgrpo.algorithms``. Member seeds are keyed by
member id (not by actor or process), so a run gives the same numbers here as on the
:class:`~popgrpo.runtime.executor.LocalExecutor`, whatever ``members_per_actor`` is.

Traffic per round: one ``train`` call per actor (T epochs each); the soup is ``ray.put``
once and every actor receives the same object reference; each member perturbs it locally.
Per GRPO step, each member makes one call to the archive actor (``step``: statuses and
novelty together), because QD-GRPO's bonuses need the statuses before the update.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping, Sequence

import ray
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from popgrpo.config import Config
from popgrpo.runtime.executor import make_archives

__all__ = ["ArchiveActor", "ClusterTooSmallError", "MemberGroup", "RayExecutor", "connect", "start_local_ray"]


class ClusterTooSmallError(RuntimeError):
    """The population's resource request can never be met by the cluster."""


def start_local_ray(num_cpus: int | None = None, temp_dir: str | None = None, **kwargs):
    """Start an embedded single-node Ray bound to 127.0.0.1 only.

    ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough on Linux: Ray rewrites a
    loopback node address to the machine's interface address so that other nodes could
    join. An embedded Ray never has other nodes, so we switch that rewrite off the way Ray
    does on macOS/Windows (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``): the environment
    variable reaches Ray's child processes, the module constant this process.
    """
    import ray._private.ray_constants as ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    return ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp_dir,
        configure_logging=False,
        **kwargs,
    )


def connect(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Attach to Ray; return True when this call started an embedded local instance.

    ``address=None`` inside a Ray job (or with ``RAY_ADDRESS`` set) attaches to that
    cluster; otherwise it starts an embedded loopback-only Ray (:func:`start_local_ray`)
    with ``num_cpus`` logical CPUs (members then share the physical cores).
    """
    if ray.is_initialized():
        return False
    if address is None and not os.environ.get("RAY_ADDRESS"):
        start_local_ray(num_cpus)
        return True
    ray.init(address=address, configure_logging=False)
    return False


@ray.remote(num_cpus=0)
class ArchiveActor:
    """Owns the run's archive(s) and novelty memories: one shared, or one per member."""

    def __init__(self, config_json: str) -> None:
        self.archives = make_archives(Config.model_validate_json(config_json))

    def step(self, archive_id: int, behaviours, rewards, ideas, keep, novelty: bool):
        return self.archives[archive_id].step(behaviours, rewards, ideas, keep, novelty)

    def stats(self, archive_id: int) -> dict[str, float]:
        return self.archives[archive_id].stats()

    def state_dicts(self) -> list[dict]:
        return [a.state_dict() for a in self.archives]

    def load_state_dicts(self, states: list[dict]) -> None:
        for archive, state in zip(self.archives, states, strict=True):
            archive.load_state_dict(state)


class _RemoteArchive:
    """ArchiveService that forwards each step to the archive actor (one round trip)."""

    def __init__(self, handle, archive_id: int) -> None:
        self.handle, self.archive_id = handle, archive_id

    def step(self, behaviours, rewards, ideas, keep, novelty: bool):
        return ray.get(self.handle.step.remote(self.archive_id, behaviours, rewards, ideas, keep, novelty))

    def stats(self) -> dict[str, float]:
        return ray.get(self.handle.stats.remote(self.archive_id))


@ray.remote
class MemberGroup:
    """Several members packed into one actor (``population.members_per_actor``)."""

    def __init__(self, config_json: str, member_ids: Sequence[int], archive_handle) -> None:
        config = Config.model_validate_json(config_json)
        torch.set_num_threads(config.run.torch_threads)
        self.members = {
            k: Member(k, config, _RemoteArchive(archive_handle, 0 if config.archive.shared else k)) for k in member_ids
        }

    def train(self, n_epochs: int) -> dict[int, list[dict]]:
        return {k: m.train_epochs(n_epochs) for k, m in self.members.items()}

    def get_weights(self, member_ids: Sequence[int]) -> dict[int, dict[str, torch.Tensor]]:
        return {k: self.members[k].get_weights() for k in member_ids}

    def reseed(self, base: Mapping[str, torch.Tensor], sigma: float, round_index: int) -> None:
        for m in self.members.values():
            m.reseed(base, sigma, round_index)

    def states(self) -> dict[int, dict]:
        return {k: m.state_dict() for k, m in self.members.items()}

    def load_states(self, states: Mapping[int, dict]) -> None:
        for k, state in states.items():
            self.members[k].load_state_dict(state)


class RayExecutor:
    """Members on Ray actors; the same interface as :class:`LocalExecutor`."""

    def __init__(self, config: Config, address: str | None = None) -> None:
        self.config = config
        self.n_members = config.population.size
        per_actor = config.population.members_per_actor
        res = config.population.resources
        ids = list(range(self.n_members))
        self._groups = [ids[i : i + per_actor] for i in range(0, len(ids), per_actor)]
        needed_cpus = len(self._groups) * res.num_cpus
        self._started_ray = connect(address, num_cpus=max(os.cpu_count() or 1, math.ceil(needed_cpus)))
        try:
            _check_fits(needed_cpus, len(self._groups) * res.num_gpus)
        except ClusterTooSmallError:
            if self._started_ray:
                ray.shutdown()
            raise
        config_json = config.model_dump_json()
        self.run_id = uuid.uuid4().hex[:8]
        self.archive = ArchiveActor.options(name=f"popgrpo-archive-{config.run.name}-{self.run_id}").remote(config_json)
        self._actors = [
            MemberGroup.options(num_cpus=res.num_cpus, num_gpus=res.num_gpus).remote(config_json, group, self.archive)
            for group in self._groups
        ]
        self._actor_of = {k: a for a, group in zip(self._actors, self._groups, strict=True) for k in group}

    def train(self, n_epochs: int) -> list[list[dict]]:
        results: dict[int, list[dict]] = {}
        for part in ray.get([a.train.remote(n_epochs) for a in self._actors]):
            results.update(part)
        return [results[k] for k in range(self.n_members)]

    def get_weights(self, member_ids: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        by_actor: dict = {}
        for k in member_ids:
            by_actor.setdefault(self._actor_of[k], []).append(k)
        weights: dict[int, dict] = {}
        for part in ray.get([a.get_weights.remote(ks) for a, ks in by_actor.items()]):
            weights.update(part)
        return [weights[k] for k in member_ids]

    def reseed(self, base: Mapping[str, torch.Tensor], sigma: float, round_index: int) -> None:
        ref = ray.put(dict(base))  # one copy in the object store, shared by every actor
        ray.get([a.reseed.remote(ref, sigma, round_index) for a in self._actors])

    def archives(self) -> list[LocalArchive]:
        archives = []
        for state in ray.get(self.archive.state_dicts.remote()):
            local = LocalArchive()
            local.load_state_dict(state)
            archives.append(local)
        return archives

    def member_states(self) -> list[dict]:
        states: dict[int, dict] = {}
        for part in ray.get([a.states.remote() for a in self._actors]):
            states.update(part)
        return [states[k] for k in range(self.n_members)]

    def load_member_states(self, states: Sequence[dict]) -> None:
        ray.get(
            [
                a.load_states.remote({k: states[k] for k in group})
                for a, group in zip(self._actors, self._groups, strict=True)
            ]
        )

    def load_archive_states(self, states: Sequence[dict]) -> None:
        ray.get(self.archive.load_state_dicts.remote(list(states)))

    def close(self) -> None:
        for actor in [*self._actors, self.archive]:
            ray.kill(actor)
        if self._started_ray:
            ray.shutdown()


def _check_fits(cpus: float, gpus: float) -> None:
    """Fail fast instead of leaving actors pending forever on a cluster that is too small."""
    total = ray.cluster_resources()
    for name, need in (("CPU", cpus), ("GPU", gpus)):
        have = total.get(name, 0.0)
        if need > have + 1e-9:
            raise ClusterTooSmallError(
                f"the population needs {need:g} {name}s (actors × population.resources.num_{name.lower()}s) "
                f"but the Ray cluster has {have:g}: raise population.members_per_actor or lower "
                f"population.resources.num_{name.lower()}s"
            )
