"""The generated program corpus and the program task's reward (popgrpo.envs.programs)."""

import math
import random

import pytest

from popgrpo.envs.programs import (
    STYLES,
    count_operations,
    generate_corpus,
    generate_program,
    header,
    length_table,
    program_quality,
    program_reward,
)


def test_corpus_is_seeded_varied_and_headed_by_its_style():
    corpus = generate_corpus(300, seed=5)
    assert corpus == generate_corpus(300, seed=5) and corpus != generate_corpus(300, seed=6)
    assert {doc.splitlines()[0] for doc in corpus} == {header(s).strip() for s in STYLES}
    assert all(doc.rstrip().endswith("print(result)") for doc in corpus)
    ops = [count_operations(doc) for doc in corpus]
    assert min(ops) <= 2 and max(ops) >= 15  # one-liners to loops with branches
    assert len(set(corpus)) > 250


def test_every_corpus_program_runs_and_leaves_an_int_result():
    # In-process here (these are our own programs); the sandboxed run is the next test.
    for doc in generate_corpus(1500, seed=1):
        namespace = {}
        exec(doc.replace("print(result)", ""), namespace)
        assert type(namespace["result"]) is int, doc


@pytest.mark.requires("sandbox")
def test_corpus_programs_execute_in_the_sandbox_with_the_task_reward():
    rng = random.Random(3)
    docs = [generate_program(rng, style) for style in STYLES for _ in range(2)]
    prompts = [doc.splitlines(keepends=True)[0] for doc in docs]
    programs = [doc[len(p) :] for doc, p in zip(docs, prompts, strict=True)]
    rewards, reasons = program_reward(prompts, programs)
    assert reasons == ["ok"] * len(docs)
    assert rewards == pytest.approx([program_quality(p) for p in programs])
    assert all(0 < r < 1 for r in rewards)


@pytest.mark.requires("sandbox")
def test_reward_is_zero_for_programs_that_fail_and_rises_with_operations():
    programs = [
        "result = 3\nprint(result)\n",  # runs, one operation (the print call)
        "total = 0\nfor i in range(9):\n    if i % 2 == 0:\n        total += i * 3 - 1\nresult = total\nprint(result)\n",
        "result = undefined_name + 1\n",  # NameError
        "x = 1 // 0\nresult = x\n",  # ZeroDivisionError
        "for i in range(\n",  # does not parse
        "x = 5\n",  # no result
        "result = 'text'\n",  # not a number
    ]
    rewards, reasons = program_reward(["# loop\n"] * len(programs), programs)
    assert reasons[:2] == ["ok", "ok"]
    assert reasons[2:5] == ["crash"] * 3
    assert reasons[5] == "crash" and reasons[6] == "no_score"  # NameError on `result`; a str scores nothing
    assert rewards[2:] == [0.0] * 5
    assert 0 < rewards[0] < 0.2 < 0.6 < rewards[1] < 1  # the simple program's ceiling is low


@pytest.mark.requires("sandbox")
def test_a_program_cannot_pass_off_a_non_number_as_its_result():
    """B is decided by the sandbox's bootstrap after the program, not by code in its namespace:
    shadowing ``type``/``int``/``float`` or rebinding builtins, a bool, NaN and an int too large
    for a float all leave no score. (A float subclass is a number: the bootstrap reads its
    stored value through ``float`` itself, never the subclass's methods.)"""
    attacks = [
        "type = lambda v: int\nresult = 'text'\n",
        "int = str\nfloat = str\nresult = 'text'\n",
        "import builtins\nbuiltins.type = lambda v: int\nbuiltins.isinstance = lambda *a: True\nresult = [1]\n",
        "result = True\n",
        "result = float('nan')\n",
        "result = 10 ** 400\n",
        "score = 1.0\nresult = None\n",  # its own score is overwritten by `result`
    ]
    rewards, reasons = program_reward(["# arithmetic\n"] * len(attacks), attacks)
    assert rewards == [0.0] * len(attacks), list(zip(reasons, attacks, strict=True))
    assert all(r != "ok" for r in reasons), reasons
    # The control: a number from the same kind of program does count, negative or not.
    numbers = ["result = -7 * 3\n", "result = 2.5\n", "class F(float):\n    pass\nresult = F(2.0)\n"]
    rewards, reasons = program_reward(["# arithmetic\n"] * 3, numbers)
    assert reasons == ["ok"] * 3 and rewards == pytest.approx([program_quality(p) for p in numbers])
    assert rewards[0] > 0


def test_quality_counts_operations_and_survives_garbage():
    assert count_operations("result = 1 + 2 * 3") == 2
    assert count_operations("def f(x):\n    return x\nresult = f(1)") == 2  # the def and the call
    assert count_operations("((((") is None and program_quality("((((") == 0.0
    assert count_operations("(" * 5000 + ")" * 5000) in (None, 0)  # deep nesting: no crash
    assert program_quality("result = 1 + 2", scale=6.0) == pytest.approx(1 - math.exp(-1 / 6))


def test_length_table_bins_and_rates():
    lengths = [5, 8, 15, 30, 31, 200]
    rewards = [0.2, 0.0, 0.5, 0.9, 0.0, 0.0]
    reasons = ["ok", "crash", "ok", "ok", "timeout", "crash"]
    rows = length_table(lengths, rewards, reasons, [10, 20, 40])
    assert [r["tokens"] for r in rows] == ["1–10", "11–20", "21–"]
    assert [r["n"] for r in rows] == [2, 1, 3]
    assert rows[0]["success"] == 0.5 and rows[0]["fail_crash"] == 0.5 and rows[0]["reward_if_ok"] == 0.2
    assert rows[2]["success"] == pytest.approx(1 / 3) and rows[2]["reward"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="increasing"):
        length_table(lengths, rewards, reasons, [20, 10])
