"""TRL's ``GRPOTrainer`` against a popgrpo language-model member: completions/s and tokens/s.

``python -m benchmarks.trl_throughput --model runs/program-lm [--steps 6] [--rounds 2]``

Both train the same ``save_pretrained`` model (``popgrpo lm pretrain``) with LoRA adapters of
the same rank on all linear layers, on the program task's prompts and reward
(:func:`popgrpo.envs.programs.program_reward`, sandboxed execution), with the same number of
prompts per step ``P``, group size ``G``, completion length limit ``T``, sampling temperature
1 without top-k / top-p, one update per batch, float32, one torch thread, in this process,
on the same cores. They run alternately (popgrpo, TRL, popgrpo, TRL, …) so that both see the
same background load; each timed block follows one untimed warm-up step.

What each step does:

* **popgrpo** (:meth:`popgrpo.algorithms.member.Member.step`): generate ``P·G`` completions,
  token log-probs under the sampling policy and the reference (adapters off), the reward,
  the sentence embeddings of the completions (behaviours, diversity: what popgrpo measures
  and TRL does not), the archive, advantages, one forward + backward + Adam step.
* **TRL** (``GRPOTrainer.train`` for ``steps`` steps): generate, reference log-probs (``beta``
  > 0), the reward, advantages, one forward + backward + AdamW step.

Completions/s counts every sampled completion; tokens/s counts the completion tokens up to
and including the end-of-sequence token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import md_table

PROMPTS = ["# arithmetic\n", "# loop\n", "# function\n", "# list\n", "# while\n", "# branch\n"]


def _popgrpo_member(model: str, P: int, G: int, T: int, r: int, beta: float):
    from popgrpo.algorithms.archive_service import LocalArchive
    from popgrpo.algorithms.member import Member
    from popgrpo.config import load_config, preset_path

    config = load_config(
        preset_path("lm_programs"),
        [
            f"policy.causal_lm.model={model}",
            f"policy.causal_lm.prompts_per_step={P}",
            f"policy.causal_lm.max_new_tokens={T}",
            f"policy.causal_lm.lora.r={r}",
            f"grpo.group_size={G}",
            f"grpo.kl_coef={beta}",
            "grpo.steps_per_epoch=1",
            "population.size=1",
            "scheduler.enabled=false",
        ],
    )
    return Member(0, config, LocalArchive())


def time_popgrpo(member, steps: int) -> dict:
    member.step()  # warm-up
    start = time.perf_counter()
    completions = tokens = 0
    for _ in range(steps):
        stats = member.step()
        completions += stats.complexity.numel()
        tokens += int(stats.complexity.sum())  # complexity of a text member: completion length in tokens
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "completions": completions, "tokens": tokens}


class _Counter:
    """TRL reward function: the program task's reward, counting completions and their tokens."""

    __name__ = "program_reward"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.completions = 0
        self.tokens = 0

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        from popgrpo.envs.programs import program_reward

        self.completions += len(completions)
        if completion_ids is not None:
            eos = self.tokenizer.eos_token_id
            self.tokens += sum((list(ids).index(eos) + 1) if eos in list(ids) else len(ids) for ids in completion_ids)
        return program_reward(prompts, completions)[0]


def _trl_trainer(model: str, P: int, G: int, T: int, r: int, beta: float, steps: int, out: Path):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    tokenizer.padding_side = "left"
    counter = _Counter(tokenizer)
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=P * G,
        num_generations=G,
        max_completion_length=T,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=beta,
        loss_type="bnpo",  # popgrpo's `token` normalisation (tests/core/test_trl_equivalence.py)
        learning_rate=0.01,
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    return (
        GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=torch.float32),
            reward_funcs=counter,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS * (steps * P * G)}),
            processing_class=tokenizer,
            peft_config=LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM"),
        ),
        counter,
    )


def time_trl(model: str, P: int, G: int, T: int, r: int, beta: float, steps: int, out: Path) -> dict:
    warm, _ = _trl_trainer(model, P, G, T, r, beta, 1, out / "warm")
    warm.train()  # warm-up: one step of a separate trainer (first-call costs)
    trainer, counter = _trl_trainer(model, P, G, T, r, beta, steps, out / "timed")
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "completions": counter.completions, "tokens": counter.tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/program-lm", help="a popgrpo lm pretrain output directory")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step P")
    parser.add_argument("--group", type=int, default=8, help="group size G")
    parser.add_argument("--tokens", type=int, default=64, help="completion length limit T")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--beta", type=float, default=0.01, help="KL coefficient (both compute reference log-probs)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per block")
    parser.add_argument("--rounds", type=int, default=2, help="alternating popgrpo/TRL blocks")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="runs/bench-trl", help="TRL's output_dir and this benchmark's JSON")
    args = parser.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: not a save_pretrained directory (run popgrpo lm pretrain first)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = (args.model, args.prompts, args.group, args.tokens, args.lora_r, args.beta)
    member = _popgrpo_member(*shape)
    results: dict[str, list[dict]] = {"popgrpo": [], "trl": []}
    for i in range(args.rounds):
        results["popgrpo"].append(time_popgrpo(member, args.steps))
        results["trl"].append(time_trl(*shape, args.steps, out / f"trl-{i}"))
        print(json.dumps({k: v[-1] for k, v in results.items()}), flush=True)
    rows, rates = [], {}
    for name, blocks in results.items():
        cps = [b["completions"] / b["seconds"] for b in blocks]
        tps = [b["tokens"] / b["seconds"] for b in blocks]
        rates[name] = statistics.median(cps)
        rows.append(
            [
                name,
                len(blocks),
                sum(b["completions"] for b in blocks),
                f"{statistics.median(cps):.2f}",
                f"{statistics.median(tps):.1f}",
                f"{sum(b['tokens'] for b in blocks) / max(1, sum(b['completions'] for b in blocks)):.1f}",
            ]
        )
    ratio = rates["popgrpo"] / rates["trl"]
    table = md_table(
        ["trainer", "blocks", "completions", "completions/s (median)", "tokens/s (median)", "mean tokens"], rows
    )
    print(table)
    print(f"popgrpo / TRL completions/s: {ratio:.2f}")
    (out / "trl_throughput.json").write_text(json.dumps({"args": vars(args), "results": results, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
