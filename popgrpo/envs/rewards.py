"""Built-in reward callables for the text environment (``env.text.rewards``).

Each is called as ``fn(prompts, completions, **kwargs)`` with one prompt per completion
(:class:`popgrpo.envs.text.TextEnv`), TRL's reward-function convention, and returns one float
per completion or ``(floats, reasons)``. Write your own the same way and name it by import
path in the config.

:class:`SandboxReward` is the execution reward for any other trainer: an object called as
``reward(completions, **kwargs)`` returning one float per completion, TRL's ``GRPOTrainer``
``reward_funcs`` convention (plain text or conversational completions), running the programs
in a warm sandbox pool (:mod:`popgrpo.envs.sandbox.pool`). When the dataset has a tests column
(``test``, ``test_list``, ``tests``, ``input_output``...), TRL passes it and each row is scored
against its own tests by the sandbox's harness (:mod:`popgrpo.envs.harness`).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from popgrpo.envs.sandbox import ExecutionResult, Sandbox

__all__ = ["SandboxReward", "execution_sandbox", "execution_score", "target_fraction"]


def target_fraction(prompts: Sequence[str], completions: Sequence[str], target: str = "a") -> list[float]:
    """Share of a completion's characters that are one of the characters of ``target`` (0 when empty).

    A verifiable synthetic reward: with a character-level tokenizer and one target character
    it is the fraction of target tokens. With a set of characters (e.g. digits and operators)
    it is a format reward, the dense companion of a sparse execution reward.
    """
    if not target:
        raise ValueError("target must name at least one character")
    allowed = set(target)
    return [sum(ch in allowed for ch in c) / len(c) if c else 0.0 for c in completions]


def execution_score(
    prompts: Sequence[str],
    completions: Sequence[str],
    template: str = "{code}",
    fenced: bool = True,
    timeout_s: float = 5.0,
    cpu_s: int = 5,
    memory_mb: int = 512,
    max_workers: int | None = None,
    score_range: Sequence[float] = (0.0, 1.0),
    site_packages: bool = True,
    isolation: str = "bwrap",
    pool_size: int | None = 0,
    **columns: Sequence[Any],
) -> tuple[list[float], list[str]]:
    """Run each completion's code in the sandbox; the program's global ``score`` is the reward.

    The program is ``template`` with ``{code}`` replaced by the completion's code (its last
    fenced block when ``fenced``, else the whole completion) and ``{prompt}`` by the prompt
    (as a Python string literal); any other field names a dataset column (``columns``: passed
    as keyword lists, TRL's convention, e.g. ``env.text.columns``), replaced by the
    completion's value as a Python literal. The program must run to its end and leave a number in the
    global ``score``, inside ``score_range`` (default ``[0, 1]``; outside scores 0,
    ``out_of_range``). Printed output is never a score. A run that times out, exhausts memory,
    crashes, touches what it may not, leaves a process behind or sets no score scores 0, with that
    reason (:mod:`popgrpo.envs.sandbox`). Programs run in parallel, ``max_workers`` at a time;
    ``site_packages=False`` starts them with the standard library only, several times faster.
    ``isolation="none"`` runs them without bubblewrap and seccomp (explicit opt-out, warned).

    ``pool_size``: 0 starts a fresh sandbox for each program when it is needed (one-shot); ``N``
    runs them in this process's warm pool of ``N`` sandboxes for these settings, kept between
    calls (:func:`popgrpo.envs.sandbox.pool.shared_pool`); None: a pool of the default size. The
    results are the same either way. With ``env.kind=text`` it comes from
    ``env.text.sandbox_pool_size`` unless the reward's kwargs set it.

    The template runs in the same interpreter as the code it wraps: compute the score after the
    code, from values whose type you check (``type(value) in (int, float)``), so that an object
    the code returns cannot compute its own score.
    """
    programs = _programs(prompts, completions, template, fenced, columns)
    sandbox = execution_sandbox(
        timeout_s, cpu_s, memory_mb, max_workers, score_range, site_packages, isolation, pool_size
    )
    results = sandbox.run_many(programs)
    return [r.score for r in results], [r.reason for r in results]


def execution_sandbox(
    timeout_s: float = 5.0,
    cpu_s: int = 5,
    memory_mb: int = 512,
    max_workers: int | None = None,
    score_range: Sequence[float] = (0.0, 1.0),
    site_packages: bool = True,
    isolation: str = "bwrap",
    pool_size: int | None = 0,
) -> Sandbox:
    """The sandbox :func:`execution_score` runs its programs in, for these settings.

    ``pool_size`` 0: the process's one-shot sandbox (a fresh sandbox per program); otherwise the
    process's warm pool (:func:`popgrpo.envs.sandbox.pool.shared_pool`). Both are kept for the
    process's life and shared by every caller with the same settings.
    """
    from popgrpo.envs.sandbox import SandboxLimits

    limits = SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb)
    lo, hi = score_range
    span = (float(lo), float(hi))
    if pool_size == 0:
        from popgrpo.envs.sandbox.reward import default_sandbox_for

        return default_sandbox_for(limits, max_workers, span, site_packages, isolation)
    from popgrpo.envs.sandbox.pool import shared_pool

    return shared_pool(limits, pool_size, max_workers, span, site_packages=site_packages, isolation=isolation)


def _programs(
    prompts: Sequence[str],
    completions: Sequence[str],
    template: str,
    fenced: bool,
    columns: Mapping[str, Any] | None = None,
) -> list[str | None]:
    """Each completion's program (``template`` around its code), None where it has no code.

    ``{prompt}`` and any other field the template names (a dataset column of ``columns``, one
    value per completion) become Python literals (``repr``); ``{code}`` is the code itself.
    """
    from popgrpo.envs.sandbox import extract_code

    fields = {name for _, name, _, _ in string.Formatter().parse(template) if name} - {"code", "prompt"}
    columns = columns or {}
    missing = sorted(f for f in fields if f not in columns)
    if missing:
        raise ValueError(f"the template names {missing}, which are neither code, prompt nor a column of the call")
    for name in fields:
        if len(columns[name]) != len(completions):
            raise ValueError(f"column {name!r}: {len(columns[name])} values for {len(completions)} completions")
    programs: list[str | None] = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        code = extract_code(completion) if fenced else completion
        values = {name: repr(columns[name][i]) for name in fields}
        programs.append(None if code is None else template.format(code=code, prompt=repr(prompt), **values))
    return programs


def _text(item: Any) -> str:
    """A completion or prompt as text: a string, or TRL's conversational form (a list of
    ``{"role", "content"}`` messages: the last message's content)."""
    if isinstance(item, str):
        return item
    if isinstance(item, Sequence) and item and isinstance(item[-1], dict):
        content = item[-1].get("content", "")
        if isinstance(content, str):
            return content
        # content parts, as in multimodal chat templates: keep the text parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise TypeError(f"expected a completion as str or a list of chat messages, got {type(item).__name__}")


class SandboxReward:
    """Sandboxed execution reward for any trainer: ``reward(completions, **kwargs) -> list[float]``.

    The signature of TRL's ``GRPOTrainer(reward_funcs=[...])``: TRL calls it with
    ``prompts=``, ``completions=``, ``completion_ids=`` and the dataset's columns as keywords;
    a completion may be text or a list of chat messages (the last message is the answer). The
    program and its score are as for :func:`execution_score` (same ``template``, ``fenced``,
    limits, ``score_range``). Programs run in this process's warm pool of ``pool_size``
    sandboxes (None: :func:`popgrpo.envs.sandbox.pool.default_pool_size`; 0: a fresh sandbox per
    program, started when it is needed). The reasons of the last call are kept in
    :attr:`last_reasons`.

    :meth:`submit` hands over one completion as soon as it is generated and returns a Future,
    for a trainer that overlaps execution with generation. The object holds only its settings
    (the pool is the process's), so it pickles.

    **Problems with their own tests.** When the call carries a tests column (``tests_column``, or
    the first of :data:`popgrpo.envs.problems.TEST_COLUMNS` present, e.g. HumanEval's ``test``
    with ``entry_point``, MBPP's ``test_list`` with ``test_setup_code``, APPS's
    ``input_output``), each completion is scored against its own row's tests instead of the
    template: the program is ``program`` (:func:`popgrpo.envs.problems.build_program`: by default
    the completion's fenced block if it has one, else the prompt continued by the completion, as
    HumanEval's plain-text completions are), the reward the share of tests passed
    (``tests_reward="fraction"``) or 1 only when all pass (``"all"``). :attr:`last_runs` keeps
    each row's :class:`~popgrpo.envs.harness.TestRun`; :attr:`last_reasons` is ``passed`` for a
    row that passed every test, else its first other test reason (``failed``, ``error``,
    ``timeout``). A row whose tests cannot be read raises ``ValueError`` naming the row and column.

    Example (TRL)::

        from trl import GRPOConfig, GRPOTrainer
        from popgrpo.envs.rewards import SandboxReward

        reward = SandboxReward(timeout_s=2, memory_mb=256, site_packages=False)
        trainer = GRPOTrainer(model=..., reward_funcs=[reward], args=GRPOConfig(...), train_dataset=...)
    """

    def __init__(
        self,
        template: str = "{code}",
        fenced: bool = True,
        timeout_s: float = 5.0,
        cpu_s: int = 5,
        memory_mb: int = 512,
        score_range: Sequence[float] = (0.0, 1.0),
        site_packages: bool = True,
        isolation: str = "bwrap",
        pool_size: int | None = None,
        max_workers: int | None = None,
        name: str = "sandbox_execution",
        program: str = "auto",
        tests_reward: str = "fraction",
        tests_column: str | None = None,
        float_tolerance: float = 1e-6,
    ) -> None:
        from popgrpo.envs.sandbox import SandboxLimits

        self.limits = SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb)
        lo, hi = score_range
        self.score_range = (float(lo), float(hi))
        self.template, self.fenced = template, fenced
        self.site_packages, self.isolation = site_packages, isolation
        self.pool_size, self.max_workers = pool_size, max_workers
        self.__name__ = name  # what TRL logs the reward as
        self.last_reasons: list[str] = []
        if tests_reward not in ("fraction", "all"):
            raise ValueError(f"tests_reward must be 'fraction' or 'all', got {tests_reward!r}")
        from popgrpo.envs.problems import PROGRAM_MODES

        if program not in PROGRAM_MODES:
            raise ValueError(f"program must be one of {PROGRAM_MODES}, got {program!r}")
        self.program, self.tests_reward, self.tests_column = program, tests_reward, tests_column
        self.float_tolerance = float_tolerance
        self.last_runs: list[Any] = []

    @property
    def sandbox(self) -> Sandbox:
        """The process's pool for these settings (or, with ``pool_size=0``, a one-shot sandbox)."""
        if self.pool_size == 0:
            from popgrpo.envs.sandbox.reward import default_sandbox_for

            return default_sandbox_for(
                self.limits, self.max_workers, self.score_range, self.site_packages, self.isolation
            )
        from popgrpo.envs.sandbox.pool import shared_pool

        return shared_pool(
            self.limits,
            self.pool_size,
            self.max_workers,
            self.score_range,
            site_packages=self.site_packages,
            isolation=self.isolation,
        )

    def __call__(self, completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any) -> list[float]:
        """One reward per completion (0 where the program failed; see :attr:`last_reasons`)."""
        texts = [_text(c) for c in completions]
        prompt_texts = [_text(p) for p in prompts] if prompts is not None else [""] * len(texts)
        from popgrpo.envs.problems import TEST_COLUMNS

        column = self.tests_column or next((c for c in TEST_COLUMNS if c in kwargs), None)
        if column is not None:
            return self._score_tests(texts, prompt_texts, column, kwargs)
        results = self.sandbox.run_many(_programs(prompt_texts, texts, self.template, self.fenced, kwargs))
        self.last_reasons = [r.reason for r in results]
        return [r.score for r in results]

    def _score_tests(self, texts: list[str], prompts: list[str], column: str, columns: dict[str, Any]) -> list[float]:
        """Each completion scored against its own row's tests (see the class docstring)."""
        from popgrpo.envs.harness import submit_tests
        from popgrpo.envs.problems import build_program, parse_tests

        n = len(texts)
        tests, entry_points = columns.get(column), columns.get("entry_point")
        setups = columns.get("test_setup_code")
        for name, values in ((column, tests), ("entry_point", entry_points), ("test_setup_code", setups)):
            if values is not None and len(values) != n:
                raise ValueError(f"column {name!r}: {len(values)} values for {n} completions")
        futures = []
        for i in range(n):
            entry = entry_points[i] if entry_points is not None else None
            setup = (setups[i] if setups is not None else None) or ""
            try:
                spec = parse_tests(tests[i] if tests is not None else None, entry or None, setup)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"row {i}, column {column!r}: {exc}") from None
            program = build_program(self.program, prompts[i], texts[i])
            futures.append(submit_tests(self.sandbox, program, spec, float_tolerance=self.float_tolerance))
        runs = [f.result() for f in futures]
        self.last_runs = runs
        self.last_reasons = [
            "passed" if r.all_passed else next((x for x in r.reasons if x != "passed"), "error") for r in runs
        ]
        if self.tests_reward == "all":
            return [float(r.all_passed) for r in runs]
        return [r.fraction for r in runs]

    def submit(self, completion: Any, prompt: Any = "") -> Future[ExecutionResult]:
        """Start one completion's program now; the Future gives its :class:`ExecutionResult`."""
        [program] = _programs([_text(prompt)], [_text(completion)], self.template, self.fenced)
        return self.sandbox.submit_one(program)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "last_reasons": [], "last_runs": []}
