"""`popgrpo lm pretrain`: a tokenizer and a causal LM trained here, loadable by the causal-LM policy."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from popgrpo.envs.programs import generate_corpus
from popgrpo.policies.pretrain import PretrainConfig, build_tokenizer, pretrain, quick_config, sample_completions
from tests.services import require_sandbox
from tests.test_cli import popgrpo

# Small enough for seconds on a loaded machine; still enough steps for the loss to fall.
TINY = dict(corpus_size=300, val_size=32, steps=12, eval_every=6, checkpoint_every=4, exec_samples=2, max_new_tokens=24)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    require_sandbox()
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
    assert len(tok(corpus[0])["input_ids"]) < len(corpus[0]) / 1.5  # merges learned: fewer tokens than characters


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


def test_cli_bad_out_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = popgrpo("lm", "pretrain", "--quick", "--out", str(blocker / "model"))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "--out" in res.stderr
    res = popgrpo("lm", "pretrain", "--quick", "--steps", "0", "--out", str(tmp_path / "m"))
    assert res.returncode == 2 and "steps" in res.stderr
    res = popgrpo("lm", "programs", "--model", str(tmp_path / "nowhere"))
    assert res.returncode == 2 and "--model" in res.stderr


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
