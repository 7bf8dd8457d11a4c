"""docs/RESULTS.md and docs/RESULTS_LM.md state the verdicts of the committed studies, and only those.

docs/results/{paper,collapse}/verdicts.json are what `popgrpo report` redraws from the committed
per-epoch data (tests/research/study/test_report.py checks that). Here:

- RESULTS.md's table of verdicts is `results_verdicts_markdown` of those files, as
  `docs/gen_reference.py` writes it;
- each row of its table of changed verdicts states the verdict, effect, interval and Holm p of
  the comparison and landscape it names;
- every verdict its prose states in bold carries a Holm p, and some comparison of the two
  studies has that verdict and that Holm p (and that mean difference and 95% interval, where
  the page gives them);
- every decimal number of its claim, control, regime-map and ablation sections is a number of
  the redrawn files (claims.md, table1.md, verdicts.json of either landscape; with the earlier
  one-sided p, half a two-sided one, and the MaxEnt runs' entropy from metrics.parquet), to the
  number of decimals the page gives. That catches a number from nowhere, not one swapped for
  another number of those files, and numbers of one or two decimals only loosely (many round
  to them); the verdicts, effects and Holm p of the claims are matched exactly by the checks
  above.
- RESULTS_LM.md's claim table: each row's difference, seeds, Holm p and verdict are those of the
  claim of docs/results/lm/study/lm_claims.json it names.

The last test tampers with copies of the pages and checks that each check then fails.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import pandas as pd

from popgrpo.research.study.report import verdict_cell

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
LANDSCAPES = ("paper", "collapse")
VERDICT = r"(?:better|worse|inconclusive|equivalent within ±[0-9.]+|(?:better|worse), within ±[0-9.]+)"
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+(?:e-\d+)?)(?![\w])")


def _records() -> dict[str, list[dict]]:
    return {name: json.loads((DOCS / "results" / name / "verdicts.json").read_text()) for name in LANDSCAPES}


def _minus(text: str) -> str:
    return text.replace("−", "-")


def _section(doc: str, start: str, stop: str) -> str:
    return doc[doc.index(start) : doc.index(stop)]


def _rows(text: str, header_start: str) -> list[list[str]]:
    """The body rows (cells stripped) of the Markdown table whose header line starts ``header_start``."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[first + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


# ---- the checks, on a page's text; each returns what it found wrong ----------------------------
def generated_block_problems(doc: str) -> list[str]:
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    block = f"{gen.BEGIN}\n{gen.results_verdicts().rstrip()}\n{gen.END}"
    return [] if block in doc else ["RESULTS.md's table of verdicts is stale: run `python docs/gen_reference.py`"]


def changed_verdict_problems(doc: str) -> list[str]:
    records = _records()
    rows = _rows(
        _section(doc, "### What the corrected statistics changed", "## Controls"), "| comparison | landscape |"
    )
    problems = [] if len(rows) >= 10 else [f"only {len(rows)} rows in the table of changed verdicts"]
    for comparison, landscape, _earlier, now in rows:
        matches = [r for r in records[landscape] if r["comparison"] == comparison]
        if len(matches) != 1:
            problems.append(f"{landscape}: no comparison {comparison!r} in verdicts.json")
        elif _minus(now) != verdict_cell(matches[0]):
            problems.append(f"{landscape}, {comparison}: page says {now}, verdicts.json {verdict_cell(matches[0])}")
    return problems


def prose_verdict_problems(doc: str) -> list[str]:
    """Every bold verdict outside the generated table must name a Holm p that some comparison has with it."""
    text = _minus(_section(doc, "## Claim by claim", "## Cost"))
    text = re.sub(r"<!-- BEGIN generated.*?<!-- END generated -->", "", text, flags=re.S)
    text = re.sub(r"\s+", " ", text)
    records = [r for landscape in _records().values() for r in landscape]
    found = list(re.finditer(rf"\*\*({VERDICT})\*\*", text))
    problems = [] if len(found) >= 30 else [f"only {len(found)} bold verdicts in the claim sections"]
    for i, match in enumerate(found):
        after = text[match.end() : found[i + 1].start() if i + 1 < len(found) else len(text)]
        holm = re.search(r"(?<!TOST )Holm p = (\d(?:[\d.e-]*\d)?|n/a)", after)
        if holm is None:
            problems.append(f"**{match.group(1)}** without a Holm p: {after[:80]!r}")
            continue
        effect = re.match(r",? \(([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]", after)
        hits = [
            r
            for r in records
            if r["verdict"] == match.group(1)
            and ("n/a" if r["p_holm"] is None else f"{r['p_holm']:.3g}") == holm.group(1)
            and (
                effect is None
                or [x.lstrip("+") for x in effect.groups()]
                == [f"{r['mean_diff']:.4f}", f"{r['ci_low']:.3f}", f"{r['ci_high']:.3f}"]
            )
        ]
        if not hits:
            problems.append(f"no comparison is **{match.group(1)}** with Holm p = {holm.group(1)}: {after[:80]!r}")
    return problems


