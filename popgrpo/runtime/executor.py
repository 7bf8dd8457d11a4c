"""Executors: where members live. The scheduler talks to this interface only.

:class:`LocalExecutor` keeps every member in this process. The Ray executor (members packed
into actors, a named archive actor) implements the same methods, so the scheduler loop,
the lineage log and the run directory are identical whichever runs the members. Whatever
needs a policy built from the config (the members, held-out evaluation, θ_0) is the
executor's: the scheduler only decides, moves weights and merges them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Protocol

import torch

from popgrpo.algorithms.archive_service import LocalArchive, LocalArchiveState
from popgrpo.algorithms.engine_rollouts import rollout_server
from popgrpo.algorithms.evaluation import WeightsEvaluator
from popgrpo.algorithms.initial_weights import round0_weights
from popgrpo.algorithms.member import Member, resolve_device
from popgrpo.algorithms.policy_kinds import group_trainer, policy_kind
from popgrpo.algorithms.population import OWN, Adoption
from popgrpo.config import Config
from popgrpo.envs import make_env

__all__ = ["Executor", "LocalExecutor", "adopt_one", "make_archives", "new_archive"]


class Executor(Protocol):
    n_members: int
    restarts: int  # member actors rebuilt after dying (always 0 in-process)
    events: list[dict]  # failures and recoveries not yet reported; the driver drains it

    def train(self, n_epochs: int, round_index: int = 0) -> list[list[dict]]:
        """Every member trains ``n_epochs`` of round ``round_index``; per member, one metrics row per epoch."""
        ...

    def get_weights(self, member_ids: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """State dicts of the given members, in that order."""
        ...

    def adopt(
        self, bases: Mapping[str, Mapping[str, torch.Tensor]], adoptions: Mapping[int, Adoption], round_index: int
    ) -> dict[int, dict]:
        """Each member in ``adoptions`` continues from its base with its own mutation (:meth:`Member.adopt`).

        ``bases`` holds each distinct base an adoption names (``merged``, ``member:j``,
        ``elite:key``; not ``own``), sent once whoever needs it. Members not in ``adoptions``
        are left as they are. Returns each adopting member's mutation description.
        """
        ...

    def behaviours(self, member_ids: Sequence[int]) -> dict[int, list[list[float]]]:
        """Each given member's ``[P][B]`` behaviour descriptors of its last epoch (:meth:`Member.behaviour_descriptors`)."""
        ...

    def archives(self) -> list[LocalArchive]:
        """The archive(s): one when shared, one per member otherwise."""
        ...

    def evaluate(self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int) -> dict[str, float]:
        """Held-out metrics of weights no member holds (greedy soup's candidates, the merged model):
        :class:`~popgrpo.algorithms.evaluation.WeightsEvaluator`, with the evaluation stream of
        ``(round_index, purpose)``. Evaluating changes no member and no training number."""
        ...

    def submit_evaluate(
        self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int
    ) -> Callable[[], dict[str, float]]:
        """:meth:`evaluate`, begun now and answered by calling what it returns (once): an executor
        whose evaluator is another process sends it the weights now, so that it scores them
        while the driver goes on (the merged model, during the members' adoption); one that
        evaluates in its own process computes at the call."""
        ...

    def round0_weights(self, member_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """θ_0 of the given members (:func:`~popgrpo.algorithms.initial_weights.round0_weights`):
        the base of ``wise_ft`` and ``task_arithmetic``."""
        ...

    def member_states(self) -> list[dict]:
        """Every member's :meth:`Member.state_dict`, in member order."""
        ...

    def snapshot(self) -> tuple[list[dict], list[LocalArchiveState]]:
        """``(member_states, archive_states)`` at a round's end, for the checkpoint.

        Executors that can lose members also keep it as the point a rebuilt member restarts from.
        """
        ...

    def load_member_states(self, states: Sequence[dict]) -> None:
        """Restore every member from :meth:`member_states` output."""
        ...

    def load_archive_states(self, states: Sequence[LocalArchiveState]) -> None:
        """Restore the archive(s) from ``[a.state_dict() for a in archives()]``."""
        ...

    def close(self) -> None: ...

    # What differs between executors is declared here, with what an executor without it returns,
    # so callers never probe for a method (an in-process executor answers each trivially).
    @property
    def n_actors(self) -> int:
        """Member actors (processes that hold members and answer remote calls); 0 in-process."""
        ...

    def train_after_adopt(self, n_epochs: Mapping[int, int]) -> None:
        """At the next :meth:`adopt`, send actor ``g`` its next train call of ``n_epochs[g]`` epochs right
        behind its adopt call (results unchanged); an executor without actors has nothing to overlap."""
        ...

    def member_epochs(self) -> int | None:
        """Member epochs finished so far, for the progress bar between rounds (None: not counted)."""
        ...

    def worker_pids(self) -> list[int]:
        """The process id of each member actor, in actor order (empty in-process)."""
        ...

    def epoch_cpu_seconds(self) -> list[list[float]]:
        """Per member actor, the CPU seconds its members spent in each train call (empty in-process)."""
        ...


def adopt_one(
    member: Member, bases: Mapping[str, Mapping[str, torch.Tensor]], adoption: Adoption, round_index: int
) -> dict:
    """``member`` carries out ``adoption`` with its base looked up in ``bases``; its mutation's description."""
    base = None if adoption.base == OWN else bases[adoption.base]
    return member.adopt(
        base, adoption.mutation, round_index, adoption.reset_optimizer, adoption.repel, adoption.repel_keep
    )


def new_archive(config: Config) -> LocalArchive:
    """An empty archive and novelty memory sized as the config says."""
    nov = config.maxent.novelty
    return LocalArchive(config.archive.cells_per_dim, nov.capacity, nov.k)


def make_archives(config: Config) -> list[LocalArchive]:
    """One shared archive, or one per member, as ``archive.shared`` says."""
    n = 1 if config.archive.shared else config.population.size
    return [new_archive(config) for _ in range(n)]


class LocalExecutor:
    """All members in this process, trained one after another."""

    def __init__(self, config: Config, run_dir: str | Path | None = None) -> None:
        torch.set_num_threads(config.run.torch_threads)
        self.config = config
        self.n_members = config.population.size
        self.restarts = 0
        self.events: list[dict] = []
        self._member_epochs = 0
        self._evaluator: WeightsEvaluator | None = None  # built at the first evaluate
        self._archives = make_archives(config)
        env = make_env(config.env)
        device, warning = resolve_device(config.policy.device, config.population.resources.num_gpus > 0)
        if warning:
            self.events.append({"event": "device_fallback", "reason": warning})
        # policy.causal_lm.rollout on a worker: one engine in this process serves every member.
        self.kind = policy_kind(config.policy.kind)
        self.rollout_server = rollout_server(config, device) if self.kind.uses_rollout_worker(config) else None
        shared = self.kind.shared(config, range(self.n_members), device)  # e.g. one base model for all
        self.members = [
            Member(
                k,
                config,
                self._archives[0 if config.archive.shared else k],
                env,
                device,
                rollout_service=self.rollout_server,
                shared=shared,
            )
            for k in range(self.n_members)
        ]

    def _train(self, members: Sequence[Member], n_epochs: int) -> list[list[dict]]:
        """``members`` train together as their policy kind says (packed, one mixed batch), or one after another."""
        trainer = group_trainer(self.config, members)
        if trainer is not None:
            rows = trainer.train_epochs(n_epochs)
            self._member_epochs += n_epochs * len(members)
            return rows
        rows: list[list[dict]] = [[] for _ in members]
        for i, member in enumerate(members):
            for _ in range(n_epochs):  # an epoch at a time (the same numbers) to count each as it ends
                rows[i] += member.train_epochs(1)
                self._member_epochs += 1
        return rows

    def member_epochs(self) -> int:
        """Member epochs trained so far (the progress bar follows them from another thread)."""
        return self._member_epochs

    @property
    def n_actors(self) -> int:
        """Members train in this process: no member actors."""
        return 0

    def train_after_adopt(self, n_epochs: Mapping[int, int]) -> None:
        """Nothing to send ahead: members adopt and train in this process, one call after the other."""
        del n_epochs

    def worker_pids(self) -> list[int]:
        """Members train in this process: there are no worker processes of their own (empty)."""
        return []

    def epoch_cpu_seconds(self) -> list[list[float]]:
        """Per worker process, CPU seconds of its members' epochs per ``train`` call: none here (empty)."""
        return []

    def train(self, n_epochs: int, round_index: int = 0) -> list[list[dict]]:
        return self._train(self.members, n_epochs)

    def get_weights(self, member_ids: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        return [self.members[k].get_weights() for k in member_ids]

    def adopt(
        self, bases: Mapping[str, Mapping[str, torch.Tensor]], adoptions: Mapping[int, Adoption], round_index: int
    ) -> dict[int, dict]:
        return {k: adopt_one(self.members[k], bases, a, round_index) for k, a in adoptions.items()}

    def behaviours(self, member_ids: Sequence[int]) -> dict[int, list[list[float]]]:
        return {k: self.members[k].behaviour_descriptors() for k in member_ids}

    def archives(self) -> list[LocalArchive]:
        return self._archives

    def evaluate(self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int) -> dict[str, float]:
        """In this process, on a scratch policy and environment built at the first call."""
        if self._evaluator is None:
            self._evaluator = WeightsEvaluator(self.config)
        return self._evaluator(weights, round_index, purpose)

    def submit_evaluate(
        self, weights: Mapping[str, torch.Tensor], round_index: int, purpose: int
    ) -> Callable[[], dict[str, float]]:
        """In this process, when its answer is asked for."""
        return partial(self.evaluate, weights, round_index, purpose)

    def round0_weights(self, member_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        return round0_weights(self.config, member_ids)

    # ---- asynchronous rounds: in this process, reports come in the order calls were made ----
    @property
    def groups(self) -> list[list[int]]:
        """Members that train and report together: ``population.members_per_actor`` at a time,
        as the Ray executor packs them into actors (so an asynchronous run makes the same
        merges here as on Ray), or all of them when vectorised."""
        if self.config.population.vectorize:
            return [list(range(self.n_members))]
        per_actor = self.config.population.members_per_actor
        return [list(range(i, min(i + per_actor, self.n_members))) for i in range(0, self.n_members, per_actor)]

    def submit_train(self, g: int, n_epochs: int) -> tuple[int, int]:
        return (g, n_epochs)

    def wait_train(self, handles: list[tuple[int, int]]) -> tuple[tuple[int, int], dict[int, list[dict]]]:
        """Trains the earliest submitted call now: in-process, arrival order is submission order."""
        handle = handles[0]
        g, n_epochs = handle
        group = self.groups[g]
        rows = self._train([self.members[k] for k in group], n_epochs)
        return handle, dict(zip(group, rows, strict=True))

    def restore_points(self) -> tuple[list[dict], list[LocalArchiveState]]:
        """In this process a member trains only inside :meth:`wait_train`, so between calls every
        member holds the state it had when it last adopted a merge."""
        return self.snapshot()

    def member_states(self) -> list[dict]:
        return [m.state_dict() for m in self.members]

    def snapshot(self) -> tuple[list[dict], list[LocalArchiveState]]:
        return self.member_states(), [a.state_dict() for a in self._archives]

    def load_member_states(self, states: Sequence[dict]) -> None:
        for member, state in zip(self.members, states, strict=True):
            member.load_state_dict(state)

    def load_archive_states(self, states: Sequence[LocalArchiveState]) -> None:
        for archive, state in zip(self._archives, states, strict=True):
            archive.load_state_dict(state)

    def close(self) -> None:
        pass
