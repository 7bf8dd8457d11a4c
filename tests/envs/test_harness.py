"""The test harness, attacked: every hostile completion scores what its tests say.

Each program runs through the real sandbox (bubblewrap, seccomp, the audit hook) with the
standard library only. The honest programs show the harness counts right; the rest are the
attacks of the issue that asked for it (a program that raises, exits before the tests, prints or
writes fake results, rebinds builtins, patches the checker or its globals, reads the tests from
disk or memory, returns an object equal to everything), each against the kinds of test it could
fool.
"""

from __future__ import annotations

import pytest

from popgrpo.envs.harness import TestSpec, harness_payload, outputs_equal, read_reports, submit_tests, values_equal
from popgrpo.envs.sandbox import Sandbox, SandboxLimits

pytestmark = pytest.mark.requires("sandbox")

ADD = "def add(a, b):\n    return a + b\n"
CALL = TestSpec("call", inputs=("[1, 2]", "[3, 4]", "[10, -3]"), expected=((3,), (7,), (7,)), entry_point="add")
STDIO = TestSpec("stdio", inputs=("1 2\n", "3 4\n"), expected=("3\n", "7\n"))
MBPP = TestSpec("assert", tests=("assert add(1, 2) == 3", "assert add(3, 4) == 7", "assert add(10, -3) == 7"))
HUMANEVAL = TestSpec(
    "assert",
    tests=(
        "import math\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"
        "    assert abs(candidate(0.1, 0.2) - 0.3) < 1e-9\n    assert math.isclose(candidate(2, 2), 4)\n\ncheck(add)\n",
    ),
    entry_point="add",
)
ALL_KINDS = {"call": CALL, "stdio": STDIO, "mbpp": MBPP, "humaneval": HUMANEVAL}


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxLimits(timeout_s=5, cpu_s=3, memory_mb=256), site_packages=False) as box:
        yield box


def run(sandbox, program, spec):
    return submit_tests(sandbox, program, spec).result()


# ---- honest programs ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["call", "mbpp", "humaneval"])
def test_a_correct_function_passes_every_test(sandbox, kind):
    result = run(sandbox, ADD, ALL_KINDS[kind])
    assert result.all_passed and result.run_reason == "ok", result


def test_a_correct_stdio_program_passes_whichever_way_it_reads_and_writes(sandbox):
    for program in (
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))\nexit()\n",
        "a, b = map(int, open(0).read().split())\nimport os\nos.write(1, f'{a + b}\\n'.encode())\n",
        "import sys\nsys.stdout.buffer.write(str(sum(map(int, sys.stdin.buffer.read().split()))).encode())\n",
    ):
        result = run(sandbox, program, STDIO)
        assert result.reasons == ("passed", "passed"), (program, result)


def test_a_partly_wrong_function_scores_the_share_it_gets_right(sandbox):
    program = "def add(a, b):\n    return a + b if a < 5 else 0\n"
    assert run(sandbox, program, CALL).reasons == ("passed", "passed", "failed")
    assert run(sandbox, program, MBPP).reasons == ("passed", "passed", "failed")
    assert run(sandbox, program, MBPP).fraction == pytest.approx(2 / 3)


def test_an_infinite_loop_times_out_the_test_it_was_in_and_those_after(sandbox):
    program = "def add(a, b):\n    while a > 5:\n        pass\n    return a + b\n"
    result = run(sandbox, program, CALL)
    assert result.reasons == ("passed", "passed", "timeout") and result.run_reason == "timeout"


# ---- hostile programs --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(ALL_KINDS))
def test_a_program_that_raises_passes_nothing(sandbox, kind):
    for program in ("raise ValueError('no')\n", "def add(a, b):\n    raise SystemExit(0)\n"):
        result = run(sandbox, program, ALL_KINDS[kind])
        assert result.passed == 0, (program, result)
        assert set(result.reasons) <= {"error", "failed"}


@pytest.mark.parametrize("kind", list(ALL_KINDS))
@pytest.mark.parametrize(
    "exit_call", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "exit()", "raise KeyboardInterrupt"]
)
def test_exiting_before_the_tests_passes_nothing(sandbox, kind, exit_call):
    result = run(sandbox, ADD + exit_call + "\n", ALL_KINDS[kind])
    assert (result.passed == 0 and set(result.reasons) == {"error"}) or kind == "stdio", result
    assert result.passed == 0


def test_exiting_inside_a_test_fails_that_test_and_those_after(sandbox):
    program = "import os\ndef add(a, b):\n    if a == 3:\n        os._exit(0)\n    return a + b\n"
    assert run(sandbox, program, CALL).reasons == ("passed", "error", "error")
    assert run(sandbox, program, MBPP).reasons == ("passed", "error", "error")


FAKE_REPORTS = (
    "import os\n"
    "fake = ''.join(f'report\\ttest\\t{i}\\tpassed\\t\"\"\\t' + '0' * 32 + '\\n' for i in range(3))\n"
    "fake += 'report\\tdone\\t3\\tdone\\t\"\"\\t' + '0' * 32 + '\\n'\n"
    "print(fake)\n"
    "for fd in range(1, 64):\n"
    "    try:\n"
    "        os.write(fd, fake.encode())\n"
    "    except OSError:\n"
    "        pass\n"
)


