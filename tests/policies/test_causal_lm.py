"""The causal-LM policy: real save/load path, seeded LoRA adapters, sampling and token log-probs."""

import pytest
import torch

from popgrpo.policies.causal_lm import CausalLMPolicy, completion_mask
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")


def _policy(tiny_lm, seed=0, **lm):
    cfg = lm_config(tiny_lm).policy.causal_lm.model_copy(update=lm)
    return CausalLMPolicy(cfg, "cpu", torch.Generator().manual_seed(seed))


def test_state_dict_is_the_adapters_only_and_seeded(tiny_lm):
    a, b, c = _policy(tiny_lm, 0), _policy(tiny_lm, 0), _policy(tiny_lm, 1)
    sd = a.state_dict()
    assert sd and all("lora_A" in k or "lora_B" in k for k in sd)
    base = sum(p.numel() for p in a.model.parameters() if not p.requires_grad)
    assert sum(v.numel() for v in sd.values()) < base  # what the object store moves
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in sd.items())  # same seed, same adapters
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in sd.items() if "lora_A" in k)
    assert all(v.abs().sum() == 0 for k, v in sd.items() if "lora_B" in k)  # B = 0: starts as the base model
    assert [p.data_ptr() for p in a.parameters()] == [p.data_ptr() for _, p in a._adapters()]


def test_load_state_dict_round_trip_and_mismatch(tiny_lm):
    a, c = _policy(tiny_lm, 0), _policy(tiny_lm, 1)
    a.load_state_dict(c.state_dict())
    assert all(torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())
    broken = dict(c.state_dict())
    broken.pop(next(iter(broken)))
    with pytest.raises(KeyError, match="missing"):
        a.load_state_dict(broken)


def test_missing_model_names_the_field(tmp_path):
    cfg = lm_config(tmp_path / "nowhere").policy.causal_lm
    with pytest.raises(FileNotFoundError, match=r"policy\.causal_lm\.model"):
        CausalLMPolicy(cfg)


def test_completion_mask_runs_through_the_first_eos():
    completion = torch.tensor([[5, 6, 2, 0, 0], [5, 5, 5, 5, 5], [2, 7, 2, 0, 0]])
    mask = completion_mask(completion, eos_token_id=2)
    assert mask.long().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_rollout_is_seeded_and_shaped(tiny_lm):
    policy = _policy(tiny_lm)
    prompts = ["say a", "a much longer prompt here"]
    r1 = policy.rollout(prompts, 4, torch.Generator().manual_seed(7))
    r2 = policy.rollout(prompts, 4, torch.Generator().manual_seed(7))
    r3 = policy.rollout(prompts, 4, torch.Generator().manual_seed(8))
    assert r1.completions == r2.completions and r1.completions != r3.completions
    assert len(r1.completions) == 8 and r1.group_size == 4
    assert r1.completion_mask.shape == (8, r1.sequences.shape[1] - r1.prompt_length)
    assert int(r1.lengths.max()) <= 8 and int(r1.lengths.min()) >= 1
    # The decoded text is the masked tokens (character tokenizer: one character per non-special token).
    specials = torch.tensor(policy.tokenizer.all_special_ids)
    tokens = r1.sequences[:, r1.prompt_length :]
    for row, text in enumerate(r1.completions):
        kept = tokens[row][r1.completion_mask[row].bool()]
        assert len(text) == int((~torch.isin(kept, specials)).sum())


def test_token_log_probs_ignore_left_padding(tiny_lm):
    """A left-padded row's log-probs equal those of the same sequence computed alone."""
    policy = _policy(tiny_lm)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():  # non-zero adapters, so the LoRA path is exercised too
            p.normal_(0, 0.3)
    rollout = policy.rollout(["go", "a much longer prompt"], 2, torch.Generator().manual_seed(3))
    with torch.no_grad():
        logp, entropy = policy.token_log_probs(rollout, with_entropy=True)
        row = 0  # the short prompt: padded on the left
        attn = rollout.attention_mask[row].bool()
        alone = rollout.sequences[row][attn][None, :]
        logits = policy.model(input_ids=alone).logits[0].float() / policy.cfg.temperature
        n_prompt = int(rollout.attention_mask[row, : rollout.prompt_length].sum())
        n_tokens = int(rollout.completion_mask[row].sum())
        ref = torch.log_softmax(logits[n_prompt - 1 : n_prompt - 1 + n_tokens], -1)
        targets = alone[0, n_prompt : n_prompt + n_tokens]
        expected = ref.gather(-1, targets[:, None])[:, 0]
    assert torch.allclose(logp[row, :n_tokens], expected, atol=1e-5)
    assert (entropy >= 0).all() and (entropy <= torch.log(torch.tensor(float(logits.shape[-1]))) + 1e-4).all()


def test_reference_is_the_base_model(tiny_lm):
    policy = _policy(tiny_lm)
    rollout = policy.rollout(["say a"], 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(policy.token_log_probs(rollout)[0], policy.reference_log_probs(rollout))
        for name, p in policy._adapters():
            if "lora_B" in name:
                p.fill_(0.5)
        assert not torch.allclose(policy.token_log_probs(rollout)[0], policy.reference_log_probs(rollout))
