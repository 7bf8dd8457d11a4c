"""``benchmarks.compare_sections``: its table, from the committed runs, and its refusals."""

import json
from pathlib import Path

import pytest

from benchmarks.compare_sections import main, table
from benchmarks.overhead_budget import rest_share

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "sections_1_3_evaluator_c68a7fb.jsonl"


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
def test_benchmarks_md_quotes_each_evaluator_comparison_as_rendered_from_its_records(heading, data):
    """Each of BENCHMARKS.md's tables of an evaluator-actor change is what
    ``python -m benchmarks.compare_sections --render benchmarks/data/<data>`` gives, cell for cell."""
    root = DATA.parent.parent.parent
    records = [json.loads(line) for line in (DATA.parent / data).read_text().splitlines()]
    rendered = _rows(table(records))
    text = (root / "BENCHMARKS.md").read_text()
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