def _sources() -> list[float]:
    """Every number of the redrawn files the claim sections may quote (absolute values)."""
    numbers: list[float] = []
    for name in LANDSCAPES:
        committed = DOCS / "results" / name
        for page in ("claims.md", "table1.md"):
            numbers += [float(x) for x in NUMBER.findall(_minus((committed / page).read_text()))]
        for record in json.loads((committed / "verdicts.json").read_text()):
            values = [v for v in record.values() if isinstance(v, float)]
            numbers += values + [record["p"] / 2 for _ in [0] if record["p"] is not None]  # earlier one-sided p
        metrics = pd.read_parquet(committed / "metrics.parquet", columns=["trial", "epoch", "entropy"])
        maxent = metrics[metrics.trial.str.contains("maxent") & (metrics.epoch >= metrics.epoch.max() - 9)]
        numbers += maxent.groupby("trial").entropy.mean().round(4).unique().tolist()
    return [abs(x) for x in numbers]


def number_problems(doc: str, sources: list[float]) -> list[str]:
    text = _minus(_section(doc, "## Claim by claim", "## Cost"))
    problems = []
    quoted = NUMBER.findall(text)
    for token in quoted:
        x = float(token)
        if "e" in token:
            ok = any(abs(s - x) <= 0.005 * x for s in sources)
        else:
            decimals = len(token.split(".")[1])
            ok = any(abs(s - x) <= 0.5 * 10**-decimals + 1e-12 for s in sources)
        if not ok:
            problems.append(f"{token} is in no redrawn file")
    return problems if len(quoted) >= 200 else [*problems, f"only {len(quoted)} numbers in the claim sections"]


def lm_problems(doc: str) -> list[str]:
    claims = {c["claim"]: c for c in json.loads((DOCS / "results" / "lm" / "study" / "lm_claims.json").read_text())}
    rows = _rows(doc, "| claim (the paper's, on real programs")
    problems = [] if len(rows) >= 12 else [f"only {len(rows)} rows in RESULTS_LM.md's claim table"]
    for claim, difference, seeds, p_holm, verdict, _before in rows:
        c = claims.get(claim)
        if c is None:
            problems.append(f"no claim {claim!r} in lm_claims.json")
            continue
        mean, sd = _minus(difference).removesuffix(" tokens").split(" ± ")
        for shown, value in ((mean, c["diff_mean"]), (sd, c["diff_sd"])):
            if abs(float(shown) - value) > 0.5 * 10 ** -len(shown.split(".")[1]) + 1e-12:
                problems.append(f"{claim}: difference {difference}, lm_claims.json {value:+.4f}")
        if not seeds.startswith(f"{c['wins']}/{c['n']}"):
            problems.append(f"{claim}: seeds {seeds}, lm_claims.json {c['wins']}/{c['n']}")
        digits = len(p_holm.split(".")[1]) if "." in p_holm else 0
        if c["p_holm"] is None or abs(float(p_holm) - c["p_holm"]) > 0.5 * 10**-digits + 1e-12:
            problems.append(f"{claim}: Holm p {p_holm}, lm_claims.json {c['p_holm']}")
        if not re.match(rf"(\*\*)?{re.escape(c['verdict'])}(\*\*)?([:;,( ]|$)", verdict):
            problems.append(f"{claim}: verdict {verdict[:40]!r}, lm_claims.json {c['verdict']!r}")
    return problems


# ---- sentences that once said more than their tables (issue 46, item 6) -------------------------
# (file, phrase): a claim its table does not support, which must not come back.
OVERCLAIMS = [
    ("docs/DISCOVERY.md", "the more updates per epoch, the more"),
    ("docs/DISCOVERY.md", "peaks 0–2 of the calibrated"),
    ("docs/DISCOVERY.md", "0–2 lie inside higher"),
    ("popgrpo/core/discovery.py", "peaks 0–2 of the calibrated"),
    ("docs/reference/statistics.md", "peaks 0–2 of the calibrated"),
    ("docs/DISCOVERY.md", "no mechanism spends samples on selection or evaluation"),
    ("popgrpo/research/study/discovery_report.py", "no mechanism spends samples on selection or evaluation"),
    ("popgrpo/research/study/discovery_plan.py", "spends a sample on selection or\nevaluation"),
    ("docs/RESULTS_LM.md", "show no difference"),
    ("docs/WARM.md", "is not hacked later"),
    ("docs/guides/async.md", "the speed wins"),
]


