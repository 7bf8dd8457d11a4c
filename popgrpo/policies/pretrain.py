"""Pre-train a small causal LM from scratch on generated Python programs (``popgrpo lm pretrain``).

No pretrained model can be downloaded where popgrpo's LM path is tested, so this makes one:

1. **Corpus**: :func:`popgrpo.envs.programs.generate_corpus`, short programs of six styles and
   varied size, each after a header line naming its style (the program task's prompt).
2. **Tokenizer**: a byte-level BPE (``tokenizers``) trained on that corpus, wrapped as a
   ``PreTrainedTokenizerFast`` that starts every text with ``<s>``; ``</s>`` ends a document.
3. **Model**: a Llama-architecture ``LlamaForCausalLM`` (``transformers``) of a few million
   parameters, trained with AdamW (linear warm-up, cosine decay) on next-token loss.
4. **Checks along the way**: every ``eval_every`` steps the validation loss and the share of
   the model's own samples (one per prompt style, in turn) that execute in the sandbox and
   leave a number in ``result``; every ``checkpoint_every`` steps a ``save_pretrained``
   checkpoint under ``checkpoints/step-NNNNNN`` (the early checkpoints WARM-style
   initialisations can start from).

The output directory is a ``save_pretrained`` model + tokenizer that
``policy.causal_lm.model`` loads, with ``pretrain_log.jsonl`` (one line per evaluation) and
``pretrain_summary.json``.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from popgrpo.envs.programs import STYLES, generate_corpus, header, program_reward

__all__ = ["PretrainConfig", "build_tokenizer", "pretrain", "sample_completions"]

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


@dataclass(frozen=True)
class PretrainConfig:
    """What ``popgrpo lm pretrain`` trains: about 1.1 M parameters, 600 steps of 16 programs."""

    corpus_size: int = 12000  # generated training documents
    val_size: int = 256  # held-out documents for the validation loss
    vocab_size: int = 512  # BPE vocabulary, special tokens included
    hidden_size: int = 160
    layers: int = 4
    heads: int = 4
    max_length: int = 128  # documents are cut to this many tokens (BOS and EOS included)
    batch_size: int = 16
    steps: int = 600
    lr: float = 3e-3
    warmup_steps: int = 40
    weight_decay: float = 0.01
    eval_every: int = 200
    checkpoint_every: int = 200
    exec_samples: int = 24  # samples executed per evaluation (0: no execution check)
    max_new_tokens: int = 128  # sample length limit at evaluation
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("corpus_size", "val_size", "vocab_size", "hidden_size", "layers", "heads", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("batch_size", "steps", "eval_every", "checkpoint_every", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.exec_samples < 0:
            raise ValueError(f"exec_samples must be >= 0, got {self.exec_samples}")
        if self.hidden_size % self.heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of heads ({self.heads})")
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {self.vocab_size}")


# A configuration that runs in seconds: for tests and smoke runs, not a useful model.
QUICK = PretrainConfig(
    corpus_size=600,
    val_size=64,
    vocab_size=320,
    hidden_size=32,
    layers=1,
    heads=2,
    max_length=128,
    batch_size=16,
    steps=30,
    lr=1e-2,
    warmup_steps=3,
    eval_every=15,
    checkpoint_every=10,
    exec_samples=4,
    max_new_tokens=48,
)


def build_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE trained on ``corpus``, as a ``PreTrainedTokenizerFast`` that prepends ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, bos_token=BOS, eos_token=EOS)


def _encode(tokenizer, documents: list[str], max_length: int) -> list[list[int]]:
    """``<s> document </s>`` token ids, cut to ``max_length`` (the end-of-document token kept only when it fits)."""
    ids = tokenizer(documents, add_special_tokens=True)["input_ids"]
    return [[*row, tokenizer.eos_token_id][:max_length] for row in ids]


def _batch(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on padding), each ``[B, L]``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask, ids.masked_fill(mask == 0, -100)


def _model(cfg: PretrainConfig, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=2 * cfg.hidden_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=max(cfg.max_length, 512),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


@torch.no_grad()
def _validation_loss(model, rows: list[list[int]], pad_id: int, batch_size: int) -> float:
    """Mean next-token loss over every token of ``rows``."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        ids, mask, labels = _batch(rows[start : start + batch_size], pad_id)
        n = int((labels[:, 1:] != -100).sum())
        total += float(model(input_ids=ids, attention_mask=mask, labels=labels).loss) * n
        count += n
    model.train()
    return total / max(count, 1)


@torch.no_grad()
def sample_completions(
    model, tokenizer, prompts: list[str], max_new_tokens: int, seed: int, temperature: float = 1.0
) -> tuple[list[str], list[int]]:
    """One sampled completion per prompt (pure sampling: no top-k/top-p), decoded, and its length in tokens.

    The length counts the completion's tokens up to and including ``</s>`` (or all
    ``max_new_tokens`` when it never ended), as :attr:`popgrpo.policies.causal_lm.Rollout.lengths` does.
    """
    from transformers import GenerationConfig

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    generation = GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        out = model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask, generation_config=generation)
    if was_training:
        model.train()
    completion = out[:, enc.input_ids.shape[1] :]
    is_eos = completion == tokenizer.eos_token_id
    ended = is_eos.any(dim=1)
    lengths = torch.where(
        ended, is_eos.long().argmax(dim=1) + 1, torch.full_like(ended, completion.shape[1], dtype=torch.long)
    )
    texts = [
        tokenizer.decode(row[: int(n)], skip_special_tokens=True) for row, n in zip(completion, lengths, strict=True)
    ]
    return texts, lengths.tolist()


