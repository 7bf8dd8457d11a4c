"""vLLM multi-LoRA against Hugging Face ``generate``: rollout tokens/s for a population of adapters.

NOT RUN YET: written in a session without a GPU. It needs a CUDA machine with
``pip install "popgrpo[vllm]"``; nothing in BENCHMARKS.md or the docs comes from it so far.

``python -m benchmarks.vllm_rollout --model DIR [--members 4] [--group-size 16] [--rounds 3] [--out DIR]``

Both sides generate for ``members`` LoRA adapters (seeded random values, rank
``--lora-rank`` on all linear layers, as popgrpo's members have) over the same base model,
the same prompts, ``--group-size`` completions each, at most ``--max-new-tokens`` tokens,
temperature 1 without top-k / top-p:

* **hf**: :class:`popgrpo.policies.engines.HFEngine` on the GPU, one member after another
  (the adapter swapped in place), as the rollout worker with ``engine: hf`` runs it.
* **vllm**: :class:`popgrpo.policies.vllm_engine.VLLMEngine` (one ``vllm.LLM``,
  ``enable_lora``), one member after another, as the rollout worker with ``engine: vllm``
  runs it.

Rounds alternate (hf, vllm, hf, vllm, …) after one untimed warm-up round each. Tokens/s
counts the completion tokens each engine returned (up to and including the end-of-sequence
token). It also reports how far vLLM's log-probs are from the trainer's own (the
Hugging Face model's full forward pass on vLLM's completions): the mean and the largest
``|Δ|`` per token and the share of tokens whose TIS weight ``min(exp(Δ), 2)`` is capped,
what :mod:`popgrpo.core.tis` corrects for. Writes ``vllm_rollout.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from popgrpo.algorithms.engine_rollouts import completion_tensors
from popgrpo.config import CausalLMConfig
from popgrpo.policies.causal_lm import CausalLMPolicy
from popgrpo.policies.engines import Generation, HFEngine, RolloutEngine, Sampling

PROMPTS = ["# arithmetic\n", "# loop\n", "# function\n", "# list\n", "# while\n", "# branch\n"]


def _adapters(policy: CausalLMPolicy, members: int) -> list[dict[str, torch.Tensor]]:
    """Seeded adapters far from their start (``B ≠ 0``): each member's completions differ."""
    out = []
    for k in range(members):
        g = torch.Generator().manual_seed(1000 + k)
        out.append({n: torch.randn(v.shape, generator=g) * 0.05 for n, v in policy.state_dict().items()})
    return out


def _round(
    engine: RolloutEngine, rows: list[list[int]], members: int, sampling: Sampling
) -> tuple[float, int, list[Generation]]:
    start = time.perf_counter()
    answers = [engine.generate(rows, k, sampling) for k in range(members)]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return seconds, sum(len(t) for a in answers for t in a.token_ids), answers


def _logp_gap(
    policy: CausalLMPolicy, adapter: dict[str, torch.Tensor], prompts: list[str], answer: Generation, n: int
) -> dict[str, float]:
    """vLLM's log-probs against the trainer's full forward pass on the same completions."""
    policy.load_state_dict(adapter)
    input_ids, attention = policy.encode(prompts)
    completion, mask, engine_logp = completion_tensors(answer, policy.pad_token_id)
    rollout = policy.rollout_of(
        prompts,
        input_ids.repeat_interleave(n, dim=0).to(policy.device),
        attention.repeat_interleave(n, dim=0).to(policy.device),
        completion.to(policy.device),
        mask.to(policy.device),
        n,
    )
    with torch.no_grad():
        trainer = policy.token_log_probs(rollout)[0].float().cpu()
    delta = (trainer - engine_logp)[mask]
    return {
        "mean_abs_delta": float(delta.abs().mean()),
        "max_abs_delta": float(delta.abs().max()),
        "share_capped_at_2": float((delta.exp() > 2.0).float().mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="vLLM multi-LoRA against Hugging Face generate: rollout tokens/s")
    parser.add_argument("--model", required=True, help="a save_pretrained directory or a cached model name")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--out", default="runs/vllm-rollout")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.vllm_rollout needs a CUDA GPU")

    from popgrpo.policies.vllm_engine import VLLMEngine

    cfg = CausalLMConfig.model_validate(
        {
            "model": args.model,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 1.0,
            "lora": {"r": args.lora_rank},
            "rollout": {"engine": "vllm", "max_loras": args.members,
                        "gpu_memory_utilization": args.gpu_memory_utilization},
        }
    )  # fmt: skip
    hf = HFEngine(cfg, "cuda")
    adapters = _adapters(hf.policy, args.members)
    vllm = VLLMEngine(cfg)
    for k, adapter in enumerate(adapters):
        hf.load_adapter(k, 1, adapter)
        vllm.load_adapter(k, 1, adapter)
    input_ids, attention = hf.policy.encode(PROMPTS)
    rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention, strict=True)]
    rates: dict[str, list[float]] = {"hf": [], "vllm": []}
    last: list[Generation] = []
    for r in range(args.rounds + 1):  # round 0: warm-up, untimed
        for name, engine in (("hf", hf), ("vllm", vllm)):
            sampling = Sampling(n=args.group_size, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=r)
            seconds, tokens, answers = _round(engine, rows, args.members, sampling)
            if r:
                rates[name].append(tokens / seconds)
            if name == "vllm":
                last = answers
            print(f"round {r} {name}: {tokens} tokens in {seconds:.2f} s")
    gap = _logp_gap(hf.policy, adapters[0], PROMPTS, last[0], args.group_size)
    result = {
        "model": args.model,
        "device": torch.cuda.get_device_name(),
        "members": args.members,
        "prompts": len(PROMPTS),
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "lora_rank": args.lora_rank,
        "tokens_per_s": {k: statistics.mean(v) for k, v in rates.items()},
        "tokens_per_s_rounds": rates,
        "ratio_vllm_over_hf": statistics.mean(rates["vllm"]) / statistics.mean(rates["hf"]),
        "vllm_logp_vs_trainer": gap,
    }
    vllm.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_rollout.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
