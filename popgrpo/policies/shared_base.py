"""Members on one base model: one frozen copy of the weights, one LoRA adapter per member.

``policy.causal_lm.share_base`` puts the members of one actor on a :class:`SharedBase`: the
base model is loaded once and wrapped by peft with one named adapter per member
(:func:`adapter_name`). Every call runs under a route (:meth:`SharedBase.route`): the batch's
rows in segments, each one member's contiguous rows, so one batch can hold rows of several
members. Each adapted layer adds to the base layer's output the LoRA delta of each segment's
own adapter (:func:`_segmented_lora_forward`): with segments of equal size, as GRPO's members
have, one batched matmul pair for all members (``[M, rows, in] × [M, in, r] × [M, r, out]``)
instead of a gather, two matmuls and a scatter per member; in a backward pass each member's
gradient lands in its own adapter only. The reference policy of the KL term is the base with
no adapter (the route :data:`BASE`), computed once for all members.

* :class:`AdapterPolicy` is one member's view: a :class:`~popgrpo.policies.causal_lm.CausalLMPolicy`
  whose weights are its adapter (same state-dict keys as a member with a model of its own, so
  soups, checkpoints and the rollout engine see no difference).
* :meth:`SharedBase.mixed_rollouts` generates for several members in one batched ``generate``:
  every step draws each member's tokens with that member's own seeded generator
  (:class:`_SegmentSampler`), as the member would draw them alone, so a member's completions are
  its own up to float rounding of the logits (a token whose draw falls within rounding of a
  boundary between two tokens may differ).
* :meth:`SharedBase.mixed_log_probs` computes several members' token log-probs (and entropies)
  in one forward, with gradient.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

from popgrpo.policies.causal_lm import CausalLMPolicy, Rollout, completion_mask, load_base, lora_config

if TYPE_CHECKING:
    from popgrpo.config import CausalLMConfig

__all__ = [
    "BASE",
    "AdapterPolicy",
    "MemoryEstimate",
    "MixedBatch",
    "SharedBase",
    "adapter_name",
    "estimate_memory",
    "update_members",
]

log = logging.getLogger(__name__)

BASE = "__base__"  # the route of rows that take no adapter (the reference policy)
Segments = tuple[tuple[str, int], ...]
"""A route: ``(adapter, rows)`` pairs in row order, covering the batch."""


def adapter_name(member_id: int) -> str:
    """Member ``member_id``'s peft adapter name. No name is a substring of another's (peft picks an
    adapter's state-dict keys by substring), hence the closing underscore: ``member1_``, ``member11_``."""
    return f"member{member_id}_"


@dataclass
class MixedBatch:
    """Several members' rollouts as one ``[N, L + T]`` batch; member ``i`` holds ``rows[i]``.

    ``L`` is the longest prompt (shorter ones are left-padded further), ``T`` the longest
    completion; member ``i``'s own completion tokens are the first ``lengths[i]`` columns after
    ``L`` (its :class:`Rollout` holds exactly those).
    """

    sequences: torch.Tensor  # [N, L + T]
    attention_mask: torch.Tensor  # [N, L + T]
    prompt_length: int  # L
    rows: list[slice]
    lengths: list[int]  # T_i
    route: list[tuple[str, int]]  # (adapter, rows) of each member, in row order

    def select(self, members: Sequence[int]) -> MixedBatch:
        """The batch of the members at positions ``members`` only (their rows, in that order)."""
        if list(members) == list(range(len(self.rows))):
            return self
        keep = torch.cat([torch.arange(self.rows[i].start, self.rows[i].stop) for i in members])
        rows, start = [], 0
        for i in members:
            n = self.rows[i].stop - self.rows[i].start
            rows.append(slice(start, start + n))
            start += n
        return MixedBatch(
            self.sequences[keep.to(self.sequences.device)],
            self.attention_mask[keep.to(self.attention_mask.device)],
            self.prompt_length,
            rows,
            [self.lengths[i] for i in members],
            [self.route[i] for i in members],
        )

    @classmethod
    def of(cls, policies: Sequence[AdapterPolicy], rollouts: Sequence[Rollout]) -> MixedBatch:
        """The batch of ``rollouts`` (member ``i``'s by ``policies[i]``), re-padded to a common shape."""
        pad = policies[0].pad_token_id
        width_l = max(r.prompt_length for r in rollouts)
        width_t = max(r.completion_mask.shape[1] for r in rollouts)
        sequences, attention, rows, route = [], [], [], []
        start = 0
        for policy, r in zip(policies, rollouts, strict=True):
            left, right = width_l - r.prompt_length, width_t - r.completion_mask.shape[1]
            n = r.sequences.shape[0]
            sequences.append(torch.nn.functional.pad(r.sequences, (left, right), value=pad))
            attention.append(torch.nn.functional.pad(r.attention_mask, (left, right), value=0))
            rows.append(slice(start, start + n))
            route.append((policy.adapter, n))
            start += n
        return cls(
            torch.cat(sequences),
            torch.cat(attention),
            width_l,
            rows,
            [r.completion_mask.shape[1] for r in rollouts],
            route,
        )


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SAFETENSORS_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}
_ACTIVATION_VALUES = 24  # values a decoder layer keeps per token and hidden unit for the backward pass (rough)
_RUNTIME_BYTES = 1 << 30  # the interpreter, torch and transformers themselves


