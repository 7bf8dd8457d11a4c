"""docs/WARM.md's numbers come from the committed study (docs/results/warm) through `popgrpo report`.

The committed directory holds the study's four Parquet tables and study.json; `popgrpo report`
redraws warm.md, verdicts.json and the figures from them. Here they are redrawn into a copy and
must equal what is committed, and every table row WARM.md quotes must be a row of warm.md.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from popgrpo.cli import main
from popgrpo.research.study.warm_report import TABLES, WARM_FIGURES

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "docs" / "results" / "warm"


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("warm")
    for name in (*(f"{t}.parquet" for t in TABLES), "study.json"):
        shutil.copy(COMMITTED / name, out / name)
    assert main(["report", str(out)]) == 0
    return out


def test_report_redraws_the_committed_tables_and_verdicts(redrawn):
    assert (redrawn / "warm.md").read_text() == (COMMITTED / "warm.md").read_text()
    assert (redrawn / "verdicts.json").read_text() == (COMMITTED / "verdicts.json").read_text()
    assert all((redrawn / name).stat().st_size > 1000 for name in WARM_FIGURES)


def _tables(text: str) -> list[list[str]]:
    """The Markdown tables of ``text``: each a list of its rows (header and separator included)."""
    tables, current = [], []
    for line in text.splitlines():
        if re.match(r"^\| .* \|$", line) or line.startswith("| ---"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


def test_every_table_of_the_study_section_comes_from_the_report():
    generated = set((COMMITTED / "warm.md").read_text().splitlines())
    verdicts = {v["claim"]: v for v in json.loads((COMMITTED / "verdicts.json").read_text())}
    doc = (ROOT / "docs" / "WARM.md").read_text()
    section = doc[doc.index("## What the study measured") : doc.index("### Cost")]
    tables = _tables(section)
    changes = [t for t in tables if t[0].startswith("| claim (3 seeds → 16 seeds)")]
    assert len(changes) == 1 and len(tables) == 8
    quoted = [row for t in tables if t is not changes[0] for row in t]
    assert len(quoted) > 60 and not [r for r in quoted if r not in generated]
    # The table of changed verdicts: its "new verdict" is verdicts.json's, claim by claim.
    for row in changes[0][2:]:
        claim, _old, new, status = _cells(row)
        if new.startswith("removed"):
            continue
        if new.startswith("survival: "):
            setting = re.match(r"RL \((\w+)\)", claim).group(1)
            record = verdicts[f"RL ({setting}): hacked later against warm6 than against single"]
            assert new.startswith(f"survival: {record['verdict']} ")
        else:
            assert new == verdicts[claim]["verdict"] and status == verdicts[claim]["paper_claim_status"], claim
