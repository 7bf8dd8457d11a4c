"""benchmarks.trl_throughput trains the same thing on both sides: prompts, sampling, optimiser, rewards."""

import pytest
import torch

from benchmarks import trl_throughput
from popgrpo.envs.programs import generate_corpus, pooled_program_reward
from tests.services import require_module

require_module("trl")

pytestmark = pytest.mark.requires("sandbox")  # both sides' rewards execute the programs


def _args(model, tmp_path, *extra):
    return trl_throughput.build_parser().parse_args(
        ["--model", str(model), "--steps", "2", "--tokens", "8", "--out", str(tmp_path), *extra]
    )


def test_both_sides_see_the_same_prompts_limits_sampling_and_optimiser(tiny_lm, tmp_path):
    torch.set_num_threads(1)
    args = _args(tiny_lm, tmp_path)
    popgrpo = trl_throughput.time_popgrpo(args, seed=3)
    trl = trl_throughput.time_trl(args, 3, tmp_path / "trl")
    # The prompts each timed step was given: popgrpo's schedule, and what TRL's reward function saw.
    assert popgrpo["prompts"] == trl["scheduled"] == trl["prompts"]
    assert len(popgrpo["prompts"]) == args.steps and all(len(p) == args.prompts for p in popgrpo["prompts"])
    assert trl_throughput.prompt_schedule(4, 3, 2) != trl_throughput.prompt_schedule(3, 3, 2)  # seeded, not fixed
    assert popgrpo["completions"] == trl["completions"] == args.steps * args.prompts * args.group

    member, _ = trl_throughput.build_popgrpo(args, 3)
    trainer, _, _ = trl_throughput.build_trl(args, 3, tmp_path / "trl2")
    cfg, gen = member.config, trainer.generation_config
    assert gen.max_new_tokens == cfg.policy.causal_lm.max_new_tokens == args.tokens
    assert gen.do_sample and gen.temperature == cfg.policy.causal_lm.temperature == 1.0
    assert (gen.top_k or 0) == 0 and (gen.top_p or 1.0) == 1.0  # popgrpo samples with top_k=0, top_p=1
    assert trainer.num_generations == cfg.grpo.group_size == args.group
    assert trainer.beta == cfg.grpo.kl_coef and trainer.epsilon_low == trainer.epsilon_high == cfg.grpo.clip
    assert trainer.args.max_grad_norm == 0.0 and trainer.args.lr_scheduler_type == "constant"
    ours, theirs = member.optimizer.param_groups[0], trainer.create_optimizer().param_groups[0]
    for key in ("lr", "betas", "eps", "weight_decay"):
        assert ours[key] == theirs[key], key
    assert sum(p.numel() for p in member.policy.parameters()) == sum(
        p.numel() for p in trainer.model.parameters() if p.requires_grad
    )  # the same LoRA adapters


def test_trl_reward_function_gives_popgrpos_rewards(tiny_lm, tmp_path):
    args = _args(tiny_lm, tmp_path)
    member, _ = trl_throughput.build_popgrpo(args, 0)
    programs = [doc.split("\n", 1)[1] for doc in generate_corpus(6, seed=1)]
    completions = [*programs, "result = 1 / 0\n", "while True:\n    pass\n", "x = (\n"]
    prompts = ["# loop\n"] * len(completions)
    counter = trl_throughput.RewardCounter(eos_token_id=2)
    theirs = counter(prompts=prompts, completions=completions, completion_ids=[[5, 2]] * len(completions))
    ours = member.env.score(prompts, completions).values.tolist()
    assert theirs == pytest.approx(ours, abs=1e-6)  # float32 on popgrpo's side
    assert theirs == pooled_program_reward(prompts, completions)
    assert sum(v > 0 for v in theirs) >= 5 and theirs[-3:] == [0.0, 0.0, 0.0]