@dataclass(frozen=True)
class MemoryEstimate:
    """What ``M`` members on one base need, in bytes: an estimate from the model's sizes, not a
    measurement. The activations depend on the prompts' length, which is known only per step:
    ``activations`` counts completions alone (a lower bound), ``activations_at_longest`` prompts
    of ``max_prompt_tokens`` tokens."""

    weights: int  # the base model, once
    adapters: int  # every member's adapter with its gradient and Adam moments
    activations: int  # the larger of an update's (every row's layers, one member's logits) and generation's cache
    activations_at_longest: int
    runtime: int  # the interpreter, torch and transformers (on the CPU)

    @property
    def at_least(self) -> int:
        return self.weights + self.adapters + self.activations + self.runtime

    @property
    def at_most(self) -> int:
        return self.weights + self.adapters + self.activations_at_longest + self.runtime


def update_members(cfg: CausalLMConfig, n_members: int, device: torch.device) -> int:
    """How many members' rows one update pass holds: ``share_base_update_members``, or when unset
    all ``n_members`` on CUDA and one on the CPU."""
    setting = cfg.share_base_update_members
    if setting is None:
        setting = n_members if device.type == "cuda" else 1
    return max(1, min(setting, n_members))


def estimate_memory(
    cfg: CausalLMConfig, n_members: int, group_size: int, device: torch.device
) -> MemoryEstimate | None:
    """What :class:`SharedBase` with ``n_members`` members will need, from the model directory's
    ``config.json`` and safetensors headers without loading it; None where ``cfg.model`` is not a
    local directory of safetensors files."""
    import json
    from pathlib import Path

    folder = Path(cfg.model or "")
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files or not (folder / "config.json").is_file():
        return None
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    width = _DTYPE_BYTES[dtype]
    n_weights = 0
    for path in files:
        with path.open("rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        for key, info in header.items():
            if key != "__metadata__" and info["dtype"] in _SAFETENSORS_BYTES:
                n = 1
                for d in info["shape"]:
                    n *= d
                n_weights += n
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    inner, vocab = int(config.get("intermediate_size", 4 * hidden)), int(config["vocab_size"])
    heads = int(config.get("num_attention_heads", 1))
    kv = hidden * int(config.get("num_key_value_heads", heads)) // heads
    r = cfg.lora.r
    # all-linear LoRA on a decoder layer: q, k, v, o, and the MLP's three projections.
    per_layer = r * ((hidden + hidden) * 2 + (hidden + kv) * 2 + (hidden + inner) * 3)
    per_member = cfg.prompts_per_step * group_size
    rows, update_rows = n_members * per_member, update_members(cfg, n_members, device) * per_member
    logits = per_member * cfg.max_new_tokens * vocab * 4 * 4  # one member's, float32, ×4 copies

    def activations(tokens: int) -> int:
        update = update_rows * tokens * hidden * layers * _ACTIVATION_VALUES * width + logits
        cache = rows * tokens * layers * 2 * kv * width
        return max(update, cache)

    return MemoryEstimate(
        weights=n_weights * width,
        adapters=n_members * per_layer * layers * 4 * 4,  # weights, gradient, Adam's two moments (float32)
        activations=activations(cfg.max_new_tokens),
        activations_at_longest=activations(cfg.max_prompt_tokens + cfg.max_new_tokens),
        runtime=_RUNTIME_BYTES if device.type == "cpu" else 0,
    )


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def check_fits(cfg: CausalLMConfig, n_members: int, group_size: int, device: torch.device) -> None:
    """Raise :class:`MemoryError` (one line: what is needed, what is free, what to lower) when
    ``n_members`` members on one base cannot fit in the memory free on ``device`` now, even with
    the shortest prompts; log a warning when they fit only with prompts shorter than ``max_prompt_tokens``."""
    estimate = estimate_memory(cfg, n_members, group_size, device)
    if estimate is None:
        return
    free, gib = _available_bytes(device), 2**30
    if estimate.at_least > free:
        raise MemoryError(
            f"policy.causal_lm.share_base: {n_members} members on one base need at least "
            f"{estimate.at_least / gib:.1f} GiB (model {estimate.weights / gib:.1f}, adapters with Adam "
            f"{estimate.adapters / gib:.2f}, a step's activations {estimate.activations / gib:.1f}, runtime "
            f"{estimate.runtime / gib:.1f}) and {free / gib:.1f} GiB are free on {device}: lower "
            "population.members_per_actor, policy.causal_lm.prompts_per_step or grpo.group_size"
        )
    if estimate.at_most > free:
        log.warning(
            "policy.causal_lm.share_base: %d members on one base need %.1f-%.1f GiB by the prompts' length "
            "(up to max_prompt_tokens) and %.1f GiB are free on %s",
            n_members,
            estimate.at_least / gib,
            estimate.at_most / gib,
            free / gib,
            device,
        )


class SharedBase:
    """One frozen base model with a LoRA adapter for each of ``member_ids``.

    Args:
        cfg: :class:`popgrpo.config.CausalLMConfig` (its ``model``, ``dtype``, ``lora``, sampling).
        member_ids: the members whose adapters it holds.
        device: where the model computes.
        group_size: completions per prompt; given, the base first checks that its members' steps
            fit in the memory free on ``device`` (:func:`check_fits`).

    Raises:
        MemoryError: the members would not fit (one line saying what they need).
    """

    def __init__(
        self,
        cfg: CausalLMConfig,
        member_ids: Sequence[int],
        device: str | torch.device = "cpu",
        group_size: int | None = None,
    ) -> None:
        from peft import get_peft_model

        if not member_ids:
            raise ValueError("a shared base needs at least one member")
        self.cfg = cfg
        self.device = torch.device(device)
        self.member_ids = list(member_ids)
        if group_size is not None:  # before loading anything: a base that cannot fit fails here, at start-up
            check_fits(cfg, len(self.member_ids), group_size, self.device)
        self.tokenizer, base = load_base(cfg, self.device)
        names = [adapter_name(k) for k in self.member_ids]
        self.model = get_peft_model(base, lora_config(cfg), adapter_name=names[0])
        for name in names[1:]:
            self.model.add_adapter(name, lora_config(cfg))
        # peft marks only its active adapter trainable; here every member's adapter is, and no
        # call runs without naming each row's adapter, so which one peft calls active never matters.
        for name, param in self.model.named_parameters():
            param.requires_grad_(any(f".{n}." in name for n in names))
        self.model.to(self.device)
        self.model.eval()  # no dropout in the base model: log-probs must be reproducible
        self._route: Segments | None = None
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer

        for name, module in self.model.named_modules():
            if isinstance(module, LoraLayer):
                if not isinstance(module, LoraLinear) or module.lora_variant:
                    raise TypeError(f"share_base supports plain LoRA on linear layers only; {name} is {type(module)}")
                module.forward = functools.partial(_segmented_lora_forward, module, self)

    @contextlib.contextmanager
    def route(self, segments: Sequence[tuple[str, int]]) -> Iterator[None]:
        """Calls of the model inside take the batch's rows as ``segments``: ``(adapter, rows)``
        pairs in row order (:data:`BASE` for rows without an adapter)."""
        if self._route is not None:
            raise RuntimeError("the shared base is already routing a call")
        self._route = tuple((name, int(n)) for name, n in segments)
        try:
            yield
        finally:
            self._route = None

    def member_policy(self, member_id: int, generator: torch.Generator | None = None) -> AdapterPolicy:
        """Member ``member_id``'s view, its adapter redrawn from ``generator`` (None: left as it is)."""
        if member_id not in self.member_ids:
            raise KeyError(f"member {member_id} has no adapter on this base (members {self.member_ids})")
        return AdapterPolicy(self, member_id, generator)

    # ---- several members in one batch ----------------------------------------------------
    @torch.no_grad()
    def mixed_rollouts(
        self,
        policies: Sequence[AdapterPolicy],
        prompts: Sequence[list[str]],
        group_size: int,
        seeds: Sequence[int],
    ) -> list[Rollout]:
        """Member ``i`` (``policies[i]``) samples ``group_size`` completions of each of ``prompts[i]``
        with the torch seed ``seeds[i]``, all in one ``generate``; rows are prompt-major per member."""
        from transformers import LogitsProcessorList

        encoded = [p.encode(list(ps)) for p, ps in zip(policies, prompts, strict=True)]
        width = max(ids.shape[1] for ids, _ in encoded)
        pad = policies[0].pad_token_id
        ids_parts, att_parts, route, segments = [], [], [], []
        start = 0
        for policy, (ids, att), seed in zip(policies, encoded, seeds, strict=True):
            ids, att = ids.repeat_interleave(group_size, dim=0), att.repeat_interleave(group_size, dim=0)
            left = width - ids.shape[1]
            ids_parts.append(torch.nn.functional.pad(ids, (left, 0), value=pad))
            att_parts.append(torch.nn.functional.pad(att, (left, 0), value=0))
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
            segments.append((start, start + ids.shape[0], generator))
            route.append((policy.adapter, ids.shape[0]))
            start += ids.shape[0]
        input_ids, attention = torch.cat(ids_parts).to(self.device), torch.cat(att_parts).to(self.device)
        sampler = _SegmentSampler(segments, self.cfg.temperature)
        with self.route(route):
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=policies[0].generation_config(
                    do_sample=False, temperature=None, top_k=None, top_p=None
                ),
                logits_processor=LogitsProcessorList([sampler]),
            )
        completion = out[:, width:]
        rollouts: list[Rollout] = []
        for policy, (ids, _), ps, (lo, hi, _) in zip(policies, encoded, prompts, segments, strict=True):
            own = completion[lo:hi]
            mask = completion_mask(own, self.tokenizer.eos_token_id)
            # generate stops when every row has ended: alone, this member's rows would have
            # stopped at its own longest completion.
            length = int(mask.sum(dim=1).max())
            keep = slice(width - ids.shape[1], width)
            rollouts.append(
                policy.rollout_of(
                    list(ps),
                    input_ids[lo:hi, keep],
                    attention[lo:hi, keep],
                    own[:, :length],
                    mask[:, :length],
                    group_size,
                )
            )
        return rollouts

    def mixed_log_probs(
        self, batch: MixedBatch, with_entropy: bool = False, reference: bool = False
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each member's ``[N_i, T_i]`` token log-probs (and entropies) from one forward of ``batch``,
        with gradient; ``reference``: under the base model, no adapter (call it without gradient).

        The transformer body runs once for every row; the output layer and the softmax over the
        vocabulary run member by member, and with gradient and several members each member's are
        recomputed in the backward pass (activation checkpointing), so the ``[rows, T, vocabulary]``
        logits are held for one member's rows at a time, not all members'. Models whose forward does more to the
        logits than the output layer (a logit scale or soft cap) take one whole forward instead.
        """
        attention = batch.attention_mask
        positions = (attention.long().cumsum(dim=1) - 1).clamp_min(0)  # as generate numbers left-padded rows
        route = [(BASE, batch.sequences.shape[0])] if reference else batch.route
        start = batch.prompt_length - 1  # the output at position i predicts token i + 1
        tokens = batch.sequences[:, batch.prompt_length :]
        inner = self.model.base_model.model  # the transformers model peft wraps
        split = self._split_head(inner)
        with self.route(route):
            if split is None:
                out = self.model(input_ids=batch.sequences, attention_mask=attention, position_ids=positions)
                states = out.logits[:, start:-1, :]
            else:
                body, _ = split
                states = body(
                    input_ids=batch.sequences, attention_mask=attention, position_ids=positions
                ).last_hidden_state[:, start:-1, :]
        temperature = self.cfg.temperature

        def scores(hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = hidden if split is None else split[1](hidden)
            logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
            logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(dim=-1) if with_entropy else logp.new_zeros(())
            return logp, entropy

        results: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for rows, length in zip(batch.rows, batch.lengths, strict=True):
            args = (states[rows, :length], tokens[rows, :length])
            # With more than one member in the pass, each member's logits are recomputed in the
            # backward pass instead of all being held; one member's are held, as alone.
            if split is not None and torch.is_grad_enabled() and len(batch.rows) > 1:
                logp, entropy = checkpoint(scores, *args, use_reentrant=False)
            else:
                logp, entropy = scores(*args)
            results.append((logp, entropy if with_entropy else None))
        return results

    @staticmethod
    def _split_head(inner: Any) -> tuple[Any, Any] | None:
        """The model's body and output layer when its forward is ``output_layer(body(...))``;
        None where it also scales or caps the logits."""
        config = inner.config
        if any(getattr(config, key, None) for key in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
            return None
        try:
            body, head = inner.get_decoder(), inner.get_output_embeddings()
        except (AttributeError, NotImplementedError):
            return None
        return None if body is None or head is None else (body, head)


class AdapterPolicy(CausalLMPolicy):
    """One member's :class:`CausalLMPolicy` on a :class:`SharedBase`: its weights are its adapter.

    It loads nothing: tokenizer and model are the base's. Every forward and ``generate`` routes
    all its rows through its adapter, and its reference pass through none.
    """

    def __init__(self, base: SharedBase, member_id: int, generator: torch.Generator | None = None) -> None:
        # CausalLMPolicy.__init__ would load a model; the base holds the one model.
        self.cfg = base.cfg
        self.device = base.device
        self.tokenizer = base.tokenizer
        self.model = base.model
        self.merged = None
        self.n_prompts = base.cfg.prompts_per_step
        self.base = base
        self.member_id = member_id
        self.adapter = adapter_name(member_id)
        if generator is not None:
            self.reset_adapters(generator)

    def _adapters(self) -> list[tuple[str, torch.nn.Parameter]]:
        marker = f".{self.adapter}."
        return [(n, p) for n, p in self.model.named_parameters() if marker in n]

    def _routed(self, n_rows: int) -> contextlib.AbstractContextManager[None]:
        return self.base.route([(self.adapter, n_rows)])

    @torch.no_grad()
    def reference_log_probs(self, rollout: Rollout) -> torch.Tensor:
        """Token log-probs ``[N, T]`` under the base model (no adapter): GRPO's reference."""
        saved = self.adapter
        self.adapter = BASE
        try:
            return self.token_log_probs(rollout)[0]
        finally:
            self.adapter = saved

    def to(self, device: str | torch.device) -> AdapterPolicy:
        """Moves the shared model, and so every member on it."""
        self.base.device = self.device = torch.device(device)
        self.model.to(self.device)
        return self


class _SegmentSampler:
    """A logits processor that draws each member's next tokens with that member's own generator.

    Rows ``lo:hi`` of a segment are one member's; their tokens are drawn as ``generate`` draws a
    sample (temperature, softmax, one multinomial draw per row) but from the segment's
    generator. It returns scores that put all mass on the drawn tokens, for greedy decoding to
    pick.
    """

    def __init__(self, segments: Sequence[tuple[int, int, torch.Generator]], temperature: float) -> None:
        self.segments = list(segments)
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature != 1.0:
            scores = scores / self.temperature
        probs = torch.softmax(scores, dim=-1)
        chosen = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)
        for lo, hi, generator in self.segments:
            chosen[lo:hi] = torch.multinomial(probs[lo:hi], num_samples=1, generator=generator).squeeze(1)
        picked = torch.full_like(scores, -float("inf"))
        picked.scatter_(1, chosen.unsqueeze(1), 0.0)
        return picked


