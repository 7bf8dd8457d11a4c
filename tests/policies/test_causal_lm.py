"""The causal-LM policy: real save/load path, seeded LoRA adapters, sampling and token log-probs."""

import pytest
import torch

from popgrpo.policies.causal_lm import CausalLMPolicy, completion_mask
from tests.lm import DEVICE, DTYPE, MERGED_AGREE, MERGED_ATOL, lm_config
from tests.services import require_module

require_module("peft")


def _policy(tiny_lm, seed=0, **lm):
    cfg = lm_config(tiny_lm).policy.causal_lm.model_copy(update={"dtype": DTYPE, **lm})
    return CausalLMPolicy(cfg, DEVICE, torch.Generator().manual_seed(seed))


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
    specials = torch.tensor(policy.tokenizer.all_special_ids, device=r1.sequences.device)
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


def _merged_and_plain_logits(policy, rollout):
    """The merged copy's and the peft model's logits over ``rollout`` (after a refresh)."""
    policy.merged.refresh()
    positions = (rollout.attention_mask.long().cumsum(1) - 1).clamp_min(0)
    inputs = {"input_ids": rollout.sequences, "attention_mask": rollout.attention_mask, "position_ids": positions}
    with torch.no_grad():
        return policy.merged.model(**inputs).logits, policy.model(**inputs).logits


def test_merged_generation_samples_from_the_adapted_model(tiny_lm):
    """The merged copy computes the peft model's function, follows every change of the
    adapters (an optimiser step writes them in place, a merge loads them), and shares every
    weight but the adapted layers' own."""
    plain, merged = _policy(tiny_lm), _policy(tiny_lm, merged_generation=True)
    assert plain.merged is None and merged.merged is not None
    assert len(merged.merged.layers) > 0
    own = {p.data_ptr() for p in merged.model.parameters()}
    copied = {target.weight.data_ptr() for target, _ in merged.merged.layers}
    for p in merged.merged.model.parameters():
        assert (p.data_ptr() in copied) != (
            p.data_ptr() in own
        )  # a copied adapted weight, or the peft model's own tensor
    generator = torch.Generator().manual_seed(5)
    for update in range(3):
        with torch.no_grad():  # in place, as the optimiser does: different adapters each time
            for p in merged.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        rollout = merged.rollout(["say a", "a much longer prompt"], 3, torch.Generator().manual_seed(update))
        copy_logits, peft_logits = _merged_and_plain_logits(merged, rollout)
        if DTYPE == "float32":  # bfloat16: only the comparison below (tests/lm.py, MERGED_ATOL)
            assert torch.allclose(copy_logits, peft_logits, atol=MERGED_ATOL), update
        assert (copy_logits - peft_logits).abs().max() < (
            peft_logits - plain.model(input_ids=rollout.sequences).logits
        ).abs().max()
    merged.load_state_dict(plain.state_dict())  # B = 0 again: the copy is the base model
    rollout = merged.rollout(["say a"], 2, torch.Generator().manual_seed(9))
    copy_logits, peft_logits = _merged_and_plain_logits(merged, rollout)
    assert torch.allclose(copy_logits, peft_logits, atol=1e-5)
    with torch.no_grad(), merged.model.disable_adapter():
        positions = (rollout.attention_mask.long().cumsum(1) - 1).clamp_min(0)
        base = merged.model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask, position_ids=positions)
    assert torch.allclose(copy_logits, base.logits, atol=1e-5)


def test_merged_generation_rollouts_match_the_unmerged_ones(tiny_lm):
    """Seeded like the unmerged policy, and the same samples wherever the two models' float
    rounding does not move a draw across a token boundary (every row of these seeds)."""
    plain, merged = _policy(tiny_lm), _policy(tiny_lm, merged_generation=True)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    merged.load_state_dict(plain.state_dict())
    prompts = ["say a", "a much longer prompt here"]
    agree = 0
    for seed in range(5):
        a = plain.rollout(prompts, 4, torch.Generator().manual_seed(seed))
        b = merged.rollout(prompts, 4, torch.Generator().manual_seed(seed))
        agree += sum(x == y for x, y in zip(a.completions, b.completions, strict=True))
    assert agree >= MERGED_AGREE  # of 40 rows: rounding rarely moves a draw (tests/lm.py)
