"""Rollout engines on CPU: the hf engine samples what the member's own generate samples; the
vLLM engine's adapter files load in peft, and without vLLM it says so in one line."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from popgrpo.config import CausalLMConfig
from popgrpo.policies.causal_lm import CausalLMPolicy
from popgrpo.policies.engines import (
    EngineUnavailable,
    HFEngine,
    Sampling,
    left_pad,
    lora_target_modules,
    write_peft_adapter,
)
from popgrpo.policies.vllm_engine import MISSING_VLLM, lora_rank_slot, vllm_engine
from tests.lm import DEVICE, DTYPE, LOGP_ATOL, MERGED_ATOL
from tests.services import require_module

require_module("peft")


def _cfg(model_dir, **kw):
    return CausalLMConfig(model=str(model_dir), max_new_tokens=8, lora={"r": 4}, dtype=DTYPE, **kw)


def _trained_adapter(policy, seed):
    """Adapters far from their start (B ≠ 0), so that two members' completions differ."""
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.5 for k, v in policy.state_dict().items()}


def test_left_pad_matches_the_tokenizers_padding(tiny_lm):
    policy = CausalLMPolicy(_cfg(tiny_lm))
    ids, attention = policy.encode(["say a", "go", "write more"])
    rows = [i[m.bool()].tolist() for i, m in zip(ids, attention, strict=True)]
    padded, mask = left_pad(rows, policy.tokenizer.pad_token_id)
    assert torch.equal(padded, ids) and torch.equal(mask, attention)


@pytest.mark.parametrize("merged", [False, True], ids=["peft", "merged_generation"])
def test_hf_engine_samples_the_tokens_of_the_members_own_generate(tiny_lm, merged):
    cfg = _cfg(tiny_lm, merged_generation=merged)
    member = CausalLMPolicy(cfg, DEVICE, generator=torch.Generator().manual_seed(1))
    member.load_state_dict(_trained_adapter(member, 0))
    engine = HFEngine(cfg, DEVICE)
    engine.load_adapter(7, 1, member.state_dict())
    prompts = ["say a", "write"]
    own = member.rollout(prompts, 4, torch.Generator().manual_seed(5))
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(5)))
    ids, attention = member.encode(prompts)
    rows = [i[m.bool()].tolist() for i, m in zip(ids, attention, strict=True)]
    out = engine.generate(rows, 7, Sampling(n=4, temperature=1.0, max_new_tokens=8, seed=seed))
    tokens = own.sequences[:, own.prompt_length :]
    assert out.token_ids == [row[m.bool()].tolist() for row, m in zip(tokens, own.completion_mask, strict=True)]
    # Its log-probs are those of the tokens it sampled: close to the trainer's full forward pass.
    logp = member.token_log_probs(own)[0].cpu()
    for i, values in enumerate(out.logprobs):
        assert torch.allclose(torch.tensor(values), logp[i, : len(values)], atol=MERGED_ATOL if merged else LOGP_ATOL)


@pytest.mark.parametrize("merged", [False, True], ids=["peft", "merged_generation"])
def test_hf_engine_generates_with_each_members_own_adapter(tiny_lm, merged):
    cfg = _cfg(tiny_lm, merged_generation=merged)
    engine = HFEngine(cfg, DEVICE)
    engine.load_adapter(0, 1, _trained_adapter(engine.policy, 0))
    engine.load_adapter(1, 1, _trained_adapter(engine.policy, 1))
    sampling = Sampling(n=8, temperature=1.0, max_new_tokens=8, seed=3)
    rows = [[4, 5, 6]]
    a, b, a_again = (
        engine.generate(rows, 0, sampling),
        engine.generate(rows, 1, sampling),
        engine.generate(rows, 0, sampling),
    )
    assert a.token_ids != b.token_ids  # same seed, other adapter
    assert a_again == a  # swapping back restores member 0's adapter exactly
    with pytest.raises(KeyError, match="member 2"):
        engine.generate(rows, 2, sampling)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(rows, 0, Sampling(n=1, temperature=0.5, max_new_tokens=8, seed=0))