def _execution_check(model, tokenizer, cfg: PretrainConfig, step: int) -> dict:
    """Sample ``exec_samples`` programs (headers in turn) and run them: share that executes, mean reward, mean length."""
    if cfg.exec_samples == 0:
        return {}
    from popgrpo.envs.sandbox import SandboxUnavailable

    prompts = [header(STYLES[i % len(STYLES)]) for i in range(cfg.exec_samples)]
    texts, lengths = sample_completions(model, tokenizer, prompts, cfg.max_new_tokens, seed=cfg.seed * 100003 + step)
    try:
        rewards, reasons = program_reward(prompts, texts)
    except SandboxUnavailable as exc:
        warnings.warn(f"execution check skipped: {exc}", stacklevel=2)
        return {}
    return {
        "exec_success": sum(r == "ok" for r in reasons) / len(reasons),
        "exec_reward": sum(rewards) / len(rewards),
        "sample_tokens": sum(lengths) / len(lengths),
        "distinct_samples": len(set(texts)) / len(texts),
    }


def _save(model, tokenizer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def pretrain(cfg: PretrainConfig, out: str | Path, progress: bool = True) -> dict:
    """Generate the corpus, train the tokenizer and the model, write everything to ``out``; return the summary.

    Seeded by ``cfg.seed``: corpus, initial weights, batches and samples. Writes ``out`` (the
    final model and tokenizer), ``out/checkpoints/step-NNNNNN``, ``out/pretrain_log.jsonl``
    (appended at each evaluation, so an interrupted run keeps what it measured) and
    ``out/pretrain_summary.json``.
    """
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    documents = generate_corpus(cfg.corpus_size + cfg.val_size, seed=cfg.seed)
    train_docs, val_docs = documents[: cfg.corpus_size], documents[cfg.corpus_size :]
    tokenizer = build_tokenizer(train_docs, cfg.vocab_size)
    pad_id = tokenizer.pad_token_id
    if not isinstance(pad_id, int):  # build_tokenizer sets PAD; transformers types the id loosely
        raise TypeError(f"the tokenizer's pad token id is {pad_id!r}, not an int")
    train_rows = _encode(tokenizer, train_docs, cfg.max_length)
    val_rows = _encode(tokenizer, val_docs, cfg.max_length)

    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = _model(cfg, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))

    def lr_factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress_ = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress_)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lr_factor)
    generator = torch.Generator().manual_seed(cfg.seed)
    log_path = out / "pretrain_log.jsonl"
    log_path.write_text("")
    history: list[dict] = []

    def evaluate(step: int, train_loss: float) -> dict:
        row = {
            "step": step,
            "train_loss": train_loss,
            "val_loss": _validation_loss(model, val_rows, pad_id, cfg.batch_size),
            "seconds": round(time.perf_counter() - started, 1),
        }
        row.update(_execution_check(model, tokenizer, cfg, step))
        history.append(row)
        with log_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        return row

    evaluate(0, math.nan)
    model.train()
    bar = tqdm(range(1, cfg.steps + 1), desc="pretrain", disable=not progress, unit="step")
    recent: list[float] = []
    for step in bar:
        index = torch.randint(len(train_rows), (cfg.batch_size,), generator=generator).tolist()
        ids, mask, labels = _batch([train_rows[i] for i in index], pad_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        scheduler.step()
        value = float(loss.detach())
        recent = [*recent[-19:], value]
        if step % cfg.checkpoint_every == 0 and step < cfg.steps:
            _save(model, tokenizer, out / "checkpoints" / f"step-{step:06d}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            row = evaluate(step, sum(recent) / len(recent))
            bar.set_postfix(
                {k: f"{v:.3g}" for k, v in row.items() if k in ("train_loss", "val_loss", "exec_success")},
                refresh=False,
            )
        else:
            bar.set_postfix(loss=f"{value:.3f}", refresh=False)
    bar.close()
    model.eval()
    _save(model, tokenizer, out)
    summary = {
        "out": str(out),
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "train_tokens_per_step_max": cfg.batch_size * cfg.max_length,
        "seconds": round(time.perf_counter() - started, 1),
        "threads": torch.get_num_threads(),
        # The CPU kernels torch ran (AVX2, AVX512, ...): the same seed makes another model
        # with other kernels (docs/RESULTS_LM.md §1).
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "first": history[0],
        "last": history[-1],
        "checkpoints": sorted(p.name for p in (out / "checkpoints").glob("step-*")),
        "config": asdict(cfg),
    }
    (out / "pretrain_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def quick_config(**overrides: Any) -> PretrainConfig:
    """The seconds-long configuration (tests, smoke runs), with ``overrides``."""
    return replace(QUICK, **overrides)
