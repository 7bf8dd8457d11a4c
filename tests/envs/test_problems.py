"""Problem sets: every usual row format recognised, every bad row named by its row and column."""

from __future__ import annotations

import json

import pytest

from popgrpo.envs.problems import (
    Columns,
    ProblemSetError,
    build_program,
    load_problems,
    parse_tests,
    solution_key,
    split,
)

HUMANEVAL_ROW = {
    "task_id": "HumanEval/0",
    "prompt": "def add(a, b):\n",
    "entry_point": "add",
    "test": "METADATA = {}\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n",
}
MBPP_ROW = {
    "task_id": 11,
    "prompt": "Write a function that adds.",
    "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
    "test_setup_code": "import math",
}
APPS_STDIO_ROW = {
    "problem_id": 7,
    "prompt": "Read two numbers.",
    "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
}
APPS_CALL_ROW = {"prompt": "Add.", "input_output": {"inputs": [[1, 2], [3, 4]], "outputs": [[3], 7], "fn_name": "add"}}
LCB_ROW = {
    "prompt": "Functional.",
    "entry_point": "add",
    "tests": [{"input": "1\n2", "output": "3", "testtype": "functional"}],
}


def test_the_usual_formats_are_recognised_without_code():
    problems = load_problems([HUMANEVAL_ROW, MBPP_ROW, APPS_STDIO_ROW, APPS_CALL_ROW, LCB_ROW])
    he, mbpp, stdio, call, lcb = (p.tests for p in problems)
    assert he.mode == "assert" and he.tests[0].endswith("check(add)\n") and he.entry_point == "add"
    assert mbpp.mode == "assert" and len(mbpp) == 2 and mbpp.setup == "import math"
    assert stdio.mode == "stdio" and stdio.inputs == ("1 2\n",) and stdio.expected == ("3\n",)
    assert call.mode == "call" and call.inputs == ("[1, 2]", "[3, 4]") and call.expected == (([3], 3), (7,))
    assert lcb.mode == "call" and lcb.inputs == ("[1, 2]",) and lcb.expected == ((3,),)
    assert [p.id for p in problems] == ["HumanEval/0", "11", "7", "4", "5"]


def test_assert_statements_in_one_string_are_one_test_each():
    spec = parse_tests("import math\nassert f(1) == 1\nx = 2\nassert f(x) == 4\n")
    assert spec.tests == ("assert f(1) == 1", "assert f(x) == 4") and spec.setup == "import math\nx = 2"


def test_stdin_pairs_are_stdio_tests():
    spec = parse_tests([{"input": "1\n", "output": "2\n", "testtype": "stdin"}], entry_point="main")
    assert spec.mode == "stdio"


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_every_file_format_loads_the_same_problems(tmp_path, suffix):
    rows = [
        {"task_id": "a", "prompt": "def f(x):\n", "entry_point": "f", "test": "assert f(1) == 2", "level": 1},
        {"task_id": "b", "prompt": "def g(x):\n", "entry_point": "g", "test": "assert g(1) == 0", "level": 3},
    ]
    path = tmp_path / f"problems{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.csv
        import pyarrow.parquet

        table = pa.Table.from_pylist(rows)
        (pyarrow.parquet.write_table if suffix == ".parquet" else pyarrow.csv.write_csv)(table, path)
    problems = load_problems(path, Columns(extra=("level",)))
    assert [(p.id, p.prompt, p.tests.tests, p.columns) for p in problems] == [
        ("a", "def f(x):\n", ("assert f(1) == 2",), {"level": 1}),
        ("b", "def g(x):\n", ("assert g(1) == 0",), {"level": 3}),
    ]