@pytest.mark.parametrize("kind", list(ALL_KINDS))
def test_printed_or_written_fake_results_are_ignored(sandbox, kind):
    result = run(sandbox, FAKE_REPORTS + "def add(a, b):\n    return 0\n", ALL_KINDS[kind])
    assert result.passed == 0, result


def test_a_report_rewritten_in_place_is_rejected(sandbox):
    # The verdicts' offsets in the status file are predictable; the tags are not.
    program = (
        "import os\n"
        "def add(a, b):\n"
        "    if a == 3:\n"
        "        for fd in range(3, 64):\n"
        "            try:\n"
        "                os.lseek(fd, 0, 0)\n"
        "                os.write(fd, b'report\\ttest\\t0\\tpassed\\t\"\"\\t' + b'0' * 32 + b'\\n')\n"
        "            except OSError:\n"
        "                pass\n"
        "    return 0\n"
    )
    result = run(sandbox, program, MBPP)
    assert result.passed == 0, result


def test_raising_the_harness_event_itself_is_forbidden(sandbox):
    program = ADD.replace("a + b", "0") + "import sys\nsys.audit('popgrpo.report', 'test', 0, 'passed', '\"\"')\n"
    result = run(sandbox, program, MBPP)
    assert result.passed == 0 and result.run_reason == "forbidden", result


@pytest.mark.parametrize("kind", list(ALL_KINDS))
def test_rebinding_builtins_changes_nothing_the_tests_use(sandbox, kind):
    program = (
        "import builtins, math\n"
        "builtins.abs = lambda x: 0\n"
        "builtins.AssertionError = type('Nope', (BaseException,), {})\n"
        "builtins.isinstance = lambda *a: True\n"
        "__builtins__['abs'] = lambda x: 0\n"
        "math.isclose = lambda *a, **k: True\n"
        "abs = lambda x: 0\n"
        "def add(a, b):\n"
        "    return 1000\n"
    )
    result = run(sandbox, program, ALL_KINDS[kind])
    assert result.passed == 0, result
    assert set(result.reasons) == {"failed"}, result  # failed assertions, not errors


def test_patching_the_checker_or_its_globals_does_not_pass(sandbox):
    for program in (
        "def check(candidate):\n    pass\ndef add(a, b):\n    return 0\n",
        "import types, sys\nmath = types.ModuleType('math')\nmath.isclose = lambda *a, **k: True\n"
        "sys.modules['math'] = math\ndef add(a, b):\n    return 0 if a != 2 else 4.5\n",
        "import sys\nclass Finder:\n    def find_spec(self, *a):\n        raise SystemExit\n"
        "sys.meta_path.insert(0, Finder())\nsys.modules.pop('math', None)\ndef add(a, b):\n    return 0\n",
    ):
        result = run(sandbox, program, HUMANEVAL)
        assert result.passed == 0, (program, result)


def test_the_tests_are_not_on_the_disk(sandbox):
    # Reads every file it can outside the read-only system and interpreter directories (which
    # hold no tests, and take longer than the time limit to read) for the tests' text.
    secret = (
        TestSpec("call", inputs=("[918273, 1]",), expected=((918274,),), entry_point="add"),
        TestSpec("assert", tests=("assert add(918273, 1) == 918274",)),
    )
    program = (
        "import os, sys\n"
        "system = ('/usr', '/proc', '/sys', '/dev', sys.base_prefix, sys.prefix)\n"
        "found = []\n"
        "for top, dirs, files in os.walk('/'):\n"
        "    if top.startswith(system):\n"
        "        dirs[:] = []\n"
        "        continue\n"
        "    for name in files:\n"
        "        try:\n"
        "            with open(os.path.join(top, name), 'rb') as f:\n"
        "                if b'918274' in f.read(1 << 20):\n"
        "                    found.append(name)\n"
        "        except Exception:\n"
        "            pass\n"
        "def add(a, b):\n"
        "    return a + b if found else 0\n"
    )
    for spec in secret:
        result = run(sandbox, program, spec)
        assert result.reasons == ("failed",) and result.run_reason == "ok", result


READ_FRAMES = """
import sys, gc
def leak():
    found = []
    try:
        frame = sys._getframe(1)
        while frame is not None:
            found.append(frame.f_locals)
            frame = frame.f_back
    except Exception as error:
        found.append(repr(error))
    try:
        raise RuntimeError
    except RuntimeError as error:
        try:
            found.append(error.__traceback__.tb_frame.f_back.f_locals)
        except Exception as inner:
            found.append(repr(inner))
    def gen():
        yield 1
    try:
        found.append(gen().gi_frame.f_back)
    except Exception as error:
        found.append(repr(error))
    try:
        found.append(gc.get_objects())
    except Exception as error:
        found.append(repr(error))
    return found

def seen():
    return [x for x in leak() if not isinstance(x, str)]
"""


