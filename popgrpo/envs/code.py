"""The code environment (``env.kind=code``): problems with their own tests, the tests a program passes its reward.

A member of a code run samples completions of problems' prompts, as any text member does
(:class:`popgrpo.envs.text.TextEnv`: the same embeddings, behaviours and reward callables). What
differs is the reward:

* **Problems** come from ``env.code`` (:mod:`popgrpo.envs.problems`: the built-in set,
  HumanEval, or a file of rows, every row checked before training). The training prompts are
  the problems outside the held-out split; a member draws its step's prompts from them with its
  own seeded generator (:class:`~popgrpo.algorithms.rollouts.TextRollouts`).
* **The reward** of a completion is its problem's tests, run on the program it stands for
  (``env.code.program``) by the sandbox's harness (:mod:`popgrpo.envs.harness`): the share of
  tests passed, or 1 only when all pass (``env.code.reward``). Each test's reason (``passed``,
  ``failed``, ``error``, ``timeout``) is counted in ``reward_reasons`` as ``tests:<reason>``,
  and a run the sandbox stopped as a whole as ``run:<reason>``. A completion *succeeds* (the
  ``success`` column, and pass@k) when it passes every test.
* **Reward callables** of ``env.text.rewards`` are added with their weights, and get the
  columns ``env.code.columns.extra`` names as keyword lists (TRL's convention).
* **Programs start early**: a member hands each completion's tests to the sandbox pool as soon
  as the completion is generated (:meth:`CodeEnv.prefetch`), as the program task does.

The epoch's pass@k, problems solved and distinct correct solutions are computed from what this
environment says of each completion (:meth:`CodeEnv.problem_id`, :meth:`CodeEnv.solution_key`)
by :mod:`popgrpo.algorithms.code_metrics`.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from popgrpo.envs.harness import TestRun, submit_tests
from popgrpo.envs.problems import Columns, Problem, ProblemSetError, build_program, load_problems, solution_key, split
from popgrpo.envs.text import TextEnv, TextScores

if TYPE_CHECKING:
    from popgrpo.config import Config, EnvConfig
    from popgrpo.config.schema import CodeEnvConfig
    from popgrpo.envs.sandbox import Sandbox

__all__ = ["CodeEnv", "ProblemEnvironment", "check_problems", "problem_set"]

_CACHE: dict[str, list[Problem]] = {}
_CACHE_LOCK = threading.Lock()


@runtime_checkable
class ProblemEnvironment(Protocol):
    """What the epoch's code metrics ask of an environment whose prompts are problems."""

    def problem_id(self, prompt: str) -> str:
        """The id of the problem ``prompt`` is the prompt of."""
        ...

    def solution_key(self, prompt: str, completion: str) -> str:
        """A key equal for two completions of one problem exactly when their programs are the same
        solution up to renaming (:func:`popgrpo.envs.problems.solution_key`)."""
        ...


def _columns(cfg: CodeEnvConfig) -> Columns:
    c = cfg.columns
    return Columns(c.prompt, c.tests, c.entry_point, c.id, c.setup, tuple(c.extra))


def _cache_key(cfg: CodeEnvConfig) -> str:
    """What the problem set depends on: the config's fields and, for a file, its size and mtime."""
    stamp: list[object] = []
    path = Path(cfg.problems)
    if not cfg.rows and cfg.problems not in ("builtin", "humaneval") and path.is_file():
        info = path.stat()
        stamp = [info.st_size, info.st_mtime_ns]
    fields = cfg.model_dump(
        mode="json", include={"problems", "rows", "columns", "limit", "builtin_size", "builtin_seed"}
    )
    return json.dumps([fields, stamp], sort_keys=True)


def problem_set(cfg: CodeEnvConfig) -> list[Problem]:
    """Every problem of ``env.code``, loaded and checked once per process (then cached).

    Raises :class:`~popgrpo.envs.problems.ProblemSetError` naming the first bad row and column.
    """
    key = _cache_key(cfg)
    with _CACHE_LOCK:
        if key not in _CACHE:
            if cfg.rows:
                source: Any = cfg.rows
            elif cfg.problems == "builtin":
                from popgrpo.envs.builtin_problems import builtin_rows

                source = builtin_rows(cfg.builtin_size, cfg.builtin_seed)
            else:
                source = cfg.problems
            _CACHE[key] = load_problems(source, _columns(cfg), cfg.limit)
        return _CACHE[key]


def check_problems(config: Config) -> None:
    """Load and check a code run's problems and split before anything starts (the CLI turns the
    :class:`~popgrpo.envs.problems.ProblemSetError` into one line and exit status 2; see
    :meth:`popgrpo.envs.kinds.CodeKind.check_inputs`)."""
    cfg = config.env.code
    try:
        split(problem_set(cfg), cfg.heldout_fraction, cfg.split_seed)
    except ProblemSetError as exc:
        raise ProblemSetError(f"env.code.problems: {exc}") from None