def test_renamed_columns():
    rows = [{"q": "Do it.", "checks": ["assert go() == 1"], "name": "go", "key": "k1"}]
    [problem] = load_problems(rows, Columns(prompt="q", tests="checks", entry_point="name", id="key"))
    assert problem.id == "k1" and problem.tests.entry_point == "go"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "p"}, "row 2, column 'test/test_list/tests/input_output/public_test_cases': missing"),
        (
            {"prompt": "p", "test": "assert f(1) ==="},
            "row 2, column 'test': the test code does not compile (SyntaxError line 1)",
        ),
        (
            {"prompt": "p", "test": "def check(candidate):\n    pass"},
            "row 2, column 'test': the entry point of a check(candidate) test must be",
        ),
        ({"prompt": "p", "test": "x = 1"}, "row 2, column 'test': the test code has no assert"),
        (
            {"prompt": "p", "test": "assert f()", "entry_point": "not an id"},
            "row 2, column 'entry_point': must be a Python identifier",
        ),
        ({"prompt": "", "test": "assert f()"}, "row 2, column 'prompt': the prompt must be non-empty text"),
        ({"test": "assert f()"}, "row 2, column 'prompt': missing"),
        ({"prompt": "first", "test": "assert f()"}, "row 2, column 'prompt': the same prompt as row 1"),
        ({"prompt": "p", "test": "assert f()", "task_id": "t1"}, "row 2, column 'task_id': the same id as row 1"),
        (
            {"prompt": "p", "input_output": {"inputs": [1], "outputs": [1], "fn_name": "f"}},
            "row 2, column 'input_output': call-based test inputs must be lists",
        ),
        (
            {"prompt": "p", "input_output": {"inputs": ["1"], "outputs": []}},
            "row 2, column 'input_output': inputs and outputs must be lists of the same length",
        ),
        (
            {"prompt": "p", "tests": [{"input": "x", "output": "1", "testtype": "functional"}], "entry_point": "f"},
            "row 2, column 'tests': a functional test's input must be one JSON value per line",
        ),
        ({"prompt": "p", "test_list": []}, "row 2, column 'test_list': no tests"),
        ({"prompt": "p", "test_list": ["assert f() ==="]}, "row 2, column 'test_list': test 0 does not compile"),
        (
            {"prompt": "p", "test": "assert f()", "test_setup_code": "import ("},
            "row 2, column 'test_setup_code': the setup code does not compile",
        ),
    ],
)
def test_a_bad_row_is_named_by_row_and_column(row, message):
    first = {"task_id": "t1", "prompt": "first", "test": "assert f() == 1"}
    with pytest.raises(ProblemSetError) as caught:
        load_problems([first, row])
    text = str(caught.value)
    assert message in text and "\n" not in text, text
    assert text.startswith("rows: row 2")


def test_a_missing_extra_column_is_named():
    with pytest.raises(ProblemSetError, match="row 1, column 'difficulty': missing"):
        load_problems([{"prompt": "p", "test": "assert 1"}], Columns(extra=("difficulty",)))


def test_a_bad_file_is_named(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "test": "assert 1"}\nnot json\n')
    with pytest.raises(ProblemSetError, match=r"p\.jsonl: line 2: not JSON"):
        load_problems(path)
    other = tmp_path / "x.txt"
    other.write_text("")
    with pytest.raises(ProblemSetError, match=r"unsupported format '\.txt'"):
        load_problems(other)


def test_the_held_out_split_is_seeded_and_stable_under_reordering():
    rows = [{"task_id": f"t{i}", "prompt": f"p{i}", "test": "assert 1"} for i in range(200)]
    problems = load_problems(rows)
    train, heldout = split(problems, 0.25, seed=3)
    assert 30 < len(heldout) < 70 and len(train) + len(heldout) == 200
    again = split(list(reversed(problems)), 0.25, seed=3)[1]
    assert {p.id for p in again} == {p.id for p in heldout}
    assert {p.id for p in split(problems, 0.25, seed=4)[1]} != {p.id for p in heldout}


def test_a_solution_key_ignores_names_comments_and_docstrings():
    a = "def add(a, b):\n    '''Adds.'''\n    total = a + b  # sum\n    return total\n"
    b = "def add(x, y):\n    s = x + y\n    return s\n"
    c = "def add(a, b):\n    return a + b\n"
    assert solution_key(a, ("add",)) == solution_key(b, ("add",))
    assert solution_key(a, ("add",)) != solution_key(c, ("add",))
    assert solution_key("def f(:", ()) == solution_key("  def f(:  ", ())


def test_programs_from_completions():
    assert build_program("prompt+completion", "def f():\n", "    return 1\n") == "def f():\n    return 1\n"
    assert build_program("fenced", "p", "text\n```python\nx = 1\n```\n") == "x = 1\n"
    assert build_program("fenced", "p", "no code") is None
    assert build_program("auto", "p:", " rest") == "p: rest"
