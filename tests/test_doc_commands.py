"""Every command block of the getting-started page and the guides, run as written or listed here.

The docs write commands one way: a ``bash`` block holds commands as they are typed in the
project's folder after ``source .venv/bin/activate`` (``popgrpo``, never ``.venv/bin/popgrpo``),
and a ``text`` block shows a command after ``$ `` with what it prints. Each ``bash`` block of
docs/getting-started.md, docs/guides/*.md and the files the guides include (``--8<--``) has a
verdict in :data:`VERDICTS`, keyed by its page and its first command:

- :class:`Run`: run here, verbatim, by ``bash -euo pipefail`` in a fresh working directory with
  the repository's virtualenv on ``PATH`` (as after activating it), a link to the repository's
  ``jobs/`` and ``tests/`` where a block names them, and its own embedded Ray; the blocks that
  train a preset's full length are marked slow (``make test-slow``).
- :class:`Elsewhere`: run as written by another test, named.
- :class:`NotHere`: cannot run on this machine, with the reason (a real cluster, Kubernetes, a
  GPU, Grafana, the network, or a length no test suite can pay).

A block added to a page without a verdict fails :func:`test_every_command_block_has_a_verdict`.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import ray_subprocess_env, run_isolated

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


@dataclass(frozen=True)
class Run:
    slow: bool = False
    timeout_s: int = 300
    plugin: bool = False  # the toy plugin installed first, as the page says (tests/plugins)
    check: str = ""  # text the block's output must hold
    after: str = ""  # the first command of a block of the same page to run first, in the same folder
    requires: tuple[str, ...] = ()  # programs the block runs (keys of tests/services.py PROGRAMS)


@dataclass(frozen=True)
class Elsewhere:
    test: str


@dataclass(frozen=True)
class NotHere:
    reason: str


CLUSTER = "needs a real multi-node Ray cluster (an address, a head node)"
KUBERNETES = "needs Kubernetes (kubectl, a KubeRay operator) or Docker"
GRAFANA = "needs a Grafana server, which this machine has no package for"
GETTING_STARTED = "tests/test_docs.py::test_every_getting_started_command_runs_as_shown"

VERDICTS: dict[tuple[str, str], Run | Elsewhere | NotHere] = {
    # docs/getting-started.md: every block, as the page's own test runs them.
    ("docs/getting-started.md", "make run"): Elsewhere(GETTING_STARTED),
    ("docs/getting-started.md", "source .venv/bin/activate"): Elsewhere(GETTING_STARTED),
    ("docs/getting-started.md", "popgrpo train --config pop_grpo --set run.epochs=20 --executor local --out runs/first"): Elsewhere(GETTING_STARTED),
    ("docs/getting-started.md", "python -c \"import pandas as pd; m = pd.read_parquet('runs/first/metrics.parquet'); print(m.groupby('epoch')[['reward_mean', 'reward_max', 'diversity']].mean().tail(3))\""): Elsewhere(GETTING_STARTED),
    ("docs/getting-started.md", "popgrpo config --config maxent_grpo --set maxent.entropy.target=0.5 > my.yaml"): Elsewhere(GETTING_STARTED),
    ("docs/getting-started.md", 'popgrpo train --set grpo.lr=fast --out runs/never || echo "exit $?"'): Elsewhere(GETTING_STARTED),
    # docs/guides/
    ("docs/guides/async.md", "popgrpo train --config pop_grpo --set scheduler.mode=async \\"): Run(slow=True, timeout_s=900),
    ("docs/guides/bring-your-own.md", "popgrpo lm tiny --out runs/tiny-lm"): Elsewhere(
        "tests/test_docs.py::test_bring_your_own_reward_runs_as_shown"
    ),
    ("docs/guides/bring-your-own.md", "popgrpo rm train --out runs/rms --set finetune.n_models=6"): NotHere(
        "fine-tunes six reward models, then trains on their proxy: far past a test's length on 2 cores; "
        "tests/reward_models/test_rm_train.py trains two and tests/reward_models run the proxy"
    ),
    ("docs/guides/bring-your-own.md", "popgrpo reproduce --study warm"): NotHere(
        "the full WARM study is hours on 2 cores; tests/research/study/test_warm.py runs its parts small"
    ),
    ("docs/guides/cluster.md", "export RAY_AUTH_TOKEN=..."): NotHere(CLUSTER),
    ("docs/guides/cluster.md", "RAY_REDIS_ADDRESS=redis-host:6379 ray start --head --redis-password \"$REDIS_PASSWORD\" ..."): NotHere(
        CLUSTER + " with Redis-backed GCS; tests/cluster/test_gcs_ft.py starts one on this machine"
    ),
    ("docs/guides/code.md", "popgrpo lm pretrain --out runs/program-lm"): NotHere(
        "`popgrpo lm pretrain` trains for 7-10 minutes on 2 cores before the rest; "
        "tests/integration/test_code_programs.py runs the preset, eval and report on a toy model"
    ),
    ("docs/guides/config.md", "popgrpo config --list"): Run(slow=True, timeout_s=900, check="pop_grpo"),
    ("docs/guides/extend.md", "popgrpo config --set env.kind=bowl --set scheduler.merge=toy_best"): Run(
        slow=True, timeout_s=900, plugin=True, check="kind: bowl"
    ),
    ("docs/guides/lm.md", "popgrpo lm tiny --out runs/tiny-lm"): Run(slow=True, timeout_s=900, requires=("sandbox",)),
    ("docs/guides/lm.md", "popgrpo submit lm_exec --set policy.causal_lm.model=Qwen/Qwen2.5-0.5B-Instruct \\"): NotHere(
        CLUSTER + " with a GPU, and the network (a Hugging Face Hub model)"
    ),
    ("docs/guides/lm.md", "popgrpo lm pretrain --out runs/program-lm"): NotHere(
        "`popgrpo lm pretrain` trains for 7-10 minutes on 2 cores; tests/policies and tests/research/study run "
        "`lm pretrain --quick`, `lm programs` and lm_programs on small models"
    ),
    ("docs/guides/lm.md", "popgrpo train --config lm_programs --set policy.causal_lm.share_base=true \\"): NotHere(
        "needs the program model of `popgrpo lm pretrain` (7-10 minutes); "
        "tests/runtime/test_lm_ray.py runs shared-base members packed in actors"
    ),
    ("docs/guides/lm.md", 'pip install "popgrpo[vllm]"'): NotHere("needs a GPU (vLLM brings a CUDA build of torch)"),
    ("docs/guides/presets.md", "popgrpo config --list"): Run(check="| `run.epochs` |"),
    ("docs/guides/presets.md", "popgrpo train"): Run(slow=True, timeout_s=1800, after="popgrpo config --list"),
    ("docs/guides/presets.md", "popgrpo train --address 10.0.0.5:6379"): NotHere(CLUSTER),
    ("docs/guides/resume.md", "popgrpo train --resume RUN_DIR"): NotHere(
        "RUN_DIR is the reader's interrupted run; tests/test_resume.py interrupts runs and resumes them"
    ),
    ("docs/guides/scale.md", "popgrpo train --config pop_grpo --set scheduler.mode=async \\"): Run(slow=True, timeout_s=900),
    ("docs/guides/scale.md", "popgrpo simulate --config pop_grpo --set population.size=1000 --set run.epochs=100 \\"): NotHere(
        "simulates 1000 members on 100 nodes for three seeds: over ten minutes on 2 cores; "
        "tests/research/sim runs the simulator small"
    ),
    # Files the guides include.
    ("cluster/README.md", "ray get-auth-token --generate"): NotHere(CLUSTER + "; it writes the cluster's secrets"),
    ("cluster/README.md", "ray up cluster/aws.yaml"): NotHere(CLUSTER + " on a cloud account or machines"),
    ("cluster/README.md", "ray job submit --runtime-env cluster/runtime_env.yaml -- \\"): NotHere(CLUSTER),
    ("cluster/README.md", "ray job stop <submission id>"): NotHere(CLUSTER),
    ("dashboards/README.md", "export GRAFANA_TOKEN=glsa_..."): NotHere(GRAFANA),
    ("dashboards/README.md", "popgrpo dashboards install --ray-session-dir /tmp/ray/session_latest"): NotHere(
        "needs the provisioning of a Ray session that runs Grafana; "
        "tests/runtime/test_dashboards_prometheus.py copies the dashboard into a real session's"
    ),
    ("dashboards/README.md", "prometheus --config.file=/tmp/ray/session_latest/metrics/prometheus/prometheus.yml"): NotHere(
        "a Prometheus in the foreground on a running Ray session's scrape configuration; "
        "tests/runtime/test_dashboards_prometheus.py runs one against a real run"
    ),
    ("dashboards/README.md", "grafana server --config /tmp/ray/session_latest/metrics/grafana/grafana.ini --homepath /usr/share/grafana"): NotHere(
        GRAFANA
    ),
    ("deploy/README.md", "docker build -f deploy/Dockerfile -t popgrpo:0.1.0 ."): NotHere(KUBERNETES),
    ("deploy/README.md", "kubectl create secret generic popgrpo-ray-auth --from-literal=auth_token=\"$(openssl rand -hex 32)\""): NotHere(
        KUBERNETES
    ),
    ("deploy/README.md", "kubectl apply -f deploy/redis.yaml"): NotHere(KUBERNETES),
    ("deploy/README.md", "kubectl port-forward svc/popgrpo-head-svc 8265:8265 &"): NotHere(KUBERNETES),
    ("deploy/README.md", "kubectl apply -f deploy/rayjob.yaml"): NotHere(KUBERNETES),
    ("deploy/README.md", "ray job submit -- python -m popgrpo train --resume /runs/pop-grpo-1"): NotHere(KUBERNETES),
    ("deploy/README.md", "kubectl delete rayjob popgrpo-pop-grpo"): NotHere(KUBERNETES),
}  # fmt: skip


def _pages() -> list[Path]:
    """The getting-started page, every guide, and the files the guides include."""
    pages = [DOCS / "getting-started.md"]
    for guide in sorted((DOCS / "guides").glob("*.md")):
        pages.append(guide)
        pages += [REPO / name for name in re.findall(r'^--8<-- "([^"]+)"', guide.read_text(), re.M)]
    return pages


def _first_command(block: str) -> str:
    """The block's first line that is not a comment, its trailing comment dropped."""
    lines = (re.sub(r"\s+#\s.*$", "", line).rstrip() for line in block.splitlines())
    return next(line for line in lines if line.strip() and not line.lstrip().startswith("#"))


