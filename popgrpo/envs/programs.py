"""Short Python programs: the pre-training corpus of ``popgrpo lm pretrain`` and the program task's reward.

**The corpus** (:func:`generate_program`, :func:`generate_corpus`): each document is a header
comment naming a style (one of :data:`STYLES`), then a program of that style that ends with
``result = ...`` and ``print(result)``. Sizes are drawn per program, so the corpus spans
one-line arithmetic to loops with branches and helper functions. Every generated program is
valid: it runs in well under a second and leaves an ``int`` in ``result`` (divisors and
exponents are drawn so that nothing divides by zero or explodes).

**The task** (:func:`program_reward`, the reward of ``jobs/configs/lm_programs.yaml``): a
prompt is a header line; the policy writes the program. The reward follows the paper's
simulated environment (main paper eqs. 1–2), ``R = Q · B``, on real programs:

* ``B`` is execution success: the program, run in the sandbox (:mod:`popgrpo.envs.sandbox`),
  ends and leaves a number in ``result``. Nothing about it is simulated: a program fails when
  it crashes (a ``NameError``, a ``SyntaxError``, a division by zero), times out or sets no
  ``result``, and longer programs written by a small model fail more often.
* ``Q`` is the quality ceiling, rising with the program's complexity: ``Q = 1 − exp(−n/κ)``
  with ``n`` the number of operations in the program's syntax tree (:func:`count_operations`:
  arithmetic, comparisons, calls, subscripts, loops, branches, functions) and ``κ``
  (``scale``, default 6). A one-line sum (``n = 1``) has ``Q ≈ 0.15``; a loop with a branch
  and a helper (``n ≈ 15``) ``Q ≈ 0.92``.

``Q`` is computed in the trainer from the program's text (``ast.parse`` never runs code), so a
program cannot report its own complexity; the sandbox only says whether it ran.
"""

from __future__ import annotations

import ast
import math
import random
import sys
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from popgrpo.envs.sandbox import ExecutionResult, Sandbox

__all__ = [
    "OPERATION_NODES",
    "STYLES",
    "count_operations",
    "generate_corpus",
    "generate_program",
    "header",
    "pooled_program_reward",
    "program_quality",
    "program_reward",
    "submit_program",
]

STYLES = ("arithmetic", "loop", "function", "list", "while", "branch")

# The syntax-tree nodes that count as one operation each in a program's complexity.
OPERATION_NODES = (
    ast.BinOp,
    ast.AugAssign,
    ast.UnaryOp,
    ast.Compare,
    ast.BoolOp,
    ast.Call,
    ast.Subscript,
    ast.IfExp,
    ast.ListComp,
    ast.For,
    ast.While,
    ast.If,
    ast.FunctionDef,
)

# The program task's sandbox template: the program, then its `result` handed over as the score.
# B = 1 when the sandbox reports `ok`: the sandbox child, outside the program's reach, accepts only a
# finite int or float (no bool; a subclass read through its base, none of its methods called), so a
# program that shadows `type`, `int` or the builtins cannot pass anything else off as a number.
# Anything else leaves no score (`no_score`); no `result` at all is a NameError (`crash`).
SUCCESS_TEMPLATE = "{code}\nscore = result\n"

_ANY_NUMBER = (-sys.float_info.max, sys.float_info.max)  # score_range: B is whether it ran, not its value

_NAMES = ("a", "b", "c", "x", "y", "n", "m", "k", "total", "value", "step", "acc")
_ADD_OPS = ("+", "-", "*")


def header(style: str) -> str:
    """The header line a program of ``style`` starts with: the task's prompt."""
    return f"# {style}\n"


