"""A language-model policy: a Hugging Face causal LM whose LoRA adapters are what GRPO trains.

Members of a population share one frozen base model and differ only in their adapters, so
the scheduler's soup, perturbation and every merge strategy work on adapter weights:
:meth:`CausalLMPolicy.state_dict` returns the adapters only (kilobytes to megabytes where
the base model has gigabytes), and that is all that crosses the object store.

* **Loading** is the real path, ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``
  from a local directory or a model name (``local_files_only`` by default: nothing is
  downloaded unless the config allows it).
* **Adapters** come from ``peft`` (``get_peft_model``); their initial values are redrawn from
  a seeded generator (``A`` Kaiming-uniform as peft does, ``B = 0``), so the same run seed
  gives the same adapters in every process.
* **Reference policy** for the KL term: the base model with the adapters switched off
  (``disable_adapter``), no second copy of the model.
* **Sampling**: ``generate`` with ``do_sample``, temperature, no top-k / top-p (so the
  sampled tokens follow the very distribution whose log-probs the loss uses), seeded from the
  member's generator through a forked torch RNG. With ``merged_generation`` it runs on a plain
  copy of the model whose adapted layers hold ``W + ΔW`` (:class:`_MergedCopy`), refreshed from
  the adapters before each rollout.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from popgrpo.config import CausalLMConfig

__all__ = [
    "SHAPES",
    "CausalLMPolicy",
    "Rollout",
    "build_shaped_causal_lm",
    "build_tiny_causal_lm",
    "completion_mask",
    "draw_seed",
    "load_base",
    "lora_config",
]

# Characters of the toy tokenizer (build_tiny_causal_lm): enough for prompts, arithmetic and
# short code. Special tokens come first.
_TINY_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
_TINY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +-*/().,:=_\n"


@dataclass
class Rollout:
    """``P`` prompts × ``G`` completions, flattened prompt-major to ``N = P·G`` rows.

    ``sequences`` is ``[N, L + T]``: the left-padded prompt (``L`` tokens) then ``T``
    generated tokens, padded after the end-of-sequence token. ``completion_mask`` ``[N, T]``
    is 1 on the completion's tokens up to and including its end-of-sequence token.
    """

    prompts: list[str]  # [P]
    sequences: torch.Tensor  # [N, L + T]
    attention_mask: torch.Tensor  # [N, L + T]
    completion_mask: torch.Tensor  # [N, T] float
    completions: list[str]  # [N] decoded, without special tokens
    group_size: int

    @property
    def prompt_length(self) -> int:
        return self.sequences.shape[1] - self.completion_mask.shape[1]

    @property
    def lengths(self) -> torch.Tensor:
        """``[N]`` completion lengths in tokens (the paper's thinking-length proxy)."""
        return self.completion_mask.sum(dim=1)


def _dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, setting)


def draw_seed(generator: torch.Generator) -> int:
    """The torch seed of one ``generate`` call, drawn from a member's stream."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _load_tokenizer(model: str, load: dict[str, Any]) -> Any:
    """The tokenizer of ``model``, of the class its files name. Where a local directory names the
    generic fast tokenizer (``popgrpo lm tiny``, ``lm init``, ``lm pretrain``), that class is
    loaded: ``AutoTokenizer`` would pick the model type's own (``Qwen2Tokenizer`` for a qwen2
    model), whose pre-tokenizer does not match the files' vocabulary."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(model) / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in _GENERIC_TOKENIZERS:
        return PreTrainedTokenizerFast.from_pretrained(model, **load)
    return AutoTokenizer.from_pretrained(model, **load)


