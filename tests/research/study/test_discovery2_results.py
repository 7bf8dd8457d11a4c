"""docs/DISCOVERY2.md states the second discovery study's committed results, and only those.

- `popgrpo report` on a copy of docs/results/discovery2 (its Parquet files and plan.json, no run
  directories) writes the committed verdicts.json, verdicts.md, arms.md, summary.md and
  entropy.md again, byte for byte; verdicts.json quotes the committed pre-registration's hash.
- The page holds summary.md (the decision table) unchanged, and each row of its entropy table is
  a row of entropy.md.
- Every decimal number on the page is a number of those files or of the pre-registration page
  (tuning's effects), to the decimals the page gives. That catches a number from nowhere, not
  one swapped for another number of the files.
- The page's "which mechanism to pick" recommends exactly the (arm, family) pairs the decision
  table marks recommended.

The last test tampers with a copy of the page and checks that the checks then fail.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from popgrpo.research.study.discovery2 import load_preregistration
from popgrpo.research.study.discovery2_report import render_discovery2

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results" / "discovery2"
PAGE = ROOT / "docs" / "DISCOVERY2.md"
PREREGISTRATION_PAGE = ROOT / "docs" / "DISCOVERY2_PREREGISTRATION.md"
INPUTS = (
    "plan.json",
    "discovery_trials.parquet",
    "discovery_curves.parquet",
    "discovery2_random_search.parquet",
    "discovery2_entropy.parquet",
    "wall.jsonl",
)
REDRAWN = ("verdicts.json", "verdicts.md", "arms.md", "summary.md", "entropy.md")
NUMBER = re.compile(r"(?<![\w.])[−+-]?(\d+\.\d+(?:e-\d+)?)(?![\w])")
# The (arm, family) pairs the decision table recommends.
PICK = {
    "reset only": "stepping_stones",
    "repulsion, uncoupled": "collapse",
}


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("discovery2")
    for name in INPUTS:
        shutil.copy(RESULTS / name, copy / name)
    render_discovery2(copy)
    return copy


def test_the_committed_results_redraw_from_their_parquet_files(redrawn):
    for name in REDRAWN:
        assert (redrawn / name).read_text() == (RESULTS / name).read_text(), name
    saved = json.loads((redrawn / "verdicts.json").read_text())
    assert saved["trials"] == 432 and saved["preregistration_sha256"] == load_preregistration()[1]
    assert saved["commit"].startswith("c7d3cc2") and saved["started"] == "2026-11-29T09:54:43+00:00"


def _numbers(text: str) -> set[str]:
    return {m.group(1) for m in NUMBER.finditer(text.replace("−", "-"))}


def _committed_numbers() -> set[str]:
    texts = [(RESULTS / name).read_text() for name in REDRAWN if name != "verdicts.json"]
    return set().union(*map(_numbers, texts), _numbers(PREREGISTRATION_PAGE.read_text()))


def _check_page(page: str) -> None:
    summary = (RESULTS / "summary.md").read_text()
    assert summary in page, "the page does not hold summary.md unchanged"
    entropy_rows = {line for line in (RESULTS / "entropy.md").read_text().splitlines() if line.startswith("| ")}
    page_entropy = page[page.index("## Entropy") :].split("\n\n(Rows")[0]
    for line in page_entropy.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            assert line in entropy_rows, f"entropy row not in entropy.md: {line}"
    known = _committed_numbers()
    outside = page.replace(summary, "")
    unknown = sorted(_numbers(outside) - known)
    assert not unknown, f"numbers on the page that no committed file has: {unknown}"
    recommended = {
        (cells[0], cells[1])
        for line in summary.splitlines()
        if line.endswith("| **yes** |")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert recommended == set(PICK.items())
    design = load_preregistration()[0]
    pick = page[page.index("## Which mechanism to pick") : page.index("## Limits")]
    bullets = {b.split("`", 2)[1]: b for b in pick.split("\n- ") if b.startswith("**On a landscape like `")}
    assert set(bullets) == set(design.families)
    for family, bullet in bullets.items():
        text = " ".join(bullet.split())
        arms = [arm for arm, f in PICK.items() if f == family]
        for arm in arms:  # the recommended arm's own config, and no other arm's named first
            assert text.startswith(f"**On a landscape like `{family}`**"), text
            assert all(o in text for o in design.arms[arm]), f"{family}: {arm}'s config missing"
        if not arms:
            assert "nothing was shown to beat best-of-K" in text, f"{family}: recommends without a licence"


def test_the_page_states_the_committed_results_and_only_those():
    _check_page(PAGE.read_text())


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("+0.109 [+0.064, +0.159]", "+0.190 [+0.064, +0.159]"),  # a number from nowhere
        (
            "| reset only | stepping_stones | yes | yes | **yes** |",
            "| reset only | stepping_stones | no | yes | **no** |",
        ),
        ("| stepping_stones | repulsion | – | -0.975 |", "| stepping_stones | repulsion | – | -0.957 |"),
        ("nothing was shown to beat best-of-K GRPO. Run", "islands beat best-of-K GRPO. Run"),
    ],
)
def test_each_check_fails_on_a_tampered_page(old, new):
    page = PAGE.read_text()
    assert old in page
    with pytest.raises(AssertionError):
        _check_page(page.replace(old, new))