def _expr(rng: random.Random, names: Sequence[str], depth: int = 0) -> str:
    """A small integer expression over ``names`` and constants (no division, no powers)."""
    if depth >= 2 or rng.random() < 0.45:
        if names and rng.random() < 0.6:
            return rng.choice(list(names))
        return str(rng.randint(1, 12))
    op = rng.choice(_ADD_OPS)
    left, right = _expr(rng, names, depth + 1), _expr(rng, names, depth + 1)
    text = f"{left} {op} {right}"
    return f"({text})" if depth else text


def _fresh(rng: random.Random, used: list[str]) -> str:
    free = [n for n in _NAMES if n not in used]
    return rng.choice(free) if free else f"v{len(used)}"


def _arithmetic(rng: random.Random, size: int) -> list[str]:
    lines, names = [], []
    for _ in range(size):
        name = _fresh(rng, names)
        lines.append(f"{name} = {_expr(rng, names)}")
        names.append(name)
    tail = rng.choice(["", f" // {rng.randint(1, 5)}", f" % {rng.randint(2, 97)}"]) if names else ""
    lines.append(f"result = {_expr(rng, names, depth=1) if len(names) > 1 else names[0]}{tail}")
    return lines


def _loop(rng: random.Random, size: int) -> list[str]:
    acc = rng.choice(["total", "acc", "s"])
    var = rng.choice(["i", "j", "t"])
    lines = [f"{acc} = {rng.randint(0, 5)}", f"for {var} in range({rng.randint(1, 4)}, {rng.randint(5, 15)}):"]
    for _ in range(max(1, size - 1)):
        if rng.random() < 0.35:
            lines += [f"    if {var} % {rng.randint(2, 4)} == 0:", f"        {acc} += {_expr(rng, [var])}"]
        else:
            lines.append(f"    {acc} {rng.choice(['+=', '-='])} {_expr(rng, [var])}")
    lines.append(f"result = {acc}")
    return lines


def _function(rng: random.Random, size: int) -> list[str]:
    name = rng.choice(["f", "g", "area", "scale", "twice"])
    lines = [f"def {name}(x):"]
    if size > 2 and rng.random() < 0.5:
        lines += [f"    if x > {rng.randint(2, 9)}:", f"        return {_expr(rng, ['x'])}"]
    lines.append(f"    return {_expr(rng, ['x'])}")
    calls = [f"{name}({rng.randint(1, 10)})" for _ in range(max(1, size - 1))]
    lines.append(f"result = {' + '.join(calls)}")
    return lines


def _list(rng: random.Random, size: int) -> list[str]:
    if rng.random() < 0.5:
        items = ", ".join(str(rng.randint(0, 20)) for _ in range(size + 1))
        lines = [f"xs = [{items}]"]
    else:
        lines = [f"xs = [{_expr(rng, ['i'])} for i in range({rng.randint(2, 10)})]"]
    reducer = rng.choice(["sum(xs)", "max(xs)", "min(xs)", "len(xs)", "xs[0]", "xs[-1]", "sum(xs) // len(xs)"])
    if size > 2:
        lines.append(f"ys = [v {rng.choice(_ADD_OPS)} {rng.randint(1, 5)} for v in xs]")
        reducer = reducer.replace("xs", "ys")
    lines.append(f"result = {reducer}")
    return lines


def _while(rng: random.Random, size: int) -> list[str]:
    lines = [f"n = {rng.randint(5, 200)}", "count = 0", "while n > 1:"]
    if size > 2:
        lines += ["    if n % 2 == 0:", "        n = n // 2", "    else:", f"        n = n - {rng.randint(1, 3)}"]
    else:
        lines.append(f"    n = n // {rng.randint(2, 3)}")
    lines.append("    count += 1")
    lines.append(f"result = count{rng.choice(['', f' * {rng.randint(2, 5)}', f' + {rng.randint(1, 9)}'])}")
    return lines


def _branch(rng: random.Random, size: int) -> list[str]:
    lines, names = [], []
    for _ in range(max(1, size - 1)):
        name = _fresh(rng, names)
        lines.append(f"{name} = {_expr(rng, names)}")
        names.append(name)
    first = names[0]
    lines += [
        f"if {first} > {rng.randint(1, 30)}:",
        f"    result = {_expr(rng, names)}",
        "else:",
        f"    result = {_expr(rng, names)}",
    ]
    return lines


