"""The documentation, checked as a reader uses it.

The site builds with ``mkdocs build --strict`` (a broken link, anchor, snippet or API
reference fails it), its reference pages are generated from the code, every command the
getting-started page shows runs as shown, the README's commands are among them and its links
resolve, the bring-your-own example trains, and a real Chromium shows the built site.
Without mkdocs (the ``docs`` extra) the site tests skip, except in CI, where they fail.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.services import require_module

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _bash_blocks(page: Path) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M)


def _commands(block: str) -> list[str]:
    """The block's commands: one per line, comments and blank lines dropped."""
    lines = (re.sub(r"\s+#\s.*$", "", line).strip() for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _require_mkdocs() -> None:
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        require_module(module)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built strict from another working directory (the config's paths are its own)."""
    _require_mkdocs()
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(out)],
        cwd=out.parent, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "WARNING" not in res.stderr, res.stderr[-5000:]
    return out


def test_site_builds_strict_with_every_page_of_the_nav(site):
    for page in [
        "index.html",
        "getting-started/index.html",
        "concepts/index.html",
        "guides/kubernetes/index.html",
        "studies/benchmarks/index.html",
        "reference/config/index.html",
        "reference/api-core/index.html",
        "reference/api-protocols/index.html",
    ]:
        assert (site / page).is_file(), page
    # Pages that include a file from outside docs/ show that file's text.
    assert "popgrpo on Kubernetes (KubeRay)" in (site / "guides/kubernetes/index.html").read_text()
    benchmarks = (REPO / "BENCHMARKS.md").read_text().splitlines()[0].lstrip("# ")
    assert benchmarks in (site / "studies/benchmarks/index.html").read_text()


def test_config_reference_page_lists_every_field(site):
    from popgrpo.config import config_markdown

    html = (site / "reference/config/index.html").read_text()
    keys = [row.split("|")[1].strip().strip("`") for row in config_markdown().splitlines()[2:]]
    assert len(keys) > 40
    assert [k for k in keys if f"<code>{k}</code>" not in html] == []


def test_api_reference_is_generated_from_the_docstrings(site):
    import popgrpo.core

    html = (site / "reference/api-core/index.html").read_text()
    # Every public name of popgrpo.core has its own entry, under the module that defines it.
    missing = [
        name for name in popgrpo.core.__all__ if f'id="{getattr(popgrpo.core, name).__module__}.{name}"' not in html
    ]
    assert missing == []
    # The text is the docstring's, shapes included.
    assert "Normalise rewards within each group" in html and "<code>[P, G]</code> rewards" in html
    protocols = (site / "reference/api-protocols/index.html").read_text()
    for name in ("popgrpo.envs.Environment", "popgrpo.policies.Policy", "popgrpo.algorithms.rollouts.RewardSource"):
        assert f'id="{name}"' in protocols, name


@pytest.mark.integration
def test_every_getting_started_command_runs_as_shown(tmp_path):
    """Each ``bash`` block of the page runs, verbatim, in a fresh directory with ``.venv`` beside it
    and on the PATH, as after the page's ``source .venv/bin/activate``; ``make`` targets are
    dry-run (``make test`` would run this very suite)."""
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "popgrpo").exists():
        pytest.skip(f"no popgrpo script next to {sys.executable}")
    (tmp_path / ".venv").symlink_to(venv)
    page = DOCS / "getting-started.md"
    recipes = {"run": "popgrpo train", "test": "pytest"}
    outputs = []
    for block in _bash_blocks(page):
        commands = _commands(block)
        if all(c.startswith("make ") for c in commands):
            for command in commands:
                target = command.split()[1]
                dry = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60)
                assert dry.returncode == 0, dry.stderr
                assert recipes[target] in dry.stdout, dry.stdout
            continue
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VIRTUAL_ENV": str(venv)}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
        res = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, f"{block}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        outputs.append((block, res.stdout + res.stderr))
    assert len(outputs) >= 3
    # What the page says the first run wrote is there.
    table = page.read_text().split("| in `runs/first/` | what it is |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([^`]+)` \|", table, re.M)
    assert "metrics.parquet" in listed
    assert [name for name in listed if not (tmp_path / "runs" / "first" / name).exists()] == []
    # The bad value stops the run with exit code 2 and writes nothing.
    [(_, bad)] = [(b, out) for b, out in outputs if "grpo.lr=fast" in b]
    assert bad.count("exit 2") == 3 and "grpo.lr" in bad
    assert "did you mean run.epochs?" in bad and "did you mean pop_grpo" in bad
    assert not (tmp_path / "runs" / "never").exists()
    # `popgrpo` alone prints the usage, `config --list` the presets.
    [(_, usage)] = [(b, out) for b, out in outputs if "source .venv/bin/activate" in b]
    assert "usage: popgrpo" in usage and "pop_grpo  " in usage