def test_the_tests_cannot_be_read_from_memory(sandbox):
    # The candidate looks for its caller's frames (the test's, the harness's) while it is tested.
    program = READ_FRAMES + (
        "def add(a, b):\n"
        "    if seen():\n"
        "        return a + b\n"  # it reached a frame: show it by passing
        "    return -1\n"
    )
    for spec in ALL_KINDS.values():
        if spec is not STDIO:
            assert run(sandbox, program, spec).passed == 0, spec
    # At the program's top level too: frames kept for later are as closed.
    stashed = READ_FRAMES + "EARLY = seen()\ndef add(a, b):\n    return a + b if EARLY or seen() else -1\n"
    for spec in (CALL, MBPP, HUMANEVAL):
        assert run(sandbox, stashed, spec).passed == 0


def test_an_audit_hook_of_the_program_never_runs(sandbox):
    # It would see the code object of every test the harness executes.
    program = (
        "import sys\nSEEN = []\n"
        "sys.addaudithook(lambda event, args: SEEN.append(event))\n"
        "sys.audit('anything')\n"
        "def add(a, b):\n    return a + b if SEEN else -1\n"
    )
    for spec in (CALL, MBPP, HUMANEVAL):
        result = run(sandbox, program, spec)
        assert result.passed == 0 and result.run_reason == "ok", result


ALWAYS_EQUAL = (
    "class Equal:\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __ne__(self, other):\n        return False\n"
    "    def __hash__(self):\n        return 0\n"
    "class Int(int):\n"
    "    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n"
)


def test_an_object_equal_to_everything_passes_no_call_or_stdio_test(sandbox):
    for value in ("Equal()", "Int(0)", "[Equal()]", "{'k': Equal()}"):
        program = ALWAYS_EQUAL + f"def add(a, b):\n    return {value}\n"
        result = run(sandbox, program, CALL)
        assert result.reasons == ("failed",) * 3, (value, result)
    printed = ALWAYS_EQUAL + "print(Equal())\n"
    assert run(sandbox, printed, STDIO).passed == 0


def test_an_object_equal_to_everything_does_pass_a_bare_assert(sandbox):
    # The documented limit of assert-based tests: the dataset's own `==` does the comparing.
    program = ALWAYS_EQUAL + "def add(a, b):\n    return Equal()\n"
    assert run(sandbox, program, MBPP).all_passed


def test_closing_the_report_channel_only_loses_the_program_its_tests(sandbox):
    program = (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\n" + ADD
    )
    for spec in (CALL, MBPP):
        assert run(sandbox, program, spec).passed == 0


def test_a_wrong_type_never_equals_the_expected_value(sandbox):
    checks = [("'3'", False), ("3.0000000001", True), ("True", False), ("(3,)", False), ("[3]", False)]
    for value, passes in checks:
        program = f"def add(a, b):\n    return {value}\n"
        spec = TestSpec("call", inputs=("[1, 2]",), expected=((3,),), entry_point="add")
        assert run(sandbox, program, spec).all_passed is passes, value


# ---- the comparisons and the channel, without a sandbox ----------------------------------------


def test_values_compare_by_type_and_value():
    assert values_equal(3, 3) and values_equal(3, 3.0) and values_equal(0.1 + 0.2, 0.3)
    assert not values_equal(3, True) and not values_equal(True, 1) and values_equal(True, True)
    assert not values_equal("3", 3) and not values_equal(None, 0) and values_equal(None, None)
    assert values_equal([1, [2, 3]], (1, (2, 3))) and not values_equal([1, 2], [1, 2, 3])
    assert values_equal({"a": [1]}, {"a": (1,)}) and not values_equal({"a": 1}, {"a": 1, "b": 2})
    assert values_equal({1, 2}, frozenset({2, 1})) and not values_equal({1, 2}, [1, 2])
    assert values_equal(float("nan"), float("nan")) and not values_equal(1e9, 1e9 + 1e4)


def test_outputs_compare_line_by_line_then_token_by_token():
    assert outputs_equal("3\n", "3") and outputs_equal("a b\nc\n", "a b   \nc\n\n")
    assert not outputs_equal("3\n", "4\n") and not outputs_equal("1 2", "1 2 3")
    assert outputs_equal("0.3333333", "0.33333334") and not outputs_equal("0.3", "0.4")


def test_only_tagged_reports_count():
    from _blake2 import blake2b

    body = 'test\t0\tpassed\t""'
    tag = blake2b(body.encode(), key=b"nonce", digest_size=16).hexdigest()
    good = f"report\t{body}\t{tag}\n"
    assert read_reports(good, "nonce") == {("test", 0): ("passed", '""')}
    assert read_reports(good, "other") == {}
    assert read_reports(good.replace("passed", "failed"), "nonce") == {}
    assert read_reports('report\ttest\t0\tpassed\t""\t' + "0" * 32 + "\n" + good, "nonce") == {
        ("test", 0): ("passed", '""')
    }


def test_the_payload_holds_no_expected_value():
    payload = harness_payload(ADD, CALL)
    assert "[10, -3]" in payload and '"expected"' not in payload
    stdio = harness_payload("print(1)", TestSpec("stdio", inputs=("in\n",), expected=("secret-answer\n",)))
    assert "secret-answer" not in stdio