def _segmented_lora_forward(self: Any, base: SharedBase, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A peft LoRA ``Linear``'s forward on a :class:`SharedBase`: the base layer's output plus each
    route segment's own LoRA delta ``(α / r)·B·A·x``, added in the adapters' dtype and rounded to
    the output's once, as peft's one-adapter forward does."""
    result = self.base_layer(x, *args, **kwargs)
    route: Segments | None = base._route
    if route is None:
        raise RuntimeError("a shared base model was called outside SharedBase.route")
    if all(name == BASE for name, _ in route):
        return result
    names = list(dict.fromkeys(name for name, _ in route if name != BASE))
    scaling = {self.scaling[name] for name in names}
    if len(scaling) != 1:
        raise ValueError("members on one base have adapters of one rank and alpha")
    dtype = self.lora_A[names[0]].weight.dtype
    sizes = [n for _, n in route]
    if len(set(sizes)) == 1 and BASE not in (name for name, _ in route) and x.shape[0] == sum(sizes):
        # Equal segments (every member P·G rows): one batched matmul pair for all of them.
        a = torch.stack([self.lora_A[name].weight for name, _ in route])  # [M, r, in]
        b = torch.stack([self.lora_B[name].weight for name, _ in route])  # [M, out, r]
        xs = x.to(dtype).reshape(len(route), -1, x.shape[-1])  # [M, rows·T, in]
        delta = torch.bmm(torch.bmm(xs, a.transpose(1, 2)), b.transpose(1, 2)).reshape(*x.shape[:-1], -1)
    else:
        parts, start = [], 0
        for name, n in route:
            part = x[start : start + n].to(dtype)
            if name == BASE:
                parts.append(torch.zeros(*part.shape[:-1], result.shape[-1], dtype=dtype, device=x.device))
            else:
                parts.append(self.lora_B[name](self.lora_A[name](part)))
            start += n
        delta = torch.cat(parts)
    return (result + delta * scaling.pop()).to(result.dtype)
