"""The built-in problem set (``env.code.problems: builtin``): small program problems with tests.

Made here, in the spirit of the program task (:mod:`popgrpo.envs.programs`), so that the model
``popgrpo lm pretrain`` trains on that task's corpus partly solves them from the start and RL
has something to learn, with nothing downloaded. Each problem's prompt is the beginning of a
program of the corpus's kind (its header line naming the style, then some of its lines); the
completion finishes it (``env.code.program: prompt+completion``). Three kinds, a third each:

``function`` (call-based tests)   the prompt is ``def f(x):`` and its first branch,
                                  ``if x > c: return e1``; the tests call ``f`` on inputs on
                                  both sides of ``c``. Those above ``c`` pass whenever the
                                  completion runs at all; those below need the missing
                                  ``return e2``, so the share of tests passed rises by degrees.
``program`` (stdin/stdout test)   a corpus program without its last line or two: the test
                                  expects what the whole program prints. With only
                                  ``print(result)`` missing it is easy, with the line that
                                  computes ``result`` missing it is not.
``result`` (assert tests)         the same, missing the line that computes ``result`` and the
                                  ``print``: ``assert isinstance(result, int)`` passes for any
                                  whole number, ``assert result == N`` only for the right one.

The expected values come from running the reference programs, which this module writes (not a
policy): they are popgrpo's own code, executed here once with ``exec``. The set is seeded
(:func:`builtin_rows`): the same ``(size, seed)`` gives the same rows.
"""

from __future__ import annotations

import contextlib
import functools
import io
import random
from typing import Any

from popgrpo.envs.programs import STYLES, _expr, generate_program, header  # pyright: ignore[reportPrivateUsage]

__all__ = ["KINDS", "builtin_rows"]

KINDS = ("function", "program", "result")
_FUNCTION_NAMES = ("f", "g", "area", "scale", "twice")
_PROGRAM_STYLES = tuple(s for s in STYLES if s != "function")


def _run(source: str) -> dict[str, Any]:
    """The namespace of one reference program run to its end (its prints go nowhere)."""
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, "<reference>", "exec"), namespace)  # popgrpo's own generated program
    return namespace


def _function_row(rng: random.Random, index: int) -> dict[str, Any]:
    name = rng.choice(_FUNCTION_NAMES)
    threshold = rng.randint(2, 9)
    above, below = _expr(rng, ["x"]), _expr(rng, ["x"])
    prompt = f"{header('function')}def {name}(x):\n    if x > {threshold}:\n        return {above}\n"
    reference = _run(f"{prompt}    return {below}\n")[name]
    xs = sorted(rng.sample(range(threshold + 1, threshold + 12), 2) + rng.sample(range(0, threshold + 1), 3))
    return {
        "task_id": f"builtin/function/{index}",
        "prompt": prompt,
        "entry_point": name,
        "input_output": {"inputs": [[x] for x in xs], "outputs": [reference(x) for x in xs], "fn_name": name},
        "kind": "function",
        "solution": f"    return {below}\n",
    }


def _program_lines(rng: random.Random) -> tuple[str, list[str]]:
    style = rng.choice(_PROGRAM_STYLES)
    lines = generate_program(rng, style).rstrip("\n").split("\n")
    return style, lines  # header, body ..., "result = ...", "print(result)"


def _result_line(lines: list[str]) -> int:
    """Where the statement that sets ``result`` starts in a program without its ``print``: the last
    line, or the ``if`` four lines up when a branch sets it on both sides."""
    if len(lines) >= 5 and lines[-2] == "else:" and lines[-4].startswith("if "):
        return len(lines) - 4
    return len(lines) - 1


def _program_row(rng: random.Random, index: int) -> dict[str, Any]:
    _, lines = _program_lines(rng)
    expected = _run("\n".join(lines) + "\n")["result"]
    cut = len(lines) - 1 if rng.random() < 0.5 else _result_line(lines[:-1])
    return {
        "task_id": f"builtin/program/{index}",
        "prompt": "\n".join(lines[:cut]) + "\n",
        "tests": [{"input": "", "output": f"{expected}\n", "testtype": "stdin"}],
        "kind": "program",
        "solution": "\n".join(lines[cut:]) + "\n",
    }


def _result_row(rng: random.Random, index: int) -> dict[str, Any]:
    _, lines = _program_lines(rng)
    expected = _run("\n".join(lines) + "\n")["result"]
    cut = _result_line(lines[:-1])
    return {
        "task_id": f"builtin/result/{index}",
        "prompt": "\n".join(lines[:cut]) + "\n",
        "test_list": ["assert isinstance(result, int)", f"assert result == {expected!r}"],
        "kind": "result",
        "solution": "\n".join(lines[cut:]) + "\n",
    }


_MAKERS = {"function": _function_row, "program": _program_row, "result": _result_row}


@functools.lru_cache(maxsize=8)
def _rows(size: int, seed: int) -> tuple[dict[str, Any], ...]:
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    prompts: set[str] = set()
    attempts = 0
    while len(rows) < size:
        attempts += 1
        if attempts > 50 * size:
            raise RuntimeError(f"could not make {size} distinct built-in problems")
        kind = KINDS[len(rows) % len(KINDS)]
        row = _MAKERS[kind](rng, len(rows))
        if row["prompt"] in prompts:
            continue  # the same beginning twice: two problems the trainer could not tell apart
        prompts.add(row["prompt"])
        rows.append(row)
    return tuple(rows)


def builtin_rows(size: int = 300, seed: int = 0) -> list[dict[str, Any]]:
    """``size`` problems as rows (``task_id``, ``prompt``, their tests, ``kind`` and a reference
    ``solution``, the completion that passes every test), kinds in turn, seeded."""
    return [dict(row) for row in _rows(size, seed)]
