"""The vLLM rollout engine: one ``vllm.LLM`` with multi-LoRA serves every member of a population.

UNTESTED ON HARDWARE in this project so far: no session that wrote or reviewed it had a GPU,
and vLLM is not installed in the CPU test environment (it brings a CUDA build of torch). What
the CPU tests check is listed in docs/guides/lm.md ("GPU rollouts with vLLM"): the adapter
files it writes load in peft, the error without vLLM, and everything around the engine with
the ``hf`` engine in its place. ``benchmarks/vllm_rollout.py`` is what a GPU session runs first.

How it uses vLLM (``pip install 'popgrpo[vllm]'``, vLLM 0.10.2 or later):

* ``LLM(model, enable_lora=True, max_loras, max_lora_rank, logprobs_mode="processed_logprobs")``:
  one engine, the base model once; ``processed_logprobs`` makes the reported log-probs those
  of the distribution sampled from (after the temperature), which is what the trainer's
  log-probs are compared with (popgrpo.core.tis).
* Each adapter push is written to a temporary directory in peft's format
  (:func:`~popgrpo.policies.engines.write_peft_adapter`) and gets a ``LoRARequest`` with a
  fresh integer id: vLLM caches adapters by that id, so a new version must never reuse one.
* ``SamplingParams(n, temperature, max_tokens, seed, logprobs=0)``: top-k and top-p left at
  vLLM's defaults (off), ``logprobs=0`` returns the sampled token's log-prob only.

vLLM is imported when the engine is built, never at module import: the registry, the config
and the CPU tests import this module without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from popgrpo.policies.engines import EngineUnavailable, Generation, Sampling, write_peft_adapter

if TYPE_CHECKING:
    from popgrpo.config import CausalLMConfig

__all__ = ["MISSING_VLLM", "VLLMEngine", "lora_rank_slot", "vllm_engine"]

MISSING_VLLM = (
    "policy.causal_lm.rollout.engine=vllm needs vLLM, which is not installed here: "
    "pip install 'popgrpo[vllm]' on a machine with a CUDA GPU (or use engine=hf)"
)

# The ranks vLLM's LoRA kernels are built for (vllm.config.LoRAConfig checks max_lora_rank).
_VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(r: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds adapters of rank ``r``."""
    for rank in _VLLM_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"LoRA rank {r} exceeds vLLM's largest max_lora_rank {_VLLM_RANKS[-1]}")


def _import_vllm() -> tuple[Any, Any, Any]:
    """``(vllm.LLM, vllm.SamplingParams, vllm.lora.request.LoRARequest)``, or :class:`EngineUnavailable`."""
    try:
        import vllm  # pyright: ignore[reportMissingImports]  # the optional extra popgrpo[vllm]
        from vllm.lora.request import LoRARequest  # pyright: ignore[reportMissingImports]
    except ImportError:
        raise EngineUnavailable(MISSING_VLLM) from None
    return vllm.LLM, vllm.SamplingParams, LoRARequest


class VLLMEngine:
    """A :class:`~popgrpo.policies.engines.RolloutEngine` on one ``vllm.LLM`` (see the module docstring)."""

    def __init__(self, cfg: CausalLMConfig) -> None:
        llm_class, self._sampling_params, self._lora_request = _import_vllm()
        if cfg.model is None:
            raise ValueError("policy.causal_lm.model is required")
        self.cfg = cfg
        rollout = cfg.rollout
        if cfg.local_files_only:  # vLLM loads through huggingface_hub: no download, as for the trainers
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.llm = llm_class(
            model=cfg.model,
            dtype=cfg.dtype,
            trust_remote_code=cfg.trust_remote_code,
            enable_lora=True,
            max_loras=rollout.max_loras,
            max_lora_rank=lora_rank_slot(cfg.lora.r),
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
        )
        self._dir = Path(tempfile.mkdtemp(prefix="popgrpo-lora-"))
        self._requests: dict[int, Any] = {}  # member → its latest adapter's LoRARequest
        self._next_id = 1  # vLLM's adapter ids start at 1 and are never reused

    def load_adapter(self, member_id: int, version: int, adapter_state: Mapping[str, torch.Tensor]) -> None:
        name = f"member{member_id}-v{version}"
        path = write_peft_adapter(self._dir / name, adapter_state, self.cfg)
        old = self._requests.get(member_id)
        self._requests[member_id] = self._lora_request(name, self._next_id, str(path))
        self._next_id += 1
        if old is not None:  # vLLM evicts the old id from its caches in time; its files go now
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def generate(self, prompts: Sequence[Sequence[int]], adapter_id: int, sampling: Sampling) -> Generation:
        if adapter_id not in self._requests:
            raise KeyError(f"no adapter loaded for member {adapter_id}")
        params = self._sampling_params(
            n=sampling.n,
            temperature=sampling.temperature,
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            logprobs=0,
        )
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, params, lora_request=self._requests[adapter_id], use_tqdm=False)
        tokens: list[list[int]] = []
        logprobs: list[list[float]] = []
        for request in outputs:  # in the order of the prompts
            for completion in sorted(request.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                tokens.append(ids)
                logprobs.append([float(step[t].logprob) for step, t in zip(completion.logprobs, ids, strict=True)])
        return Generation(token_ids=tokens, logprobs=logprobs)

    def close(self) -> None:
        """Remove the adapter files."""
        shutil.rmtree(self._dir, ignore_errors=True)


def vllm_engine(cfg: CausalLMConfig, device: str | torch.device = "cuda") -> VLLMEngine:
    """``policy.causal_lm.rollout.engine=vllm`` (registered in ROLLOUT_ENGINES); vLLM places itself on the GPU."""
    del device
    return VLLMEngine(cfg)
