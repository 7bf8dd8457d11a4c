"""The start-up lines that say where to watch a run: dashboard URL, how to log in, viewers."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from popgrpo.config import load_config
from popgrpo.telemetry.watching import auth_hint, watch_lines
from tests.services import ray_subprocess_env


def test_auth_hint_says_where_the_token_is_never_what_it_is(tmp_path):
    token = secrets.token_hex(16)
    assert auth_hint({}) is None  # auth off: nothing to say
    assert auth_hint({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": token}) is None
    by_env = auth_hint({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    assert "$RAY_AUTH_TOKEN" in by_env and token not in by_env
    by_path = auth_hint({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/etc/ray/token"})
    assert "/etc/ray/token" in by_path
    default = auth_hint({"RAY_AUTH_MODE": "TOKEN"}, home=tmp_path)
    assert str(tmp_path / ".ray" / "auth_token") in default and "ray get-auth-token" in default


def test_viewer_lines_follow_the_configured_loggers(tmp_path):
    run = load_config(None, ["run.loggers=[tensorboard,mlflow,wandb]"]).run
    lines = watch_lines(tmp_path / "runs" / "r1", run, ray_connected=False)
    assert lines[0].startswith(f"TensorBoard: tensorboard --logdir {tmp_path / 'runs'}")
    assert f"--backend-store-uri {tmp_path / 'runs' / 'mlruns'}" in lines[1]
    assert "wandb sync" in lines[2]
    assert watch_lines(tmp_path / "r", load_config(None, ["run.loggers=[]"]).run, ray_connected=False) == []


@pytest.mark.ray
def test_train_on_embedded_ray_prints_the_dashboard_it_started_and_where_the_token_is(tmp_path: Path):
    token = secrets.token_hex(16)
    env = ray_subprocess_env("pgwatch-") | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    port = env["POPGRPO_RAY_DASHBOARD_PORT"]
    # Long enough (a few seconds) that the dashboard is still up when the test asks it.
    args = ["--set", "run.epochs=6", "--set", "population.size=3", "--set", "grpo.steps_per_epoch=1"]
    proc = None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "popgrpo", "train", "--quiet", "--out", str(tmp_path / "run"), *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # The first line on stderr that names the dashboard comes while the run is on: the
        # dashboard must answer there, and refuse a request without the token.
        line = ""
        for line in proc.stderr:
            if "Ray dashboard:" in line:
                break
        url = f"http://127.0.0.1:{port}"
        assert f"popgrpo: Ray dashboard: {url} (token auth is on" in line, line
        assert "$RAY_AUTH_TOKEN" in line
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/version", timeout=10)
        assert refused.value.code == 401
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert token not in out + err + line
        assert f"TensorBoard: tensorboard --logdir {tmp_path}" in err
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