_BUILDERS = {
    "arithmetic": _arithmetic,
    "loop": _loop,
    "function": _function,
    "list": _list,
    "while": _while,
    "branch": _branch,
}


def generate_program(rng: random.Random, style: str | None = None) -> str:
    """One corpus document: :func:`header` of the style, the program, ``print(result)``.

    ``size`` (the program's number of statements or terms, 1–6) is drawn per program, so
    lengths vary within every style.
    """
    style = style or rng.choice(STYLES)
    size = rng.randint(1, 6)
    lines = _BUILDERS[style](rng, size)
    return header(style) + "\n".join([*lines, "print(result)"]) + "\n"


def generate_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` documents from :func:`generate_program`, all styles mixed, seeded."""
    rng = random.Random(seed)
    return [generate_program(rng) for _ in range(n)]


def count_operations(code: str) -> int | None:
    """The number of :data:`OPERATION_NODES` in ``code``'s syntax tree; None if it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return sum(isinstance(node, OPERATION_NODES) for node in ast.walk(tree))


def program_quality(code: str, scale: float = 6.0) -> float:
    """``Q = 1 − exp(−n/scale)`` with ``n`` = :func:`count_operations` (0 when it does not parse)."""
    n = count_operations(code)
    return 0.0 if not n else 1.0 - math.exp(-n / scale)


def program_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    scale: float = 6.0,
    timeout_s: float = 2.0,
    cpu_s: int = 2,
    memory_mb: int = 256,
    max_workers: int | None = None,
    isolation: str = "bwrap",
    pool_size: int | None = 0,
) -> tuple[list[float], list[str]]:
    """The program task's reward ``Q · B`` per completion, and the sandbox's reason for each.

    The completion is the program itself (the prompt, its header, is a comment and is not
    part of it). ``B`` comes from running it in the sandbox with the standard library only
    (:data:`SUCCESS_TEMPLATE`); ``Q`` from :func:`program_quality`. Reasons are the
    sandbox's (``ok``, ``crash``, ``timeout``, ``no_score``, ...). ``pool_size`` as for
    :func:`popgrpo.envs.rewards.execution_score` (a warm sandbox pool, or 0: one-shot).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    sandbox = _program_sandbox(timeout_s, cpu_s, memory_mb, max_workers, isolation, pool_size)
    results = sandbox.run_many([SUCCESS_TEMPLATE.format(code=code) for code in completions])
    outcomes = [_outcome(code, result, scale) for code, result in zip(completions, results, strict=True)]
    return [reward for reward, _ in outcomes], [reason for _, reason in outcomes]


def _program_sandbox(
    timeout_s: float, cpu_s: int, memory_mb: int, max_workers: int | None, isolation: str, pool_size: int | None
) -> Sandbox:
    """The sandbox programs run in for :func:`program_reward` and :func:`submit_program`: the
    standard library only, any finite number a score (``B`` is whether the program ran)."""
    from popgrpo.envs.rewards import execution_sandbox

    return execution_sandbox(
        timeout_s=timeout_s,
        cpu_s=cpu_s,
        memory_mb=memory_mb,
        max_workers=max_workers,
        score_range=_ANY_NUMBER,
        site_packages=False,
        isolation=isolation,
        pool_size=pool_size,
    )


def _outcome(code: str, result: ExecutionResult, scale: float) -> tuple[float, str]:
    """A program's ``(Q·B, reason)`` from its sandbox result: :func:`program_reward`'s rule for one."""
    return (program_quality(code, scale) if result.reason == "ok" else 0.0), result.reason


def submit_program(
    prompt: str,
    completion: str,
    scale: float = 6.0,
    timeout_s: float = 2.0,
    cpu_s: int = 2,
    memory_mb: int = 256,
    max_workers: int | None = None,
    isolation: str = "bwrap",
    pool_size: int | None = 0,
) -> Future[tuple[float, str]]:
    """Start one completion's program now; the Future gives its ``(Q·B, reason)``.

    The same sandbox, limits and rule as :func:`program_reward` (which takes the same
    keywords), for a trainer that hands each program over as soon as its completion is
    generated (:meth:`popgrpo.envs.text.TextEnv.prefetch`). ``prompt`` is not part of the program.
    """
    sandbox = _program_sandbox(timeout_s, cpu_s, memory_mb, max_workers, isolation, pool_size)
    running = sandbox.submit_one(SUCCESS_TEMPLATE.format(code=completion))
    done: Future[tuple[float, str]] = Future()

    def _finish(future: Future[ExecutionResult]) -> None:
        try:
            done.set_result(_outcome(completion, future.result(), scale))
        except BaseException as exc:  # cancelled, or the sandbox failed: the caller sees it
            done.set_exception(exc)

    running.add_done_callback(_finish)
    return done


# TextEnv.prefetch starts a reward callable's programs one by one through its ``submit_one``.
program_reward.submit_one = submit_program  # pyright: ignore[reportFunctionMemberAccess]


def pooled_program_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    scale: float = 6.0,
    timeout_s: float = 2.0,
    cpu_s: int = 2,
    memory_mb: int = 256,
    pool_size: int | None = None,
    **kwargs: Any,
) -> list[float]:
    """:func:`program_reward`'s ``Q · B`` per completion as a plain reward function.

    Runs the programs in this process's warm sandbox pool (``pool_size`` None: the default
    size, :func:`popgrpo.envs.sandbox.pool.default_pool_size`) and returns one float per
    completion, TRL's ``GRPOTrainer(reward_funcs=[...])`` convention: TRL's other keywords
    (``completion_ids``, the dataset's columns, ``trainer_state``) are accepted and ignored. The
    values are those popgrpo's ``lm_programs`` members train on for the same completions.
    """
    del kwargs  # what TRL passes besides prompts and completions
    return program_reward(
        prompts, completions, scale=scale, timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, pool_size=pool_size
    )[0]


def length_table(
    lengths: Sequence[int], rewards: Sequence[float], reasons: Sequence[str], edges: Sequence[int]
) -> list[dict]:
    """Success rate and reward of sampled programs, by completion length in tokens.

    ``edges`` are the bins' upper bounds (inclusive), increasing; a length above the last
    edge falls in the last bin. Each row: ``tokens`` (``"lo–hi"``), ``n``, ``success`` (share
    with reason ``ok``), ``reward`` (mean ``Q·B``), ``reward_if_ok`` (mean over the successes:
    the ceiling ``Q`` those programs reached; NaN when none), and the share of each failure
    reason. Empty bins are left out.
    """
    if not edges or list(edges) != sorted(edges):
        raise ValueError(f"edges must be increasing upper bounds, got {list(edges)}")
    rows, low = [], 1
    for i, high in enumerate(edges):
        last = i == len(edges) - 1
        picked = [j for j, n in enumerate(lengths) if low <= n and (n <= high or last)]
        if picked:
            ok = [j for j in picked if reasons[j] == "ok"]
            failures = sorted({reasons[j] for j in picked} - {"ok"})
            rows.append(
                {
                    "tokens": f"{low}–{high}" if not last else f"{low}–",
                    "n": len(picked),
                    "success": len(ok) / len(picked),
                    "reward": sum(rewards[j] for j in picked) / len(picked),
                    "reward_if_ok": sum(rewards[j] for j in ok) / len(ok) if ok else math.nan,
                    **{f"fail_{r}": sum(reasons[j] == r for j in picked) / len(picked) for r in failures},
                }
            )
        low = high + 1
    return rows
