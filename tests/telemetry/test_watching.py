"""The start-up lines that say where to watch a run: dashboard URL, how to log in, viewers."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import pytest

from popgrpo.config import load_config
from popgrpo.telemetry.watching import auth_hint, watch_lines


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


def test_viewer_lines_follow_the_configured_loggers(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # as activated
    run = load_config(None, ["run.loggers=[tensorboard,mlflow,wandb]"]).run
    lines = watch_lines(tmp_path / "runs" / "r1", run, ray_connected=False)
    assert lines[0].startswith(f"TensorBoard: tensorboard --logdir {tmp_path / 'runs'}")
    assert f"--backend-store-uri {tmp_path / 'runs' / 'mlruns'}" in lines[1]
    assert "wandb sync" in lines[2]
    assert watch_lines(tmp_path / "r", load_config(None, ["run.loggers=[]"]).run, ray_connected=False) == []


def test_the_tensorboard_line_works_without_an_activated_virtualenv(tmp_path, monkeypatch):
    if not (Path(sys.executable).parent / "tensorboard").exists():
        pytest.skip("no tensorboard script beside this Python")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    [line] = watch_lines(tmp_path / "runs" / "r1", load_config(None).run, ray_connected=False)
    assert line.startswith(f"TensorBoard: {Path(sys.executable).parent / 'tensorboard'} --logdir ")
