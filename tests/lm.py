"""A language-model run config for tests: the tiny causal LM and a verifiable synthetic reward."""

from __future__ import annotations

import copy
import os

from popgrpo.config import Config

TARGET_FRACTION = "popgrpo.envs.rewards:target_fraction"

DEVICE = os.environ.get("POPGRPO_TEST_DEVICE", "cpu")
"""Where the policy tests (``tests/policies``) put the model: ``cpu`` unless
``POPGRPO_TEST_DEVICE`` names another torch device (``cuda`` on a GPU machine), with the same
assertions; in float32 on either (``policy.causal_lm.dtype=auto`` would pick bfloat16 on CUDA)."""
DTYPE = "float32"


def lm_config(model_dir, **sections) -> Config:
    """Two members, 8 completions of 2 prompts per step, reward = share of the letter ``a``."""
    data = {
        "run": {"epochs": 4, "seed": 0},
        "env": {
            "kind": "text",
            "text": {
                "prompts": ["say a", "write", "go on"],
                "rewards": [{"fn": TARGET_FRACTION, "kwargs": {"target": "a"}}],
            },
        },
        "policy": {
            "kind": "causal_lm",
            "causal_lm": {"model": str(model_dir), "max_new_tokens": 8, "prompts_per_step": 2, "lora": {"r": 4}},
        },
        "grpo": {"group_size": 8, "steps_per_epoch": 5, "lr": 0.03, "kl_coef": 0.0},
        "population": {"size": 2},
        "eval": {"merged": False, "k": 4, "samples": 8},  # the driver's evaluation: its own test
    }
    for section, values in sections.items():
        merged = copy.deepcopy(data.get(section, {}))
        merged.update(values)
        data[section] = merged
    return Config.model_validate(data)