def _section(page: Path, heading: str) -> str:
    """The text of the ``## heading`` section of ``page``, up to the next ``## ``."""
    return page.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.heavy
def test_bring_your_own_reward_runs_as_shown(tmp_path):
    """The guide's reward section, followed exactly: its files (fenced with ``title=``) written
    to a fresh working directory, its commands run there as typed, with the virtualenv on PATH
    as after ``source .venv/bin/activate``, on the default executor (an embedded Ray)."""
    pytest.importorskip("transformers")
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "popgrpo").exists():
        pytest.skip(f"no popgrpo script next to {sys.executable}")
    from tests.services import ray_subprocess_env

    section = _section(DOCS / "guides" / "bring-your-own.md", "A reward for language-model members")
    files = re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```', section, re.S | re.M)
    assert [name for name, _ in files] == ["my_rewards.py", "byo.yaml"]
    for name, text in files:
        (tmp_path / name).write_text(text)
    [block] = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    env = ray_subprocess_env("pgbyo-") | {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "OMP_NUM_THREADS": "1",
    }
    try:
        res = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        import shutil

        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert res.returncode == 0, f"{block}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    import pandas as pd

    metrics = pd.read_parquet(tmp_path / "runs" / "byo" / "metrics.parquet")
    assert sorted(metrics["epoch"]) == [0, 1, 2, 3] and set(metrics["member"]) == {0}
    assert (tmp_path / "runs" / "byo" / "summary.json").is_file()


def test_readme_commands_are_the_getting_started_pages():
    """The README shows a subset of the getting-started commands, so the test above runs them."""
    shown = {c for block in _bash_blocks(REPO / "README.md") for c in _commands(block)}
    run = {c for block in _bash_blocks(DOCS / "getting-started.md") for c in _commands(block)}
    assert {"make run", "make test"} <= shown
    assert shown - run == set()


def test_make_docs_builds_strict_and_serves_on_loopback():
    dry = {
        t: subprocess.run(["make", "-n", t], cwd=REPO, capture_output=True, text=True, timeout=60)
        for t in ("docs", "docs-serve")
    }
    assert all(res.returncode == 0 for res in dry.values()), {t: r.stderr for t, r in dry.items()}
    assert "mkdocs build --strict" in dry["docs"].stdout
    assert "mkdocs serve" in dry["docs-serve"].stdout and "--dev-addr 127.0.0.1:" in dry["docs-serve"].stdout


def test_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+://", t)]
    assert len(local) > 20
    assert [t for t in local if not (REPO / t).exists()] == []


def test_bring_your_own_environment_example_trains(capsys):
    page = (DOCS / "guides" / "bring-your-own.md").read_text()
    [example] = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    exec(compile(example, "bring-your-own.md", "exec"), {"__name__": "docs_example"})
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert all(0 < float(r[2]) <= 1 for r in rows)  # the archive over the Ring's behaviours fills


@pytest.mark.requires("chromium")
def test_built_site_in_a_real_browser(site, tmp_path):
    """Headless Chromium opens the front page and a guide from the built site served on loopback.

    ``POPGRPO_SCREENSHOT_DIR=docs/img/site`` keeps the screenshots (committed there)."""
    from tests.browser import Chromium

    out = Path(os.environ.get("POPGRPO_SCREENSHOT_DIR") or tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    browser = None
    try:
        browser = Chromium(width=1280, height=800)
        base = f"http://127.0.0.1:{server.server_address[1]}"
        front = browser.capture(
            f"{base}/", expect=["Where to start", "Pop-GRPO", "How-to guides"], png=out / "front_page.png", settle_s=1
        )
        assert "Getting started" in front and "Reference" in front
        guide = browser.capture(
            f"{base}/guides/scale/",
            expect=["Scale a population", "Where the archives live", "Vectorised packs"],
            png=out / "guide_scale.png",
            settle_s=1,
        )
        assert "Run on a cluster with Ray Jobs" in guide  # the navigation lists the other guides
        for png in ("front_page.png", "guide_scale.png"):
            assert (out / png).read_bytes()[:4] == b"\x89PNG"
    finally:
        if browser is not None:
            browser.stop()
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # the request log would fill the test output
        pass
