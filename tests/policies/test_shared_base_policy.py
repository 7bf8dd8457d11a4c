"""Adapters on one shared base model against the same adapters each on a model of its own.

``POPGRPO_TEST_DEVICE`` / ``POPGRPO_TEST_DTYPE`` (tests/lm.py) run it on a GPU and in bfloat16
too. In float32 the mixed batch samples exactly the tokens each member samples alone here, and
its log-probs, entropies and adapter gradients agree within float rounding; in bfloat16 a
batch of four members' rows rounds differently from one member's, so a draw near a boundary
between two tokens can differ (SAMPLE_AGREE of the rows must match), log-probs and entropies
agree on average (MEAN_ATOL), and each member's gradient points where its gradient alone does
(MIN_COSINE).
"""

from __future__ import annotations

import pytest
import torch

from popgrpo.policies.causal_lm import CausalLMPolicy, build_shaped_causal_lm, completion_mask
from popgrpo.policies.shared_base import MixedBatch, SharedBase, adapter_name
from tests.lm import DEVICE, DTYPE, lm_config
from tests.services import require_module

require_module("peft")

M = 4
FLOAT32 = DTYPE == "float32"
# Log-probs and entropies, a batch of 4 members' rows against one member's. On the CPU they came
# out equal in both dtypes; on CUDA a batch's reductions may round differently from one member's
# (3e-4 in a gradient on an H200 in float32), which bfloat16 magnifies for single unlikely
# tokens (up to 0.94 nats on an H200 with peft's own mixed-adapter path), so in bfloat16 the
# mean difference is compared.
ATOL = 1e-5 if FLOAT32 else None
MEAN_ATOL = 1e-6 if FLOAT32 else 0.05
MIN_COSINE = 0.9999 if FLOAT32 else 0.5  # each member's whole adapter gradient, shared against alone
SAMPLE_AGREE = 1.0 if FLOAT32 else 0.75  # share of completions sampled exactly as alone


def _cfg(tiny_lm):
    return lm_config(tiny_lm).policy.causal_lm.model_copy(update={"dtype": DTYPE, "max_new_tokens": 12})


def test_adapters_on_a_shared_base_compute_what_separate_models_do(tiny_lm):
    cfg = _cfg(tiny_lm)
    separate = [CausalLMPolicy(cfg, DEVICE, torch.Generator().manual_seed(10 + k)) for k in range(M)]
    base = SharedBase(cfg, range(M), DEVICE)
    shared = [base.member_policy(k, torch.Generator().manual_seed(10 + k)) for k in range(M)]
    for a, b in zip(separate, shared, strict=True):  # the seeded init, under the same keys
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # Adapters far from their init (B != 0), loaded into both sides: a delta every row feels.
    g = torch.Generator().manual_seed(0)
    for a, b in zip(separate, shared, strict=True):
        state = {k: torch.randn(v.shape, generator=g) * 0.3 for k, v in a.state_dict().items()}
        a.load_state_dict(state)
        b.load_state_dict(state)
    assert not torch.equal(next(iter(shared[0].state_dict().values())), next(iter(shared[1].state_dict().values())))

    prompts = [["say a", "go on"], ["write", "a"], ["go on", "write"], ["a b", "say a"]]
    seeds = [11, 22, 33, 44]
    mixed = base.mixed_rollouts(shared, prompts, 3, seeds)
    alone = []
    for policy, ps, seed in zip(separate, prompts, seeds, strict=True):
        ids, att = policy.encode(ps)
        ids, att = ids.repeat_interleave(3, 0).to(policy.device), att.repeat_interleave(3, 0).to(policy.device)
        completion, _ = policy.generate_tokens(ids, att, seed)
        mask = completion_mask(completion, policy.tokenizer.eos_token_id)
        alone.append(policy.rollout_of(ps, ids, att, completion, mask, 3))
    same = [
        x == y for a, b in zip(alone, mixed, strict=True) for x, y in zip(a.completions, b.completions, strict=True)
    ]
    assert sum(same) >= SAMPLE_AGREE * len(same), f"{sum(same)} of {len(same)} completions sampled as alone"
    assert len({tuple(r.completions) for r in mixed}) == M  # the members' adapters do differ

    # Log-probs, entropies and gradients on the same sequences (the separate members' own).
    batch = MixedBatch.of(shared, alone)
    together = base.mixed_log_probs(batch, with_entropy=True)
    with torch.no_grad():
        reference = base.mixed_log_probs(batch, reference=True)
    sum(lp.float().sum() for lp, _ in together).backward()
    own, alone_grads = [], []
    for k, (policy, rollout) in enumerate(zip(separate, alone, strict=True)):
        logp, entropy = policy.token_log_probs(rollout, with_entropy=True)
        for ours, theirs in (
            (together[k][0], logp),
            (together[k][1], entropy),
            (reference[k][0], policy.reference_log_probs(rollout)),
        ):
            assert theirs is not None
            difference = (ours.detach().float() - theirs.detach().float()).abs()
            assert float(difference.mean()) <= MEAN_ATOL, float(difference.mean())
            if ATOL is not None:
                assert float(difference.max()) <= ATOL, float(difference.max())
        logp.float().sum().backward()
        pairs = list(zip(policy._adapters(), shared[k]._adapters(), strict=True))
        for (n, p), (n_shared, p_shared) in pairs:
            assert n.replace(".default.", f".{adapter_name(k)}.") == n_shared
            assert p.grad is not None and p_shared.grad is not None
            if FLOAT32:
                torch.testing.assert_close(p_shared.grad, p.grad, atol=1e-3, rtol=1e-3)
        own.append(torch.cat([q.grad.float().reshape(-1) for _, (_, q) in pairs if q.grad is not None]))
        alone_grads.append(torch.cat([p.grad.float().reshape(-1) for (_, p), _ in pairs if p.grad is not None]))
    # Each member's gradient is its own: closest in direction to what the member gets alone, not
    # to another member's (in bfloat16 the gradients themselves are too rounded to compare entry by entry).
    cosine = torch.nn.functional.cosine_similarity(torch.stack(own)[:, None], torch.stack(alone_grads)[None], dim=-1)
    assert torch.equal(cosine.argmax(dim=1), torch.arange(M)), cosine
    assert bool((cosine.diagonal() > MIN_COSINE).all()), cosine


