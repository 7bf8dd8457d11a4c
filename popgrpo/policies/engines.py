"""Rollout engines: what generates a language-model member's completions.

A member with ``policy.causal_lm.rollout.engine=hf`` (the default) and no rollout worker
generates with its own model (:meth:`~popgrpo.policies.causal_lm.CausalLMPolicy.rollout`) and
needs nothing here. With a rollout worker (``policy.causal_lm.rollout.worker``, always for
engines other than ``hf``) one :class:`RolloutEngine` serves the whole population: it holds the
base model once and one LoRA adapter per member, each pushed by its member
(:meth:`RolloutEngine.load_adapter`) whenever the member's weights changed, and generates for a
member with that member's adapter (:meth:`RolloutEngine.generate`).

An engine answers with the sampled token ids and its own log-probs of them. The trainer
computes its own log-probs anyway (an engine's differ: other kernels and precision), and
the loss weights each token by truncated importance sampling (:mod:`popgrpo.core.tis`).

Engines are named in :data:`popgrpo.registry.ROLLOUT_ENGINES`: ``hf`` (:class:`HFEngine`, CPU
or GPU, the one the tests run) and ``vllm`` (:mod:`popgrpo.policies.vllm_engine`). A plugin
registers a factory ``(cfg: CausalLMConfig, device: torch.device) -> RolloutEngine``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from popgrpo.config import ConfigError

if TYPE_CHECKING:
    from popgrpo.config import CausalLMConfig
    from popgrpo.policies.causal_lm import CausalLMPolicy

__all__ = [
    "EngineUnavailable",
    "Generation",
    "HFEngine",
    "RolloutEngine",
    "Sampling",
    "hf_engine",
    "left_pad",
    "lora_target_modules",
    "write_peft_adapter",
]


class EngineUnavailable(ConfigError):
    """The configured rollout engine cannot run here (its package is not installed); one line."""


@dataclass(frozen=True)
class Sampling:
    """How to sample: ``n`` completions of each prompt at ``temperature`` (no top-k, no top-p),
    at most ``max_new_tokens`` each, from the random stream ``seed``."""

    n: int
    temperature: float
    max_new_tokens: int
    seed: int


@dataclass(frozen=True)
class Generation:
    """An engine's answer for ``P`` prompts × ``n``: ``N = P·n`` rows, prompt-major.

    ``token_ids[i]`` are completion ``i``'s tokens, up to and including its end-of-sequence
    token when it has one; ``logprobs[i]`` the engine's log-probability of each (same length),
    at the sampling temperature.
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]


class RolloutEngine(Protocol):
    """One base model, one LoRA adapter per member, generation with a member's adapter."""

    def load_adapter(self, member_id: int, version: int, adapter_state: Mapping[str, torch.Tensor]) -> None:
        """Make ``adapter_state`` (the member's adapter weights, peft names, as
        :meth:`~popgrpo.policies.causal_lm.CausalLMPolicy.state_dict` gives them) the adapter
        that :meth:`generate` uses for ``member_id`` from now on; ``version`` numbers it."""
        ...

    def generate(self, prompts: Sequence[Sequence[int]], adapter_id: int, sampling: Sampling) -> Generation:
        """``sampling.n`` completions of each prompt (token ids, not padded) with the adapter
        loaded for member ``adapter_id``."""
        ...


