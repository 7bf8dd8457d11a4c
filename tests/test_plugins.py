"""A separately installed plugin adds an environment and a merge that a run then uses.

The toy plugin (tests/plugins/popgrpo_toy_plugin, walked through in docs/guides/extend.md) is
installed for real once per module: ``pip install --target`` writes its dist-info with the
``popgrpo.plugins`` entry point, and the ``popgrpo`` subprocesses find it on ``PYTHONPATH``,
as they would in site-packages. Nothing in popgrpo names the plugin.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.services import IN_CI, ray_subprocess_env, run_isolated

PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugins" / "popgrpo_toy_plugin"
ROOT = Path(__file__).resolve().parents[1]
# Two members, two rounds of two short epochs: the second round starts from the plugin's merge.
RUN = [
    "--config", "pop_grpo",
    "--set", "env.kind=bowl",
    "--set", "scheduler.merge=toy_best",
    "--set", "population.size=2",
    "--set", "scheduler.top_m=2",
    "--set", "run.epochs=4",
    "--set", "grpo.steps_per_epoch=2",
    "--set", "scheduler.interval_epochs=2",
    "--quiet",
]  # fmt: skip


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    """A directory holding the installed plugin (its package and dist-info), for PYTHONPATH."""
    if importlib.util.find_spec("setuptools") is None:  # the plugin's build backend, offline
        message = "setuptools is not installed: pip install setuptools (builds the toy plugin)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    work = tmp_path_factory.mktemp("toy-plugin")
    source = work / "source"  # a copy: the build writes egg-info beside the sources
    shutil.copytree(PLUGIN_SOURCE, source)
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    assert list(target.glob("popgrpo_toy_plugin-*.dist-info")), "pip wrote no dist-info"
    return str(target)


def popgrpo(plugin_path: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m popgrpo ARGS`` with the plugin installed (PYTHONPATH) and its own embedded Ray."""
    env = ray_subprocess_env("pgplug-")
    env["PYTHONPATH"] = os.pathsep.join([plugin_path, str(ROOT)])
    try:
        return run_isolated([sys.executable, "-m", "popgrpo", *args], 300, env=env, cwd=str(ROOT), merge_stderr=False)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)


def _check_run_used_the_plugin(out: Path) -> None:
    """The plugin's merge is in the lineage and the bowl's rewards, all in (10, 11], in the metrics."""
    lineage = [json.loads(line) for line in (out / "lineage.jsonl").read_text().splitlines()]
    assert [r["merge"]["kind"] for r in lineage] == ["toy_best"]
    assert lineage[0]["merge"]["members"] == lineage[0]["selected"][:1]
    metrics = pd.read_parquet(out / "metrics.parquet")
    trained = metrics[metrics["epoch"] >= 0]
    assert len(trained) == 2 * 4
    assert trained["reward_mean"].between(10.0, 11.0).all() and trained["reward_max"].between(10.0, 11.0).all()


def test_unknown_environment_lists_the_plugins_choice(plugin_path):
    res = popgrpo(plugin_path, "config", "--set", "env.kind=nope")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert "env.kind: unknown environment 'nope'; choices: bowl, code, idea, text" in res.stderr
    merges = popgrpo(plugin_path, "config", "--set", "scheduler.merge=toy_bst")
    assert merges.returncode == 2 and "(did you mean 'toy_best'?)" in merges.stderr


def test_plugin_environment_and_merge_train_locally(plugin_path, tmp_path):
    res = popgrpo(plugin_path, "train", *RUN, "--executor", "local", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    _check_run_used_the_plugin(tmp_path / "run")


@pytest.mark.ray
@pytest.mark.heavy
def test_plugin_environment_and_merge_train_on_ray(plugin_path, tmp_path):
    """Ray's workers find the plugin too (they load it from the same entry point), with the local numbers."""
    res = popgrpo(plugin_path, "train", *RUN, "--out", str(tmp_path / "ray"))
    assert res.returncode == 0, res.stderr
    _check_run_used_the_plugin(tmp_path / "ray")
    local = popgrpo(plugin_path, "train", *RUN, "--executor", "local", "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    assert (tmp_path / "ray" / "summary.json").read_text() == (tmp_path / "local" / "summary.json").read_text()


@pytest.mark.parametrize("vectorize", [False, pytest.param(True, marks=pytest.mark.heavy)])
def test_a_plugin_policy_trains_as_the_builtin_one(plugin_path, tmp_path, vectorize):
    """``toy_gaussian`` is the built-in Gaussian policy registered as a plain factory: a run with it
    gives the built-in's metrics and lineage bit for bit, packed or not, with the svd mutation
    (which starts from each member's round-0 weights at the environment's ``idea_dim``)."""
    common = [
        "--config", "pop_grpo", "--set", "population.size=3", "--set", "scheduler.top_m=2",
        "--set", "run.epochs=4", "--set", "grpo.steps_per_epoch=2", "--set", "scheduler.interval_epochs=2",
        "--set", "scheduler.mutate=svd", "--set", f"population.vectorize={str(vectorize).lower()}",
        "--executor", "local", "--quiet",
    ]  # fmt: skip
    runs = {}
    for kind in ("gaussian", "toy_gaussian"):
        out = tmp_path / kind
        res = popgrpo(plugin_path, "train", *common, "--set", f"policy.kind={kind}", "--out", str(out))
        assert res.returncode == 0, res.stderr
        runs[kind] = out
    plugin, builtin = (pd.read_parquet(runs[k] / "metrics.parquet") for k in ("toy_gaussian", "gaussian"))
    pd.testing.assert_frame_equal(plugin, builtin, check_exact=True)
    assert (runs["toy_gaussian"] / "lineage.jsonl").read_text() == (runs["gaussian"] / "lineage.jsonl").read_text()
    assert len(plugin) == 3 * 4 and plugin["reward_mean"].notna().all()


def test_the_extend_guide_shows_the_plugins_registrations():
    """docs/guides/extend.md quotes the plugin's register calls as they are."""
    import re

    page = (ROOT / "docs" / "guides" / "extend.md").read_text()
    [block] = [b for b in re.findall(r"^```python\n(.*?)^```", page, re.S | re.M) if "ENVIRONMENTS.register" in b]
    source = (PLUGIN_SOURCE / "popgrpo_toy_plugin" / "__init__.py").read_text()
    assert block.strip() in source