def test_written_adapter_is_peft_format_and_loads_back_equal(tiny_lm, tmp_path):
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    cfg = _cfg(tiny_lm)
    policy = CausalLMPolicy(cfg)
    state = _trained_adapter(policy, 2)
    out = write_peft_adapter(tmp_path / "adapter", state, cfg)
    written = json.loads((out / "adapter_config.json").read_text())
    assert written["r"] == 4 and written["lora_alpha"] == 16.0 and written["peft_type"] == "LORA"
    assert written["target_modules"] == lora_target_modules(state)
    assert {"q_proj", "v_proj", "down_proj"} <= set(written["target_modules"])
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_lm), out)
    back = get_peft_model_state_dict(loaded)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_lora_rank_slot_is_the_smallest_vllm_rank_that_fits():
    assert [lora_rank_slot(r) for r in (1, 8, 9, 64, 300, 512)] == [8, 8, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="exceeds"):
        lora_rank_slot(513)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_is_a_one_line_config_error(tiny_lm):
    with pytest.raises(EngineUnavailable) as info:
        vllm_engine(_cfg(tiny_lm, rollout={"engine": "vllm"}))
    assert str(info.value) == MISSING_VLLM and "\n" not in MISSING_VLLM and "popgrpo[vllm]" in MISSING_VLLM


class _FakeVLLM:
    """A stand-in for the ``vllm`` package with the calls the engine makes, as vLLM documents
    them: it checks what popgrpo does with them (adapter files and ids, the shape of the answer),
    not vLLM itself, which no test here runs."""

    def __init__(self):
        self.llm_kwargs, self.requests, self.calls = None, [], []
        fake = self

        class LLM:
            def __init__(self, **kwargs):
                fake.llm_kwargs = kwargs

            def generate(self, prompts, params, lora_request=None, use_tqdm=True):
                fake.calls.append((prompts, params, lora_request))
                return [_request(i, params.kwargs["n"]) for i, _ in enumerate(prompts)]

        class SamplingParams:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

        class LoRARequest:
            def __init__(self, lora_name, lora_int_id, lora_path):
                self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path
                fake.requests.append(self)

        self.LLM, self.SamplingParams, self.LoRARequest = LLM, SamplingParams, LoRARequest


def _request(i, n):
    from types import SimpleNamespace as NS

    def completion(j):  # completion j of prompt i: j + 1 tokens; answered in reverse order
        ids = [10 * i + j + t for t in range(j + 1)]
        return NS(index=j, token_ids=ids, logprobs=[{t: NS(logprob=-t / 10)} for t in ids])

    return NS(outputs=[completion(j) for j in reversed(range(n))])


def test_vllm_engine_writes_each_version_with_a_fresh_adapter_id_and_answers_prompt_major(tiny_lm, monkeypatch):
    import sys
    from types import ModuleType

    from popgrpo.policies.vllm_engine import VLLMEngine

    fake = _FakeVLLM()
    vllm_module, lora_module, request_module = (
        ModuleType("vllm"),
        ModuleType("vllm.lora"),
        ModuleType("vllm.lora.request"),
    )
    vllm_module.LLM, vllm_module.SamplingParams = fake.LLM, fake.SamplingParams  # type: ignore[attr-defined]
    request_module.LoRARequest = fake.LoRARequest  # type: ignore[attr-defined]
    for name, module in (("vllm", vllm_module), ("vllm.lora", lora_module), ("vllm.lora.request", request_module)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = _cfg(tiny_lm, rollout={"engine": "vllm", "max_loras": 3})
    engine = VLLMEngine(cfg)
    kw = fake.llm_kwargs
    assert kw["enable_lora"] and kw["max_loras"] == 3 and kw["max_lora_rank"] == 8
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["model"] == str(tiny_lm)
    state = _trained_adapter(CausalLMPolicy(cfg), 0)
    engine.load_adapter(0, 1, state)
    engine.load_adapter(1, 1, state)
    first = fake.requests[0].lora_path
    engine.load_adapter(0, 2, state)  # a new version: new id, new files, the old ones gone
    assert [r.lora_int_id for r in fake.requests] == [1, 2, 3]
    assert (
        not Path(first).exists()
        and json.loads((Path(fake.requests[2].lora_path) / "adapter_config.json").read_text())["r"] == 4
    )
    out = engine.generate([[4, 5], [6]], 0, Sampling(n=2, temperature=0.7, max_new_tokens=8, seed=11))
    prompts, params, lora = fake.calls[-1]
    assert prompts == [{"prompt_token_ids": [4, 5]}, {"prompt_token_ids": [6]}] and lora is fake.requests[2]
    assert params.kwargs == {"n": 2, "temperature": 0.7, "max_tokens": 8, "seed": 11, "logprobs": 0}
    assert out.token_ids == [[0], [1, 2], [10], [11, 12]]  # prompt-major, completions in index order
    assert out.logprobs == [[-0.0], [-0.1, -0.2], [-1.0], [-1.1, -1.2]]
    with pytest.raises(KeyError, match="member 5"):
        engine.generate([[4]], 5, Sampling(n=1, temperature=1.0, max_new_tokens=8, seed=0))
    engine.close()
