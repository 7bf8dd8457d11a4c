"""Where to watch a run: the lines ``popgrpo train`` and ``reproduce`` print when they start.

The Ray dashboard's address comes from Ray itself (the connected session's context, so
an attached cluster gives its own dashboard, wherever it runs). With token authentication
on (Ray's default for a local cluster), the page asks for the token: the hint says where
the token is, never what it is.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from popgrpo.config import RunConfig

__all__ = ["DASHBOARD_PATH", "auth_hint", "charts_hint", "ray_dashboard_url", "ray_session_dir", "watch_lines"]

# popgrpo's Grafana dashboard: dashboards/ at the repository root; a wheel installs it as
# popgrpo/dashboards/ (pyproject).
_PACKAGED = Path(__file__).resolve().parents[1] / "dashboards" / "popgrpo.json"
DASHBOARD_PATH = (
    _PACKAGED if _PACKAGED.is_file() else Path(__file__).resolve().parents[2] / "dashboards" / "popgrpo.json"
)


def _ray_context() -> Any:
    """The connected session's ``RayContext``; None when Ray is not connected.

    Connected already, ``ray.init`` returns this session's context instead of starting
    anything (Ray's documented way to read the dashboard address; ``ray.get_dashboard_url``
    is deprecated). It also sets a SIGTERM handler of its own before it looks, so the
    caller's handler (a run's stop handler, :mod:`popgrpo.runtime.stopping`) is put back.
    """
    import ray

    if not ray.is_initialized():
        return None
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return ray.init(ignore_reinit_error=True)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)


def ray_dashboard_url() -> str | None:
    """``http://HOST:PORT`` of the connected cluster's dashboard; None without one (or without Ray)."""
    context = _ray_context()
    url = context.dashboard_url if context is not None else None
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def ray_session_dir() -> Path | None:
    """The connected Ray session's folder on this machine (where Ray writes its Prometheus
    scrape config); None without Ray."""
    context = _ray_context()
    session = context.address_info.get("session_dir") if context is not None else None
    return Path(session) if session else None


def auth_hint(environ: Mapping[str, str] = os.environ, home: Path | None = None) -> str | None:
    """How to get past the dashboard's "Authentication Token Required"; None when auth is off.

    Read after Ray connected: ``ray.init`` sets ``RAY_AUTH_MODE=token`` in this process when
    it turns token authentication on by default. The token's place follows Ray's order:
    ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``.
    """
    if environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    if environ.get("RAY_AUTH_TOKEN"):
        where = "$RAY_AUTH_TOKEN"
    elif environ.get("RAY_AUTH_TOKEN_PATH"):
        where = environ["RAY_AUTH_TOKEN_PATH"]
    else:
        where = str((home or Path.home()) / ".ray" / "auth_token")
    return f"token auth is on: when the page asks, paste the token from {where}, which `ray get-auth-token` prints"


def _command(name: str) -> str:
    """``name`` as the user can type it: the bare name when the shell finds it on the PATH (an
    activated virtualenv), else the script beside this Python (``.venv/bin/tensorboard``)."""
    if shutil.which(name):
        return name
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def watch_lines(run_dir: str | Path | None, run: RunConfig | None, ray_connected: bool) -> list[str]:
    """The lines to print at start: the Ray dashboard (with how to log in) and the trackers' viewers.

    ``run``: the run's ``run`` config section (its loggers), or None for no tracker lines.
    """
    lines = []
    if ray_connected:
        url = ray_dashboard_url()
        if url:
            hint = auth_hint()
            lines.append(f"Ray dashboard: {url}" + (f" ({hint})" if hint else ""))
        else:
            lines.append("Ray dashboard: none on this cluster (started without it)")
    if run_dir is not None and run is not None:
        root = Path(run_dir).parent
        if "tensorboard" in run.loggers:
            lines.append(f"TensorBoard: {_command('tensorboard')} --logdir {root}  (then http://localhost:6006)")
        if "mlflow" in run.loggers:
            store = run.mlflow_tracking_uri or str(root / "mlruns")
            lines.append(f"MLflow: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {store}")
        if "wandb" in run.loggers:
            where = "offline, `wandb sync` uploads it" if run.wandb_mode == "offline" else "online"
            lines.append(f"W&B: {Path(run_dir) / 'wandb'} ({where})")
    return lines


def charts_hint(session_dir: Path | None) -> str:
    """The one line a run with an embedded Ray prints about charts: the Ray dashboard's Metrics
    tab stays empty ("Prometheus or Grafana not detected") until these run beside it."""
    session = f" --ray-session-dir {shlex.quote(str(session_dir))}" if session_dir else ""
    return (
        f"Metrics charts: `popgrpo monitor{session}` in another terminal (needs prometheus) serves the live "
        f"popgrpo_* series; `popgrpo dashboards install` puts the Grafana dashboard {DASHBOARD_PATH} into a "
        "Grafana (docs/guides/grafana.md)"
    )