def _blocks() -> dict[tuple[str, str], str]:
    out = {}
    for page in _pages():
        for block in re.findall(r"^```(?:bash|sh|shell|console)\n(.*?)^```", page.read_text(), re.S | re.M):
            key = (str(page.relative_to(REPO)), _first_command(block))
            assert key not in out, f"two blocks of {key[0]} start with {key[1]!r}: make the first commands differ"
            out[key] = block
    return out


def test_every_command_block_has_a_verdict():
    blocks = _blocks()
    assert sorted(set(blocks) - set(VERDICTS)) == [], "a command block with no verdict: add one to VERDICTS"
    assert sorted(set(VERDICTS) - set(blocks)) == [], "a verdict for a block no page has any more"
    for key, verdict in VERDICTS.items():
        if isinstance(verdict, Elsewhere):
            path, _, name = verdict.test.partition("::")
            assert f"def {name}(" in (REPO / path).read_text(), (key, verdict.test)


def test_the_docs_write_commands_one_way():
    """bash blocks hold commands as typed in an activated virtualenv: no ``.venv/bin/`` paths but the
    activation itself, and no ``$ `` prompts (those go in text blocks, with the output)."""
    for (page, first), block in _blocks().items():
        assert ".venv/bin/" not in block.replace("source .venv/bin/activate", ""), (page, first)
        assert not any(line.startswith("$ ") for line in block.splitlines()), (page, first)