def load_base(cfg: CausalLMConfig, device: torch.device) -> tuple[Any, Any]:
    """The tokenizer (left padding and truncation, a pad token) and the base model ``cfg.model`` names.

    Raises:
        FileNotFoundError: the model cannot be loaded (a missing directory, or a name not cached
            while ``local_files_only``).
    """
    from transformers import AutoModelForCausalLM

    model = cfg.model
    if model is None:  # the config requires it with policy.kind=causal_lm
        raise ValueError("policy.causal_lm.model is required")
    load = {"local_files_only": cfg.local_files_only, "trust_remote_code": cfg.trust_remote_code}
    try:
        tokenizer = _load_tokenizer(model, load)
        base = AutoModelForCausalLM.from_pretrained(model, dtype=_dtype(cfg.dtype, device), **load)
    except OSError as exc:  # transformers' way of saying "not found" (path or cache)
        hint = (
            ""
            if Path(model).exists()
            else " (not a local directory; with local_files_only=true a model name must already be cached)"
        )
        raise FileNotFoundError(f"policy.causal_lm.model={model!r} could not be loaded{hint}: {exc}") from exc
    tokenizer.padding_side = "left"  # generation appends to the right end of every row
    tokenizer.truncation_side = "left"  # a long prompt keeps its end, nearest to the answer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, base


def lora_config(cfg: CausalLMConfig) -> Any:
    """peft's ``LoraConfig`` of ``cfg.lora``."""
    from peft import LoraConfig

    lora = cfg.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # pyright: ignore[reportArgumentType]  # peft annotates it int; it is the float α of α/r
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