def overclaim_problems(pages: dict[str, str]) -> list[str]:
    return [f"{name}: {phrase!r}" for name, phrase in OVERCLAIMS if phrase in pages[name]]


def _pages() -> dict[str, str]:
    return {name: (ROOT / name).read_text() for name in {n for n, _ in OVERCLAIMS}}


def reachability_problems(discovery: str) -> list[str]:
    """DISCOVERY.md's sentence on reachable peaks against the landscapes the study ran on."""
    from popgrpo.config import load_config, preset_path
    from popgrpo.envs import make_env
    from popgrpo.research.study.discovery import reachable

    unreachable = {}
    for landscape, preset in (("collapse", "pop_grpo"), ("paper", "paper_pop_grpo")):
        for instance in (1, 2, 1000):
            env = make_env(load_config(preset_path(preset), [f"env.peak_seed={instance}"]).env)
            unreachable[landscape, instance] = sorted(set(range(8)) - reachable(env, env.peak_centres))
    trials = pd.read_parquet(DOCS / "results" / "discovery" / "discovery_trials.parquet")
    cells = trials[["landscape", "instance", "reachable"]].drop_duplicates()
    problems = [
        f"{landscape} instance {instance}: {n} reachable in the committed trials"
        for landscape, instance, n in cells.itertuples(index=False)
        if n != 8 - len(unreachable[str(landscape), int(instance)])
    ]
    said = {
        "all 8 peaks are reachable on every instance used here (1, 2 and the tuning instance 1000)": all(
            not unreachable["paper", i] for i in (1, 2, 1000)
        ),
        "peak 0 lies inside a higher, wider peak's basin on instance 1": unreachable["collapse", 1] == [0],
        "0 and 1 on instances 2 and 1000": unreachable["collapse", 2] == unreachable["collapse", 1000] == [0, 1],
    }
    text = " ".join(discovery.split())
    return problems + [
        f"DISCOVERY.md: {claim!r} absent or untrue" for claim, true in said.items() if claim not in text or not true
    ]


def repulsion_trend_problems(discovery: str) -> list[str]:
    """The per-intensity repulsion effects DISCOVERY.md lists are verdicts.json's, and not monotone."""
    records = json.loads((DOCS / "results" / "discovery" / "verdicts.json").read_text())["verdicts"]
    text = _minus(" ".join(discovery.split()))
    problems = []
    for landscape in ("collapse", "paper"):
        effects = [
            next(
                r["mean_diff"]
                for r in records
                if r["mechanism"] == "repulsion"
                and r["metric"] == "peak_fraction_mean"
                and r["landscape"] == landscape
                and r["intensity"] == i
            )
            for i in (1, 2, 4, 8)
        ]
        listed = ", ".join(f"{e:+.3f}" for e in effects) + f" on {landscape}"
        if listed not in text:
            problems.append(f"DISCOVERY.md does not list repulsion's effects on {landscape} as {listed!r}")
        steps = [b - a for a, b in itertools.pairwise(effects)]
        if all(x > 0 for x in steps) or all(x < 0 for x in steps):
            problems.append(f"repulsion's effects on {landscape} are monotone; the page says they are not")
    if "no trend was pre-registered or tested" not in text:
        problems.append("DISCOVERY.md no longer says the trend was not tested")
    return problems


def inconclusive_sentence_problems(lm: str, warm: str, async_guide: str) -> list[str]:
    """RESULTS_LM.md, WARM.md and the async guide state their verdicts as the JSON has them."""
    problems = []
    best_of_k = {c["metric"]: c for c in json.loads((DOCS / "results/lm/study/lm_best_of_k_claims.json").read_text())}
    lm_text = _minus(" ".join(lm.split()))
    for metric, label in (("reward_max", "max reward"), ("diversity", "diversity")):
        c = best_of_k[metric]
        quoted = f"{label} ({c['mean_diff']:+.3f} ± {c['diff_sd']:.3f})"
        if quoted not in lm_text or c["verdict"] != "inconclusive":
            problems.append(
                f"RESULTS_LM.md: {quoted!r} absent, or lm_best_of_k_claims.json's verdict is {c['verdict']}"
            )
    if "are inconclusive (no difference shown" not in lm_text:
        problems.append("RESULTS_LM.md: the max reward and diversity claims are not called inconclusive")
    warm_records = json.loads((DOCS / "results" / "warm" / "verdicts.json").read_text())
    hacked = next(
        r for r in warm_records if r["claim"] == "RL (clean): hacked later against pop_warm6 than against warm6"
    )
    warm_text = " ".join(warm.split())
    if (
        hacked["verdict"] != "inconclusive"
        or f"is inconclusive (clean +{hacked['mean_diff']:.2f} epochs, Holm p = {hacked['p_holm']:.3f}" not in warm_text
    ):
        problems.append("WARM.md: Pop-GRPO against WARM M = 6 is not stated as its verdict")
    p_values = []
    for name in ("async_study.json", "async_study_scale2.json"):
        compare = json.loads((ROOT / "benchmarks" / "data" / name).read_text())["compare_budget"]
        p_values += [r["t_p"] for r in compare if r["key"] == "best_expected"]
    quoted = "p = {:.2f} and {:.2f} with median 1 s stragglers, {:.2f} and {:.2f} with 2 s".format(*p_values)
    if quoted not in " ".join(async_guide.split()) or min(p_values) < 0.05:
        problems.append(f"async.md: the paired t-tests are not quoted as {quoted!r}")
    return problems