class CodeEnv(TextEnv):
    """A :class:`~popgrpo.envs.text.TextEnv` whose prompts are problems and whose reward is their tests.

    Args:
        cfg: the whole :class:`popgrpo.config.EnvConfig` (``env.code`` and ``env.text``).
        device: where the embedding model runs.
    """

    def __init__(self, cfg: EnvConfig, device: str | torch.device = "cpu") -> None:
        self.code = cfg.code
        problems = problem_set(cfg.code)
        self.train_problems, self.heldout_problems = split(problems, cfg.code.heldout_fraction, cfg.code.split_seed)
        self._by_prompt = {p.prompt: p for p in problems}
        text = cfg.text.model_copy(update={"prompts": [p.prompt for p in self.train_problems], "prompts_path": None})
        super().__init__(text, device)
        self.heldout_prompts = [p.prompt for p in self.heldout_problems]
        self._started: dict[tuple[str, str], deque[Future[TestRun]]] = {}
        self._started_lock = threading.Lock()
        self.last_runs: list[TestRun] = []

    # ---- problems ---------------------------------------------------------------------------
    def problem(self, prompt: str) -> Problem:
        try:
            return self._by_prompt[prompt]
        except KeyError:
            raise ValueError(f"env.kind=code: {prompt[:60]!r} is not the prompt of a problem") from None

    def problem_id(self, prompt: str) -> str:
        return self.problem(prompt).id

    def program(self, prompt: str, completion: str) -> str | None:
        """The program ``completion`` stands for (``env.code.program``)."""
        return build_program(self.code.program, prompt, completion)

    def solution_key(self, prompt: str, completion: str) -> str:
        program = self.program(prompt, completion)
        entry = self.problem(prompt).tests.entry_point
        return solution_key(program or "", (entry,) if entry else ())

    def reward_columns(self, prompts: Sequence[str]) -> dict[str, list[object]]:
        columns = self.code.columns.extra
        return {c: [self.problem(p).columns.get(c) for p in prompts] for c in columns}

    # ---- running the tests ------------------------------------------------------------------
    @property
    def sandbox(self) -> Sandbox:
        """The process's warm pool (or one-shot sandbox) for ``env.code``'s limits."""
        from popgrpo.envs.rewards import execution_sandbox

        c = self.code
        return execution_sandbox(
            timeout_s=c.timeout_s,
            cpu_s=c.cpu_s,
            memory_mb=c.memory_mb,
            site_packages=c.site_packages,
            isolation=c.isolation,
            pool_size=self.cfg.sandbox_pool_size,
        )

    def submit(self, prompt: str, completion: str) -> Future[TestRun]:
        """Start one completion's tests; the Future gives its :class:`~popgrpo.envs.harness.TestRun`."""
        problem = self.problem(prompt)
        return submit_tests(
            self.sandbox,
            self.program(prompt, completion),
            problem.tests,
            float_tolerance=self.code.float_tolerance,
            max_output=self.code.max_output_chars,
        )

    def run_tests(self, prompts: Sequence[str], completions: Sequence[str]) -> list[TestRun]:
        """Each completion's test run (those :meth:`prefetch` started are taken, not run again)."""
        with self._started_lock:
            started, self._started = self._started, {}
        futures = []
        for pair in zip(prompts, completions, strict=True):
            queue = started.get(pair)
            futures.append(queue.popleft() if queue else self.submit(*pair))
        for queue in started.values():  # started for pairs not asked for: not needed
            for future in queue:
                future.cancel()
        return [f.result() for f in futures]

    @property
    def can_prefetch(self) -> bool:
        return True

    def prefetch(self, prompt: str, completion: str) -> None:
        future = self.submit(prompt, completion)
        with self._started_lock:
            self._started.setdefault((prompt, completion), deque()).append(future)
        super().prefetch(prompt, completion)

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> TextScores:
        """The tests' reward of each completion, plus the weighted reward callables; success = all tests passed."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        runs = self.run_tests(prompts, completions)
        self.last_runs = runs
        all_or_nothing = self.code.reward == "all"
        values = torch.tensor(
            [float(r.all_passed) if all_or_nothing else r.fraction for r in runs], dtype=torch.float32
        )
        reasons: Counter[str] = Counter()
        for run in runs:
            reasons.update(f"tests:{reason}" for reason in run.reasons)
            if run.run_reason != "ok":
                reasons[f"run:{run.run_reason}"] += 1
        success = torch.tensor([r.all_passed for r in runs], dtype=torch.bool)
        if self.rewards:
            extra = super().score(prompts, completions)
            values = values + extra.values
            reasons.update(extra.reasons)
        return TextScores(values, reasons, success)