def _install_toy_plugin(work: Path) -> str:
    """The toy plugin of tests/plugins installed (``pip install --target``), for PYTHONPATH."""
    source = work / "plugin-source"
    shutil.copytree(REPO / "tests" / "plugins" / "popgrpo_toy_plugin", source)
    target = work / "plugin-site"
    res = run_isolated(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(source)],
        300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout
    return str(target)


def _run_block(page: str, block: str, verdict: Run, tmp_path: Path) -> str:
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "popgrpo").exists():
        pytest.skip(f"no popgrpo script next to {sys.executable}")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(venv)
    for name in ("jobs", "tests"):  # blocks that name the repository's files (jobs/configs/...)
        (work / name).symlink_to(REPO / name)
    env = ray_subprocess_env("pgdoc-") | {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "OMP_NUM_THREADS": "1",
    }
    if verdict.plugin:
        env["PYTHONPATH"] = _install_toy_plugin(tmp_path)
    if verdict.after:
        block = _blocks()[(page, verdict.after)] + "\n" + block
    try:
        res = run_isolated(["bash", "-euo", "pipefail", "-c", block], verdict.timeout_s, env=env, cwd=str(work))
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert res.returncode == 0, f"{block}\n{res.stdout[-4000:]}"
    assert verdict.check in res.stdout, res.stdout[-4000:]
    return res.stdout


def _runs(slow: bool) -> list:
    blocks = _blocks()
    return [
        pytest.param(
            key,
            id=f"{key[0]}:{key[1][:40]}",
            marks=[pytest.mark.requires(*verdict.requires)] if verdict.requires else [],
        )
        for key, verdict in VERDICTS.items()
        if isinstance(verdict, Run) and verdict.slow == slow and key in blocks
    ]


@pytest.mark.integration
@pytest.mark.parametrize("key", _runs(slow=False))
def test_a_short_block_runs_as_written(key, tmp_path):
    verdict = VERDICTS[key]
    assert isinstance(verdict, Run)
    _run_block(key[0], _blocks()[key], verdict, tmp_path)


@pytest.mark.slow  # each trains a preset's full length (minutes on 2 cores)
@pytest.mark.full_length
@pytest.mark.integration
@pytest.mark.parametrize("key", _runs(slow=True))
def test_a_training_block_runs_as_written(key, tmp_path):
    verdict = VERDICTS[key]
    assert isinstance(verdict, Run)
    _run_block(key[0], _blocks()[key], verdict, tmp_path)