def test_a_member_loads_only_its_own_adapter(tiny_lm):
    base = SharedBase(_cfg(tiny_lm), [1, 11], DEVICE)  # 1 and 11: one name must not catch the other's keys
    one, eleven = base.member_policy(1), base.member_policy(11)
    before = eleven.state_dict()
    one.load_state_dict({k: torch.full_like(v, 0.5) for k, v in one.state_dict().items()})
    assert all(torch.equal(before[k], v) for k, v in eleven.state_dict().items())
    assert all(bool((v == 0.5).all()) for v in one.state_dict().values())
    with pytest.raises(KeyError, match="no adapter"):
        base.member_policy(2)


def test_a_real_architecture_shape_loads_and_generates_fixed_lengths(tmp_path):
    """`popgrpo lm init --shape`: the shape's model class and vocabulary, shrunk in depth and width here."""
    out = build_shaped_causal_lm(
        "qwen2.5-0.5b",
        tmp_path / "q",
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    cfg = lm_config(out).policy.causal_lm.model_copy(update={"max_new_tokens": 6, "min_new_tokens": 6})
    policy = CausalLMPolicy(cfg, "cpu", torch.Generator().manual_seed(0))
    assert type(policy.model.base_model.model).__name__ == "Qwen2ForCausalLM"
    assert policy.model.config.vocab_size == 151936 and len(policy.tokenizer) == 151936
    assert policy.tokenizer.decode(policy.tokenizer("x = 1").input_ids) == "x = 1"
    rollout = policy.rollout(["x = 1"], 4, torch.Generator().manual_seed(1))
    assert rollout.completion_mask.shape == (4, 6) and bool(rollout.completion_mask.all())


def test_members_that_cannot_fit_fail_before_the_model_loads(tiny_lm, monkeypatch):
    """The estimate from the model's own sizes, against the memory free now: a base whose members'
    steps cannot fit is refused with one line that says what they need, before anything loads."""
    import popgrpo.policies.shared_base as shared_base

    cfg = _cfg(tiny_lm)
    estimate = shared_base.estimate_memory(cfg, 4, 8, torch.device("cpu"))
    assert estimate is not None and estimate.weights > 0 and estimate.at_least <= estimate.at_most
    assert shared_base.estimate_memory(cfg, 8, 8, torch.device("cpu")).at_least > estimate.at_least
    monkeypatch.setattr(shared_base, "_available_bytes", lambda device: estimate.at_least - 1)
    loaded = []
    monkeypatch.setattr(shared_base, "load_base", lambda *a: loaded.append(a))
    with pytest.raises(MemoryError, match=r"4 members on one base need at least .* GiB .* lower population") as error:
        SharedBase(cfg, range(4), "cpu", group_size=8)
    assert "\n" not in str(error.value) and not loaded