class CausalLMPolicy:
    """GRPO's view of a causal LM with LoRA adapters.

    Args:
        cfg: :class:`popgrpo.config.CausalLMConfig`.
        device: where the model computes.
        generator: draws the adapters' initial values (None: peft's own initialisation).
    """

    adapter = "default"  # the peft adapter its weights are (AdapterPolicy: its member's on a shared base)

    def __init__(
        self, cfg: CausalLMConfig, device: str | torch.device = "cpu", generator: torch.Generator | None = None
    ) -> None:
        from peft import get_peft_model

        self.cfg = cfg
        self.device = torch.device(device)
        self.tokenizer, base = load_base(cfg, self.device)
        # Taken before get_peft_model puts the LoRA layers into ``base`` (in place): the modules
        # are copied, every parameter is ``base``'s own tensor (the memo maps each to itself).
        plain = copy.deepcopy(base, {id(p): p for p in base.parameters()}) if cfg.merged_generation else None
        self.model = get_peft_model(base, lora_config(cfg))
        if generator is not None:
            self.reset_adapters(generator)
        self.model.to(self.device)
        self.model.eval()  # no dropout in the base model: log-probs must be reproducible
        self.merged = None if plain is None else _MergedCopy(plain, self.model.base_model.model, self.device)
        self.n_prompts = cfg.prompts_per_step

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's padding token (its end-of-sequence token where it has none)."""
        return int(self.tokenizer.pad_token_id)

    # ---- weights: the adapters only ------------------------------------------------------
    @torch.no_grad()
    def reset_adapters(self, generator: torch.Generator) -> None:
        """Seeded LoRA init: ``A ~ U(±1/√fan_in)`` (Kaiming-uniform with a = √5, peft's default), ``B = 0``."""
        for name, param in self._adapters():
            if "lora_A" in name:
                bound = 1.0 / math.sqrt(param.shape[1])
                draw = torch.empty(param.shape, dtype=torch.float32).uniform_(-bound, bound, generator=generator)
                param.copy_(draw.to(param.dtype))
            else:
                param.zero_()

    def _adapters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable (adapter) parameters, for the optimiser."""
        return [p for _, p in self._adapters()]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The adapters' weights, keyed by their peft names (float32 CPU copies)."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model, adapter_name=self.adapter)
        return {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in state.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load adapter weights; every adapter must be given, and nothing else."""
        from peft import set_peft_model_state_dict

        expected = set(self.state_dict())
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise KeyError(f"adapter weights do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
        set_peft_model_state_dict(self.model, dict(state), adapter_name=self.adapter)

    def to(self, device: str | torch.device) -> CausalLMPolicy:
        self.device = torch.device(device)
        self.model.to(self.device)
        if self.merged is not None:
            self.merged.model.to(self.device)
        return self

    # ---- sampling and log-probs --------------------------------------------------------------
    @torch.no_grad()
    def rollout(
        self,
        prompts: list[str],
        group_size: int,
        generator: torch.Generator,
        on_row_done: Callable[[int, str], None] | None = None,
    ) -> Rollout:
        """Sample ``group_size`` completions of each prompt; rows are prompt-major.

        ``on_row_done(row, text)`` is called once per row with its decoded completion (the
        text :attr:`Rollout.completions` will hold): during generation as soon as the row
        emits its end-of-sequence token, and at the end for rows that reached the length
        limit. It only observes: the samples are those drawn without it.
        """
        input_ids, attention = self.encode(prompts)
        input_ids = input_ids.repeat_interleave(group_size, dim=0).to(self.device)
        attention = attention.repeat_interleave(group_size, dim=0).to(self.device)
        seed = draw_seed(generator)
        watch = None if on_row_done is None else _RowsDone(input_ids.shape[1], self.tokenizer, on_row_done)
        completion, _ = self.generate_tokens(input_ids, attention, seed, watch=watch)
        mask = completion_mask(completion, self.tokenizer.eos_token_id)
        rollout = self.rollout_of(prompts, input_ids, attention, completion, mask, group_size)
        if watch is not None:
            watch.finish(rollout.completions)
        return rollout

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[P, L]`` left-padded token ids of ``prompts`` (cut to ``max_prompt_tokens``) and their attention mask (CPU)."""
        enc = self.tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.cfg.max_prompt_tokens,
        )
        return enc.input_ids, enc.attention_mask

    @torch.no_grad()
    def generate_tokens(
        self,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        seed: int,
        with_log_probs: bool = False,
        watch: _RowsDone | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``generate`` from the left-padded rows ``input_ids [N, L]`` with the torch RNG seeded by
        ``seed``: the ``[N, T]`` generated tokens (finished rows padded with the pad token) and,
        with ``with_log_probs``, ``[N, T]`` log-probs of each at the sampling temperature, from
        the logits ``generate`` sampled from. ``watch`` sees every decoding step (it stops
        nothing) and reports each row as it ends."""

        from transformers import StoppingCriteriaList

        routed = contextlib.nullcontext()
        if self.merged is None:
            model = self.model
            routed = self._routed(input_ids.shape[0])
        else:
            self.merged.refresh()
            model = self.merged.model
        extra = {"return_dict_in_generate": True, "output_logits": True} if with_log_probs else {}
        generation = self.generation_config(**extra)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type), routed:
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=generation,
                stopping_criteria=StoppingCriteriaList([] if watch is None else [watch]),
            )
        if not with_log_probs:
            return out[:, input_ids.shape[1] :], None
        completion = out.sequences[:, input_ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1).float() / self.cfg.temperature  # [N, T, V]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        return completion, logp

    def generation_config(self, **extra: Any) -> Any:
        """``generate``'s settings: sampling at the temperature with no top-k / top-p, the length limits."""
        from transformers import GenerationConfig

        tok = self.tokenizer
        if self.cfg.min_new_tokens:
            extra["min_new_tokens"] = self.cfg.min_new_tokens
        sampling = {"do_sample": True, "temperature": self.cfg.temperature, "top_k": 0, "top_p": 1.0}
        return GenerationConfig(
            **{**sampling, **extra},
            max_new_tokens=self.cfg.max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )

    def _routed(self, n_rows: int) -> contextlib.AbstractContextManager[None]:
        """The context a forward or ``generate`` of ``n_rows`` rows runs in: nothing for a model of
        its own (:class:`~popgrpo.policies.shared_base.AdapterPolicy` routes them through its adapter)."""
        del n_rows
        return contextlib.nullcontext()

    def rollout_of(
        self,
        prompts: list[str],
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        completion: torch.Tensor,
        mask: torch.Tensor,
        group_size: int,
    ) -> Rollout:
        """The :class:`Rollout` of prompt rows ``input_ids`` / ``attention`` ``[N, L]`` and their
        ``completion [N, T]``, of which ``mask [N, T]`` (bool) marks the completion's own tokens."""
        tok = self.tokenizer
        completion, mask = completion.to(input_ids.device), mask.to(input_ids.device)
        sequences = torch.cat([input_ids, completion], dim=1)
        full_attention = torch.cat([attention, mask.to(attention.dtype)], dim=1)
        texts = tok.batch_decode(completion.masked_fill(~mask, tok.pad_token_id), skip_special_tokens=True)
        return Rollout(list(prompts), sequences, full_attention, mask.float(), texts, group_size)

    def token_log_probs(self, rollout: Rollout, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probabilities ``[N, T]`` of the completion tokens (at the sampling temperature),
        and with ``with_entropy`` the per-token entropies ``[N, T]`` of the policy there."""
        logits = self._completion_logits(rollout)
        logp_all = torch.log_softmax(logits, dim=-1)
        tokens = rollout.sequences[:, rollout.prompt_length :]
        logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(dim=-1) if with_entropy else None
        return logp, entropy

    @torch.no_grad()
    def reference_log_probs(self, rollout: Rollout) -> torch.Tensor:
        """Token log-probs ``[N, T]`` under the base model (adapters off): GRPO's reference."""
        with self.model.disable_adapter():
            return self.token_log_probs(rollout)[0]

    def _completion_logits(self, rollout: Rollout) -> torch.Tensor:
        """Float32 logits ``[N, T, V]`` that predicted each completion token, divided by the temperature."""
        attention = rollout.attention_mask
        positions = (attention.long().cumsum(dim=1) - 1).clamp_min(0)  # as generate numbers left-padded rows
        with self._routed(rollout.sequences.shape[0]):
            out = self.model(input_ids=rollout.sequences, attention_mask=attention, position_ids=positions)
        start = rollout.prompt_length - 1  # logits at position i predict token i + 1
        logits = out.logits[:, start:-1, :].float()
        return logits / self.cfg.temperature


class _MergedCopy:
    """A plain copy of the model for sampling, whose adapted layers hold ``W + ΔW``.

    ``ΔW = (α / r)·B·A`` is peft's own :meth:`get_delta_weight` of each LoRA layer, so a forward
    pass of the copy computes ``x·(W + ΔW)ᵀ`` where the peft model computes ``x·Wᵀ + (α / r)·x·Aᵀ·Bᵀ``:
    the same function, one matmul per adapted layer instead of three and none of peft's
    per-layer Python. Every parameter outside the adapted layers' weights is the peft model's
    own tensor (not copied), so the copy costs one more set of the adapted weights.

    Args:
        plain: a copy of the transformers model's modules taken before peft wrapped it, whose
            parameters are still the wrapped model's own tensors.
        inner: the wrapped model (``PeftModel.base_model.model``), its LoRA layers in place.
    """

    def __init__(self, plain: Any, inner: Any, device: torch.device) -> None:
        from peft.tuners.lora import LoraLayer

        self.model = plain
        self.layers: list[tuple[torch.nn.Linear, Any]] = []
        for name, module in inner.named_modules():
            if isinstance(module, LoraLayer):
                target = plain.get_submodule(name)
                if not isinstance(target, torch.nn.Linear):
                    raise TypeError(f"merged_generation supports LoRA on Linear layers only; {name} is {type(module)}")
                # The one weight of its own: W + ΔW is written here, never into the shared W.
                target.weight = torch.nn.Parameter(target.weight.detach().clone(), requires_grad=False)
                self.layers.append((target, module))
        plain.to(device)
        plain.eval()

    @torch.no_grad()
    def refresh(self) -> None:
        """Write ``W + ΔW`` of the active adapters into the copy's adapted layers."""
        for target, layer in self.layers:
            weight = layer.get_base_layer().weight
            target.weight.copy_(weight)
            for adapter in layer.active_adapters:
                target.weight.add_(layer.get_delta_weight(adapter).to(weight.dtype))


class _RowsDone:
    """A stopping criterion that stops nothing: it reports each row's text as soon as it ends."""

    def __init__(self, prompt_length: int, tokenizer: Any, callback: Callable[[int, str], None]) -> None:
        self.prompt_length = prompt_length
        self.tokenizer = tokenizer
        self.callback = callback
        self.done: set[int] = set()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        completion = input_ids[:, self.prompt_length :]
        mask = completion_mask(completion, self.tokenizer.eos_token_id)
        ended = (~mask[:, -1]) | _is_eos(completion[:, -1], self.tokenizer.eos_token_id)
        for row in int_rows(ended):
            if row not in self.done:
                self.done.add(row)
                tokens = completion[row].masked_fill(~mask[row], self.tokenizer.pad_token_id)
                self.callback(row, self.tokenizer.decode(tokens, skip_special_tokens=True))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def finish(self, texts: list[str]) -> None:
        """The rows that never ended (the length limit), with their final texts."""
        for row, text in enumerate(texts):
            if row not in self.done:
                self.done.add(row)
                self.callback(row, text)


def int_rows(flags: torch.Tensor) -> list[int]:
    """The indices where a ``[N]`` bool tensor is true."""
    return [int(i) for i in flags.nonzero().reshape(-1).tolist()]


def _is_eos(tokens: torch.Tensor, eos_token_id: int | list[int] | None) -> torch.Tensor:
    if eos_token_id is None:
        return torch.zeros_like(tokens, dtype=torch.bool)
    return torch.isin(tokens, torch.as_tensor(eos_token_id, device=tokens.device).reshape(-1))


def completion_mask(completion: torch.Tensor, eos_token_id: int | list[int] | None) -> torch.Tensor:
    """``[N, T]`` 1 up to and including each row's first end-of-sequence token, 0 after it."""
    if eos_token_id is None:
        return torch.ones_like(completion, dtype=torch.bool)
    eos_ids = torch.as_tensor(eos_token_id, device=completion.device).reshape(-1)
    is_eos = torch.isin(completion, eos_ids)
    ended_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # an EOS strictly earlier in the row
    return ~ended_before


def build_tiny_causal_lm(
    out_dir: str | Path,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 2,
    max_positions: int = 512,
    initializer_range: float = 0.2,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised toy Llama-style causal LM and its character tokenizer to ``out_dir``.

    For tests, examples and smoke runs where no pretrained model can be downloaded: it goes
    through exactly the loading path a real model does (``save_pretrained`` →
    ``from_pretrained``). One token per character of ``a–z 0–9 +-*/().,:=_`` space and newline.
    ``initializer_range`` 0.2 (HF's default is 0.02) gives a random model peaked next-token
    distributions, as a trained one has, instead of near-uniform ones that LoRA can barely move.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _character_tokenizer()
    tokenizer.save_pretrained(out)
    vocab = tokenizer.get_vocab()
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    return out


SHAPES_DIR = Path(__file__).resolve().parent / "shapes"
SHAPES = sorted(p.stem for p in SHAPES_DIR.glob("*.json"))
"""Named real architectures whose sizes are kept in ``popgrpo/policies/shapes/`` (no weights)."""


def _character_tokenizer(vocab_size: int | None = None) -> Any:
    """The toy character tokenizer; with ``vocab_size``, padded with ``<extra_i>`` tokens to that size
    (so a model of a real architecture keeps its real embedding and output sizes)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = [*_TINY_SPECIALS, *_TINY_CHARS]
    if vocab_size is not None:
        tokens += [f"<extra_{i}>" for i in range(vocab_size - len(tokens))]
    vocab = {t: i for i, t in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def build_shaped_causal_lm(
    shape: str, out_dir: str | Path, seed: int = 0, dtype: str = "float32", **overrides: Any
) -> Path:
    """Write a randomly initialised model of the real architecture ``shape`` (one of :data:`SHAPES`) to ``out_dir``.

    The sizes come from ``popgrpo/policies/shapes/<shape>.json``; nothing is downloaded. The
    tokenizer is the toy character tokenizer padded to the architecture's vocabulary, so
    embeddings, the output layer and every matmul have the real model's sizes (what memory and
    throughput depend on) while prompts and completions stay readable. Its outputs are noise:
    benchmarks generate fixed lengths (``policy.causal_lm.min_new_tokens``). ``overrides`` replace
    config fields (tests shrink the layers this way).

    Raises:
        ValueError: an unknown shape (the message lists :data:`SHAPES`).
    """
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; shapes: {', '.join(SHAPES)}")
    fields = {k: v for k, v in json.loads((SHAPES_DIR / f"{shape}.json").read_text()).items() if not k.startswith("_")}
    fields.pop("architectures", None)
    fields.update(overrides)
    model_type = fields.pop("model_type")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _character_tokenizer(fields["vocab_size"])
    tokenizer.save_pretrained(out)
    ids = tokenizer.convert_tokens_to_ids(["<pad>", "<s>", "</s>"])
    config = AutoConfig.for_model(model_type, pad_token_id=ids[0], bos_token_id=ids[1], eos_token_id=ids[2], **fields)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    return out
