"""The start-up lines that say where to watch a run: dashboard URL, how to log in, viewers."""

from __future__ import annotations

import secrets

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


def test_viewer_lines_follow_the_configured_loggers(tmp_path):
    run = load_config(None, ["run.loggers=[tensorboard,mlflow,wandb]"]).run
    lines = watch_lines(tmp_path / "runs" / "r1", run, ray_connected=False)
    assert lines[0].startswith(f"TensorBoard: tensorboard --logdir {tmp_path / 'runs'}")
    assert f"--backend-store-uri {tmp_path / 'runs' / 'mlruns'}" in lines[1]
    assert "wandb sync" in lines[2]
    assert watch_lines(tmp_path / "r", load_config(None, ["run.loggers=[]"]).run, ray_connected=False) == []


def test_train_prints_where_to_watch_on_stderr(tmp_path, capsys):
    from popgrpo.cli import main

    args = ["--set", "run.epochs=1", "--set", "population.size=3", "--set", "grpo.steps_per_epoch=1"]
    assert main(["train", "--executor", "local", "--quiet", "--out", str(tmp_path / "run"), *args]) == 0
    captured = capsys.readouterr()
    assert f"popgrpo: TensorBoard: tensorboard --logdir {tmp_path}" in captured.err
    assert "Ray dashboard" not in captured.err  # no Ray, no dashboard
    assert "TensorBoard" not in captured.out  # stdout stays the summary JSON
