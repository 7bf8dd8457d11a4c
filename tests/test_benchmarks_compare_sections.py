"""``benchmarks.compare_sections``: its table, from the committed runs, and its refusals."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks.compare_sections import differences, main, paired_runs, table
from benchmarks.overhead_budget import rest_share

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "sections_1_3_evaluator_c68a7fb.jsonl"
# The before/after comparisons moved from BENCHMARKS.md to this page of past changes.
PAGE = DATA.parent.parent.parent / "docs" / "benchmarks" / "refactors.md"


def _rows(markdown: str) -> dict[str, list[str]]:
    lines = [line.strip("|").split("|") for line in markdown.splitlines()[2:]]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in lines}


def test_the_table_gives_each_trees_runs_in_run_order_and_the_share_beyond_rest():
    records = [json.loads(line) for line in DATA.read_text().splitlines()]
    trees = list(dict.fromkeys(r["tree"] for r in records))
    assert len(trees) == 2
    rendered = table(records)
    assert rendered.splitlines()[0] == f"| figure | `{trees[0]}` | `{trees[1]}` |"
    rows = _rows(rendered)
    for column, tree in enumerate(trees):
        runs = [r for r in records if r["tree"] == tree]
        assert rows["1. `step_floor`: member / bare loop"][column] == " / ".join(
            f"{r['step_floor']['ratio']:.3f}" for r in runs
        )
        for arm in records[0]["round"]["shares"]:
            beyond = [r["round"]["shares"][arm] - rest_share(r["round"]) for r in runs]
            assert rows[f"3. … of it beyond Ray at rest, {arm}"][column] == " / ".join(f"{b:.1%}" for b in beyond)


@pytest.mark.parametrize("argv", [[], ["--before", "/nonexistent", "--order", "ABC"]])
def test_it_refuses_without_a_before_tree_or_with_an_order_of_other_letters(argv, capsys):
    with pytest.raises(SystemExit) as bad:
        main(argv)
    assert bad.value.code == 2
    assert "--before PATH and an --order of A and B are needed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "heading, data",
    [
        ("**The evaluator actor at the driver's niceness**", "sections_1_3_evaluator_b7d014b.jsonl"),
        ("**The merged model's evaluation sent before the adoption**", "sections_1_3_evaluator_e6687ee.jsonl"),
    ],
)
def test_the_page_quotes_each_evaluator_comparison_as_rendered_from_its_records(heading, data):
    """Each of docs/benchmarks/refactors.md's tables of an evaluator-actor change is what
    ``python -m benchmarks.compare_sections --render benchmarks/data/<data>`` gives, cell for cell."""
    records = [json.loads(line) for line in (DATA.parent / data).read_text().splitlines()]
    rendered = _rows(table(records))
    text = PAGE.read_text()
    start = text.index(heading)
    block = text[text.index("| figure |", start) :]
    quoted = _rows("\n".join(block.split("\n\n", 1)[0].splitlines()))
    same = {
        "1. `step_floor`: member / bare loop": "1. `step_floor`: member / bare loop",
        "3. Ray and actors at rest, share of the cores": "3. Ray and actors at rest, share of the cores",
        "3. beyond Ray at rest, sync": "3. … of it beyond Ray at rest, sync",
        "3. … async, B = K, S = 0": "3. … of it beyond Ray at rest, async (B = K, S = 0)",
        "3. … async, B = 2, S = 2": "3. … of it beyond Ray at rest, async (B = 2, S = 2)",
    }
    assert set(quoted) == set(same)
    for ours, theirs in same.items():
        assert quoted[ours] == rendered[theirs], ours


MERGED = DATA.parent / "sections_1_3_evaluator_e6687ee.jsonl"  # run order ABBAABBA


def test_differences_pair_the_runs_in_run_order_and_follow_the_formulas():
    records = [json.loads(line) for line in MERGED.read_text().splitlines()]
    before_tree, after_tree = dict.fromkeys(r["tree"] for r in records)
    rows = _rows(differences(records))
    arms = list(records[0]["round"]["shares"])
    names = ["1. `step_floor`: member / bare loop", *(f"3. beyond Ray at rest, {a}" for a in arms)]
    assert list(rows) == names
    raw_p = []
    for name, arm in zip(names, [None, *arms], strict=True):
        d = []
        for i in range(0, len(records), 2):  # runs 1–2, 3–4, …: one of each tree
            pair = {r["tree"]: r for r in records[i : i + 2]}
            a, b = pair[after_tree], pair[before_tree]
            if arm is None:
                d.append(a["step_floor"]["ratio"] - b["step_floor"]["ratio"])
            else:
                d.append(
                    100
                    * (
                        (a["round"]["shares"][arm] - rest_share(a["round"]))
                        - (b["round"]["shares"][arm] - rest_share(b["round"]))
                    )
                )
        n, mean, sd = len(d), sum(d) / len(d), float(np.std(d, ddof=1))
        t = mean / (sd / math.sqrt(n))
        p = 2 * stats.t.sf(abs(t), n - 1)
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        digits, unit = (3, "ratio") if arm is None else (2, "points")
        assert rows[name][0] == f"{mean:+.{digits}f} {unit}"
        assert rows[name][1] == f"[{mean - half:+.{digits}f}, {mean + half:+.{digits}f}]"
        assert rows[name][2] == f"{p:.3g}"
        raw_p.append(p)
    order = sorted(range(len(raw_p)), key=lambda i: raw_p[i])  # Holm: step-down, running maximum
    running, holm = 0.0, [0.0] * len(raw_p)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(raw_p) - rank) * raw_p[i]))
        holm[i] = running
    assert [rows[name][3] for name in names] == [f"{h:.3g}" for h in holm]


def test_runs_that_do_not_pair_in_order_get_no_differences(tmp_path, capsys):
    records = [json.loads(line) for line in MERGED.read_text().splitlines()]
    grouped = sorted(records, key=lambda r: r["tree"])  # AAAABBBB: no pair holds one of each
    assert paired_runs(grouped) is None and paired_runs(records[:2]) is None
    with pytest.raises(ValueError, match="do not pair"):
        differences(grouped)
    saved = tmp_path / "grouped.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in grouped))
    assert main(["--render", str(saved)]) == 0
    assert "after − before" not in capsys.readouterr().out
    assert main(["--render", str(MERGED)]) == 0
    assert "| figure (after − before, 4 pairs) |" in capsys.readouterr().out


def test_the_page_quotes_the_differences_of_the_merged_evaluation_as_rendered():
    records = [json.loads(line) for line in MERGED.read_text().splitlines()]
    text = PAGE.read_text()
    start = text.index("**The merged model's evaluation sent before the adoption**")
    block = text[text.index("| figure (after − before", start) :]
    assert _rows("\n".join(block.split("\n\n", 1)[0].splitlines())) == _rows(differences(records))
