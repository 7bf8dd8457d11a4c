"""A language-model run config for tests: the tiny causal LM and a verifiable synthetic reward."""

from __future__ import annotations

import copy
import os

from popgrpo.config import Config

TARGET_FRACTION = "popgrpo.envs.rewards:target_fraction"

DEVICE = os.environ.get("POPGRPO_TEST_DEVICE", "cpu")
"""Where the policy tests (``tests/policies``) put the model: ``cpu`` unless
``POPGRPO_TEST_DEVICE`` names another torch device (``cuda`` on a GPU machine), with the same
assertions; in float32 on either unless ``POPGRPO_TEST_DTYPE`` names another
``policy.causal_lm.dtype`` (``bfloat16``: what ``auto`` picks on CUDA)."""
DTYPE = os.environ.get("POPGRPO_TEST_DTYPE", "float32")
LOGP_ATOL = 1e-4 if DTYPE == "float32" else 1e-2
"""How far a generation's log-probs (key-value cache, token by token) may be from a full forward
pass's of the same model: float32 rounding, or bfloat16's (6e-4 nats measured on an H200)."""
MERGED_ATOL = 1e-4 if DTYPE == "float32" else 0.5
"""How far a merged copy's logits and log-probs (``merged_generation``: each adapted weight
``W + B·A`` held in ``DTYPE``) may be from the peft model's (``W·x + B·A·x``, the adapters in
float32): float32 rounding. In bfloat16 the 2⁻⁸ relative rounding of every merged weight,
carried through the tiny model's layers, moved the engine test's log-probs by up to 0.23 nats
on CPU (the sampled tokens were the same) and, with the large random adapters of
``test_merged_generation_samples_from_the_adapted_model``, the logits by up to 1.5 where the
adapters moved them by 5.7: there only "closer to the peft model than the base is" is asserted.
A sampler–trainer mismatch that a bfloat16 run with ``merged_generation`` has."""
MERGED_AGREE = 38 if DTYPE == "float32" else 34
"""Of 40 seeded rows, how many the merged copy samples exactly as the peft model does: rounding
rarely moves a draw across a token boundary in float32; in bfloat16 on an H200 37 of 40 agreed."""


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