def left_pad(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows → ``[R, L]`` left-padded ids and their attention mask (as the tokenizer pads prompts)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
            attention[i, width - len(row) :] = 1
    return ids, attention


class HFEngine:
    """Hugging Face ``generate`` with one member's adapter at a time (the adapters swap in place).

    The CPU engine of the rollout worker, and the one its tests run: for the same adapter,
    prompt rows and seed it samples exactly the tokens the member's own
    :meth:`~popgrpo.policies.causal_lm.CausalLMPolicy.rollout` samples in the same process
    (the same model, ``generate`` call and seeded RNG). Its log-probs come from the logits
    ``generate`` sampled from (computed incrementally with the KV cache), not from the
    trainer's full forward pass.
    """

    def __init__(self, cfg: CausalLMConfig, device: str | torch.device = "cpu") -> None:
        from popgrpo.policies.causal_lm import CausalLMPolicy

        self.cfg = cfg
        self.policy: CausalLMPolicy = CausalLMPolicy(cfg, device)  # adapters: each member's, loaded before use
        self.adapters: dict[int, dict[str, torch.Tensor]] = {}
        self.active: int | None = None  # the member whose adapter the model holds now

    def load_adapter(self, member_id: int, version: int, adapter_state: Mapping[str, torch.Tensor]) -> None:
        del version  # this engine keeps one adapter per member; the worker orders the versions
        self.adapters[member_id] = {k: v.detach().to("cpu", copy=True) for k, v in adapter_state.items()}
        if self.active == member_id:
            self.active = None

    def generate(self, prompts: Sequence[Sequence[int]], adapter_id: int, sampling: Sampling) -> Generation:
        from popgrpo.policies.causal_lm import completion_mask

        if adapter_id not in self.adapters:
            raise KeyError(f"no adapter loaded for member {adapter_id}")
        if (sampling.temperature, sampling.max_new_tokens) != (self.cfg.temperature, self.cfg.max_new_tokens):
            raise ValueError(
                "the hf engine samples at its config's temperature and max_new_tokens "
                f"({self.cfg.temperature}, {self.cfg.max_new_tokens}), asked for "
                f"({sampling.temperature}, {sampling.max_new_tokens})"
            )
        if self.active != adapter_id:
            self.policy.load_state_dict(self.adapters[adapter_id])
            self.active = adapter_id
        tok = self.policy.tokenizer
        input_ids, attention = left_pad(prompts, tok.pad_token_id)
        device = self.policy.device
        input_ids = input_ids.repeat_interleave(sampling.n, dim=0).to(device)
        attention = attention.repeat_interleave(sampling.n, dim=0).to(device)
        completion, logp = self.policy.generate_tokens(input_ids, attention, sampling.seed, with_log_probs=True)
        assert logp is not None  # with_log_probs=True always computes them
        lengths = completion_mask(completion, tok.eos_token_id).sum(dim=1).tolist()
        tokens, values = completion.cpu().tolist(), logp.cpu().tolist()
        return Generation(
            token_ids=[row[:n] for row, n in zip(tokens, lengths, strict=True)],
            logprobs=[row[:n] for row, n in zip(values, lengths, strict=True)],
        )


def hf_engine(cfg: CausalLMConfig, device: str | torch.device = "cpu") -> HFEngine:
    """``policy.causal_lm.rollout.engine=hf``: the :class:`HFEngine` (registered in ROLLOUT_ENGINES)."""
    return HFEngine(cfg, device)


def lora_target_modules(adapter_state: Mapping[str, torch.Tensor]) -> list[str]:
    """The module names (``q_proj``, ...) that carry adapters, read off peft's weight names
    (``...layers.0.self_attn.q_proj.lora_A.weight``): what ``adapter_config.json`` lists."""
    names = {key.split(".lora_A.")[0].rsplit(".", 1)[-1] for key in adapter_state if ".lora_A." in key}
    if not names:
        raise ValueError("no LoRA weights (…lora_A…) in the adapter state")
    return sorted(names)


def write_peft_adapter(directory: str | Path, adapter_state: Mapping[str, torch.Tensor], cfg: CausalLMConfig) -> Path:
    """Write an adapter as peft's ``save_pretrained`` does (``adapter_config.json`` and
    ``adapter_model.safetensors``) into ``directory``: the format vLLM's ``LoRARequest`` loads.

    The target modules are named explicitly (:func:`lora_target_modules`), not ``all-linear``,
    which only peft resolves.
    """
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": cfg.model,
        "r": cfg.lora.r,
        "lora_alpha": cfg.lora.alpha,
        "lora_dropout": cfg.lora.dropout,
        "target_modules": lora_target_modules(adapter_state),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in adapter_state.items()}
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out
