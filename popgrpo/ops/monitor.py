"""What ``popgrpo monitor`` runs (its parser: :mod:`popgrpo.cli.ops`): a local Prometheus scraping the Ray session, for live ``popgrpo_*`` charts.

Ray's dashboard writes, for every session, ``<session dir>/metrics/prometheus/prometheus.yml``:
a scrape job whose targets come from the session's service-discovery file, which Ray keeps
up to date as nodes come and go. ``ray metrics launch-prometheus`` would download a
Prometheus; this command runs the ``prometheus`` already installed (Debian: ``apt-get
install prometheus``) on that very file, in the foreground until Ctrl-C or SIGTERM.

What it makes work:

- Prometheus' own page (``http://127.0.0.1:9090/graph``): every ``ray_popgrpo_*`` series, live.
- The Ray dashboard finds it at ``$RAY_PROMETHEUS_HOST`` (default ``http://localhost:9090``,
  hence this command's default port); its Metrics tab's charts are Grafana panels, so they
  also need a Grafana (``popgrpo dashboards install`` for popgrpo's own dashboard).

Nothing here imports Ray: the command may run on a laptop against a copied session folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import yaml

from popgrpo.config import ConfigError

__all__ = ["default_session_dir", "prometheus_command", "run_prometheus", "scrape_config"]


def default_session_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Ray's newest local session: ``$RAY_TMPDIR/ray/session_latest`` (Ray's default ``/tmp``)."""
    return Path(environ.get("RAY_TMPDIR") or "/tmp") / "ray" / "session_latest"


def scrape_config(session_dir: Path, scrape_interval: str | None = None) -> dict:
    """Ray's generated Prometheus config for the session, with the scrape interval optionally changed."""
    path = Path(session_dir) / "metrics" / "prometheus" / "prometheus.yml"
    if not path.is_file():
        raise ConfigError(
            f"{path} not found: is a Ray cluster with its dashboard running here? (pass --ray-session-dir, "
            "e.g. /tmp/ray/session_latest, or $RAY_TMPDIR/ray/session_latest for a popgrpo run's embedded Ray)"
        )
    try:
        config = yaml.safe_load(path.read_text())
        config["scrape_configs"][0]["file_sd_configs"]
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"{path}: not the scrape config Ray writes ({exc!r})") from None
    if scrape_interval:
        config.setdefault("global", {})["scrape_interval"] = scrape_interval
    return config


def prometheus_command(binary: str, config_file: Path, storage: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    return [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={storage}",
        f"--web.listen-address={host}:{port}",
    ]


def run_prometheus(binary: str, config_file: Path, storage: Path, port: int, host: str) -> int:
    """Run ``binary`` on ``config_file`` in the foreground until it exits (its status) or until
    SIGINT or SIGTERM (0), which stop it first (:func:`_stop`)."""
    previous = _interrupt_on_int_and_term()
    proc = subprocess.Popen(prometheus_command(binary, config_file, storage, port, host))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        return 0
    finally:
        if proc.poll() is None:
            _stop(proc)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.stdout.flush()


def _interrupt_on_int_and_term() -> dict:
    """SIGINT (Ctrl-C) and SIGTERM (``kill``) both raise KeyboardInterrupt, so either stops
    Prometheus before the monitor exits. Set outright: a process started in the background
    of a shell script inherits SIGINT ignored, and Python then leaves it ignored. Returns the
    handlers replaced (none off the main thread, where signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGINT (Prometheus flushes its head block), then SIGTERM, then SIGKILL, ``grace_s`` apart:
    a Prometheus slow to shut down on a busy machine never keeps the monitor from exiting."""
    for send in (lambda: proc.send_signal(signal.SIGINT), proc.terminate, proc.kill):
        if proc.poll() is not None:
            return
        send()
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
