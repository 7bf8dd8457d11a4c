"""``popgrpo monitor`` on a real Ray session: the Prometheus it starts sees a run's ``popgrpo_*`` series.

Uses the scrape configuration Ray wrote for the package's local Ray session (its service
discovery lists the session's metrics agents), with the scrape interval shortened to 1 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from popgrpo.cli import main
from popgrpo.config import load_config, preset_path
from popgrpo.runtime.ray_executor import RayExecutor
from tests.driving import drive
from tests.services import GroupWatchdog, free_port

pytestmark = pytest.mark.ray


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]["result"]


@pytest.mark.requires("prometheus")
def test_monitor_scrapes_the_sessions_popgrpo_series(ray_local, tmp_path):
    session = Path(ray_local.ctx.address_info["session_dir"])
    deadline = time.time() + 30  # written when the dashboard's metrics module starts
    while not (session / "metrics" / "prometheus" / "prometheus.yml").is_file() and time.time() < deadline:
        time.sleep(0.2)
    port = free_port()
    monitor = subprocess.Popen(
        [sys.executable, "-m", "popgrpo", "monitor", "--ray-session-dir", str(session), "--port", str(port),
         "--scrape-interval", "1s", "--storage", str(tmp_path / "prom")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    watchdog = GroupWatchdog(monitor.pid)  # the monitor and its prometheus go if pytest dies
    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=3", "population.members_per_actor=3", "run.epochs=6", "grpo.steps_per_epoch=2"],
    )
    executor = RayExecutor(cfg, run_dir=tmp_path / "mon-run")
    try:
        drive(cfg, executor)
        series: list[dict] = []
        deadline = time.time() + 60
        while len(series) < 3 and time.time() < deadline:
            assert monitor.poll() is None, monitor.stdout.read()
            with contextlib.suppress(OSError):
                series = _query(port, 'ray_popgrpo_reward_mean{run="mon-run"}')
            time.sleep(0.5)
        assert sorted(s["metric"]["member"] for s in series) == ["0", "1", "2"]
    finally:
        executor.close()
        monitor.send_signal(signal.SIGINT)  # what Ctrl-C does
        out, _ = monitor.communicate(timeout=120)  # the monitor stops Prometheus within 3 × 10 s
        watchdog.disarm()
    assert monitor.returncode == 0, out
    assert f"Prometheus at http://127.0.0.1:{port}" in out


@pytest.mark.requires("prometheus")
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_monitor_stops_prometheus_on_int_or_term_even_when_started_with_int_ignored(tmp_path, stop):
    """A shell script's background job inherits SIGINT ignored; Ctrl-C and kill still stop the monitor."""
    session = tmp_path / "session"
    (session / "metrics" / "prometheus").mkdir(parents=True)
    discovery = str(session / "prom_metrics_service_discovery.json")
    (session / "metrics" / "prometheus" / "prometheus.yml").write_text(
        json.dumps({"scrape_configs": [{"job_name": "ray", "file_sd_configs": [{"files": [discovery]}]}]})
    )
    port = free_port()
    monitor = subprocess.Popen(
        [sys.executable, "-m", "popgrpo", "monitor", "--ray-session-dir", str(session), "--port", str(port),
         "--storage", str(tmp_path / "prom")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    watchdog = GroupWatchdog(monitor.pid)
    try:
        deadline = time.time() + 60
        ready = False
        while not ready and time.time() < deadline:
            assert monitor.poll() is None, monitor.stdout.read()
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                ready = True
            time.sleep(0.3)
        assert ready, "prometheus never answered /-/ready"
        monitor.send_signal(stop)
        out, _ = monitor.communicate(timeout=60)  # the monitor stops Prometheus within 3 × 10 s
    finally:
        if monitor.poll() is None:
            os.killpg(monitor.pid, signal.SIGKILL)
            monitor.wait()
        watchdog.disarm()
    assert monitor.returncode == 0, out
    with pytest.raises(OSError):  # Prometheus went with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)


def test_monitor_without_a_ray_session_exits_2_with_one_line(tmp_path, capsys):
    assert main(["monitor", "--ray-session-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "prometheus.yml not found" in err


def test_stopping_escalates_to_kill_when_prometheus_ignores_int_and_term():
    from popgrpo.ops.monitor import _stop

    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\nfor s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert stubborn.stdout.readline().strip() == "ready"  # its handlers are in place
        _stop(stubborn, grace_s=0.5)
        assert stubborn.poll() == -signal.SIGKILL
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        stubborn.wait()
