"""The rollout worker: one Ray actor holding one rollout engine for the whole population.

Thin by design: it holds a :class:`~popgrpo.algorithms.engine_rollouts.RolloutServer` (the
engine and each member's latest adapter version) and calls it. Members reach it through
:class:`RemoteRolloutService`, the :class:`~popgrpo.algorithms.engine_rollouts.RolloutService`
that waits for each answer. Started by :class:`~popgrpo.runtime.ray_executor.RayExecutor` when
``policy.causal_lm.rollout`` runs on a worker, with ``policy.causal_lm.rollout.num_gpus`` GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ray
import torch

from popgrpo.algorithms.engine_rollouts import RolloutServer, rollout_server
from popgrpo.config import Config
from popgrpo.policies.engines import EngineUnavailable, Generation, Sampling

__all__ = ["RemoteRolloutService", "RolloutWorker"]


@ray.remote
class RolloutWorker:
    """The engine named by ``policy.causal_lm.rollout.engine`` and every member's adapter.

    An engine that cannot run here (vLLM not installed) does not fail the actor's start:
    :meth:`ready` returns its one-line message, which the executor reports.
    """

    def __init__(self, config_json: str) -> None:
        config = Config.model_validate_json(config_json)
        torch.set_num_threads(config.run.torch_threads)
        self.problem: str | None = None
        self.server: RolloutServer | None = None
        device = "cuda" if torch.cuda.is_available() and ray.get_gpu_ids() else "cpu"
        try:
            self.server = rollout_server(config, device)
        except EngineUnavailable as exc:
            self.problem = str(exc)

    def ready(self) -> str | None:
        """None when the engine runs; else why not (one line)."""
        return self.problem

    def _server(self) -> RolloutServer:
        if self.server is None:
            raise RuntimeError(self.problem or "no rollout engine")
        return self.server

    def push_adapter(self, member_id: int, version: int, adapter_state: Mapping[str, torch.Tensor]) -> bool:
        return self._server().push_adapter(member_id, version, adapter_state)

    def generate(self, member_id: int, prompts: list[list[int]], sampling: Sampling) -> Generation:
        return self._server().generate(member_id, prompts, sampling)

    def latest_version(self, member_id: int) -> int:
        return self._server().latest_version(member_id)

    def adapter_versions(self) -> dict[int, int]:
        return self._server().adapter_versions()

    def pid(self) -> int:
        return os.getpid()


class RemoteRolloutService:
    """A member's view of a :class:`RolloutWorker`: each call waits for the worker's answer.

    At most ``timeout_s`` (then ``GetTimeoutError``): a backstop, as for the archive actor's
    answers (:data:`popgrpo.runtime.actors.MEMBER_WAIT_S`); the driver takes a member that
    stalls as hung long before.
    """

    def __init__(self, handle: Any, timeout_s: float = 600.0) -> None:
        self.handle = handle
        self.timeout_s = timeout_s

    def push_adapter(self, member_id: int, version: int, adapter_state: Mapping[str, torch.Tensor]) -> bool:
        return ray.get(self.handle.push_adapter.remote(member_id, version, dict(adapter_state)), timeout=self.timeout_s)

    def generate(self, member_id: int, prompts: list[list[int]], sampling: Sampling) -> Generation:
        return ray.get(self.handle.generate.remote(member_id, prompts, sampling), timeout=self.timeout_s)

    def latest_version(self, member_id: int) -> int:
        return ray.get(self.handle.latest_version.remote(member_id), timeout=self.timeout_s)
