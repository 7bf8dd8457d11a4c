"""Every metric docs/reference/metrics.md lists is scraped from the real Ray metrics endpoint during a run."""

import contextlib
import re
import threading
import time
import urllib.request

import pytest

from benchmarks.common import wait_until
from popgrpo.config import load_config, preset_path
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.telemetry.live import METRICS
from tests.driving import drive

pytestmark = pytest.mark.ray


def _scrape(port: int) -> dict[tuple[str, str], float]:
    """``{(metric name without ray_ prefix, label string): value}`` for popgrpo series."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"ray_(popgrpo_\w+)\{(.*)\} (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def test_every_listed_metric_is_exported_during_a_run(ray_local, tmp_path):
    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=3", "population.members_per_actor=3", "run.epochs=30", "grpo.steps_per_epoch=4"],
    )
    executor = RayExecutor(cfg, run_dir=tmp_path / "metrics-run")
    seen: dict = {}
    stop = threading.Event()

    def scraper():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                seen.update(_scrape(ray_local.metrics_port))
            time.sleep(0.3)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        rows, lineage = drive(cfg, executor)
        total_ideas = sum(r["ideas"] for r in rows)
        last_round = len(lineage) - 1
        deadline = time.time() + 30  # let the last reports arrive

        def reported(name):
            return [v for (n, labels), v in seen.items() if n == name and 'run="metrics-run"' in labels]

        # Ray's /metrics can serve a partial set of series on one scrape (ray-project/ray#63131):
        # wait for the counter's total and the last round's gauge both.
        while time.time() < deadline and (
            sum(reported("popgrpo_ideas_total")) < total_ideas
            or max(reported("popgrpo_round"), default=-1) < last_round
        ):
            time.sleep(0.5)
        executor.metrics.record_restart()  # the counter is exported once something failed
        deadline = time.time() + 20
        while time.time() < deadline and "popgrpo_restarts_total" not in {n for n, _ in seen}:
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=5)
        executor.close()
    exported = {name for name, _ in seen}
    assert set(METRICS) <= exported, f"missing: {set(METRICS) - exported}"
    ours = {k: v for k, v in seen.items() if 'run="metrics-run"' in k[1]}
    members = {
        re.search(r'member="(\d+)"', labels).group(1) for (name, labels) in ours if name == "popgrpo_reward_mean"
    }
    assert members == {"0", "1", "2"}
    ideas = sum(v for (name, _), v in ours.items() if name == "popgrpo_ideas_total")
    assert ideas == sum(r["ideas"] for r in rows)  # the counter adds up to every idea evaluated
    coverage = [v for (name, _), v in ours.items() if name == "popgrpo_archive_coverage"]
    assert coverage and all(0 < c <= 1 for c in coverage)
    assert last_round == 2
    assert max(v for (name, _), v in ours.items() if name == "popgrpo_round") == last_round


class _RecordingGauge:
    def __init__(self):
        self.sets = []

    def set(self, value, tags):
        self.sets.append((value, tags))


def test_gauges_are_re_set_so_ray_does_not_expire_them(ray_local):
    """Ray drops a gauge ~20 s after its last set: LiveMetrics re-sets each gauge's last value."""
    from popgrpo.telemetry.live import LiveMetrics

    live = LiveMetrics("keepalive-run", refresh_s=0.05)
    live._gauges["popgrpo_round"] = gauge = _RecordingGauge()
    live.record_round(7)
    # Waits with deadlines, not fixed sleeps: a busy machine may run the refresher late.
    assert wait_until(lambda: len(gauge.sets) >= 4, timeout=30)
    assert {v for v, _ in gauge.sets} == {7}
    assert all(tags == {"run": "keepalive-run"} for _, tags in gauge.sets)
    live.record_round(8)
    assert gauge.sets[-1] == (8, {"run": "keepalive-run"})  # set at once, never overtaken by a 7
    n = len(gauge.sets)
    assert wait_until(lambda: len(gauge.sets) > n, timeout=30)
    assert {v for v, _ in gauge.sets[n - 1 :]} == {8}
    live.close()  # the run is over: returns once the refresher has stopped
    n = len(gauge.sets)
    time.sleep(0.3)
    assert len(gauge.sets) == n