# ---- the tests -----------------------------------------------------------------------------------
def _results() -> str:
    return (DOCS / "RESULTS.md").read_text()


def test_results_page_holds_the_generated_table_of_verdicts():
    assert generated_block_problems(_results()) == []


def test_every_changed_verdict_is_the_redrawn_one():
    assert changed_verdict_problems(_results()) == []


def test_every_verdict_the_prose_states_is_a_redrawn_one():
    assert prose_verdict_problems(_results()) == []


def test_every_number_of_the_claim_sections_is_in_the_redrawn_files():
    assert number_problems(_results(), _sources()) == []


def test_the_lm_page_states_the_lm_study_verdicts():
    assert lm_problems((DOCS / "RESULTS_LM.md").read_text()) == []


def test_each_check_fails_on_a_tampered_page():
    doc, lm = _results(), (DOCS / "RESULTS_LM.md").read_text()
    row = "| GRPO complexity, last 10 − first 10 epochs | collapse | reproduced: falls in 5/5 seeds | **inconclusive**"
    assert row in doc
    assert changed_verdict_problems(doc.replace(row, row.replace("**inconclusive**", "**worse**")))
    generated = "| **worse, within ±0.05** (-0.0214 [-0.026, -0.016], Holm p = 0.0323, TOST Holm p = 0.0053) |"
    assert generated in doc
    assert generated_block_problems(doc.replace(generated, generated.replace("**worse", "**better"), 1))
    prose = "**worse** (−0.4046 [−0.505, −0.294], Holm p = 0.039)"
    assert prose in doc
    assert prose_verdict_problems(doc.replace(prose, prose.replace("**worse**", "**better**")))
    assert prose_verdict_problems(doc.replace(prose, prose.replace("0.039", "0.0039")))
    assert prose_verdict_problems(doc.replace(prose, prose.replace("−0.294]", "−0.249]")))
    assert prose_verdict_problems(doc.replace(prose, "**worse**"))
    sources = _sources()
    assert number_problems(doc.replace("0.9642 ± 0.0146", "0.9624 ± 0.0146"), sources)
    lm_row = "| 3/3 | 0.31 | **inconclusive** on three seeds"
    assert lm_row in lm
    assert lm_problems(lm.replace(lm_row, lm_row.replace("0.31", "0.32")))
    assert lm_problems(lm.replace(lm_row, lm_row.replace("**inconclusive**", "**better**")))
    assert lm_problems(lm.replace("| +0.059 ± 0.164 |", "| +0.095 ± 0.164 |"))


def test_the_sentences_that_overclaimed_stay_fixed():
    assert overclaim_problems(_pages()) == []
    discovery = (DOCS / "DISCOVERY.md").read_text()
    assert reachability_problems(discovery) == []
    assert repulsion_trend_problems(discovery) == []
    lm, warm, guide = ((DOCS / name).read_text() for name in ("RESULTS_LM.md", "WARM.md", "guides/async.md"))
    assert inconclusive_sentence_problems(lm, warm, guide) == []


def test_the_overclaim_checks_fail_on_the_old_sentences():
    pages = _pages()
    pages["docs/WARM.md"] += " Pop-GRPO against WARM M = 6 is not hacked later than GRPO."
    assert overclaim_problems(pages) == ["docs/WARM.md: 'is not hacked later'"]
    discovery = (DOCS / "DISCOVERY.md").read_text()
    assert repulsion_trend_problems(discovery.replace("+0.014, +0.027, +0.006", "+0.014, +0.027, +0.016"))
    assert reachability_problems(discovery.replace("all 8 peaks are reachable", "peaks 0–2 are unreachable"))
    lm, warm, guide = ((DOCS / name).read_text() for name in ("RESULTS_LM.md", "WARM.md", "guides/async.md"))
    assert inconclusive_sentence_problems(lm, warm, guide.replace("p = 0.23 and", "p = 0.02 and"))
