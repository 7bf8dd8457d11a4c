"""Every query of ``dashboards/popgrpo.json`` returns data from a real Prometheus scraping a real run.

A ``prometheus`` binary (skipped when absent, required in CI) scrapes the metrics endpoint of
the package's local Ray every second while a short Pop-GRPO run trains. Each panel target
is then sent to Prometheus' HTTP API with the template variables filled in the way Grafana
would ($run → the run, $member → All); so are the ``label_values`` queries behind the
``run`` and ``member`` variables. A misspelt metric, a label filter that matches nothing or
an aggregation that drops the labels a legend needs fails here, not in front of a user.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from popgrpo.cli import main
from popgrpo.config import load_config, preset_path
from popgrpo.ops.dashboards import load_dashboard, panel_targets
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.telemetry.live import METRICS
from tests.driving import drive
from tests.services import GroupWatchdog, free_port, require, stop_process

pytestmark = pytest.mark.ray

RUN = "dash-run"
MEMBERS = {"0", "1", "2"}
# What Grafana would put in for this run with member = All; the interval only has to span
# a few of the 1 s scrapes below.
VARIABLES = {"run": RUN, "member": ".*", "__rate_interval": "30s", "__interval": "30s", "__range": "30s"}


class Prometheus:
    """A ``prometheus`` on 127.0.0.1 with its own storage, scraping ``targets`` every second."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        binary = require("prometheus")
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [{"job_name": "ray", "static_configs": [{"targets": targets}]}],
                }
            )
        )
        self.log_path = workdir / "prometheus.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.watchdog = GroupWatchdog(self.proc.pid)  # prometheus goes if pytest dies
        deadline = time.time() + 30
        while time.time() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus did not start:\n{self.log_path.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _get(self, path: str, params: dict) -> dict:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as resp:
            answer = json.load(resp)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, promql: str) -> list[dict]:
        """Instant query: ``[{"metric": {labels}, "value": [t, "v"]}]``."""
        return self._get("/api/v1/query", {"query": promql})["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        return self._get(f"/api/v1/label/{label}/values", {"match[]": match})

    def stop(self) -> None:
        self.watchdog.disarm()
        stop_process(self.proc)
        self.log.close()


@pytest.fixture
def prometheus(ray_local, tmp_path):
    prom = Prometheus(tmp_path, [f"127.0.0.1:{ray_local.metrics_port}"])
    yield prom
    prom.stop()


def fill(expr: str) -> str:
    """Grafana's variable interpolation for ``$name`` and ``${name}``; unknown names fail."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: VARIABLES[m.group(1) or m.group(2)], expr)


def legend_labels(target: dict) -> set[str]:
    """Labels the legend names (``{{member}}``): every series the query returns must carry them."""
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))


@pytest.mark.requires("prometheus")
def test_every_dashboard_query_returns_data_from_a_real_run(ray_local, prometheus, tmp_path):
    dashboard = load_dashboard()
    # The Code panels chart series that only runs on code problems export: this Pop-GRPO run
    # leaves them empty (tests/runtime/test_metrics.py scrapes a code run for those series).
    code = {name for name, spec in METRICS.items() if spec.code}
    queried = lambda t: set(re.findall(r"ray_(popgrpo_\w+)\{", t["expr"]))  # noqa: E731
    code_targets = [(title, t) for title, t in panel_targets(dashboard) if queried(t) <= code]
    targets = [(title, t) for title, t in panel_targets(dashboard) if not queried(t) <= code]
    assert code_targets and all(not queried(t) & code for _, t in targets)
    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=3", "population.members_per_actor=3", "run.epochs=20", "grpo.steps_per_epoch=2"],
    )
    executor = RayExecutor(cfg, run_dir=tmp_path / RUN)
    try:
        executor.metrics.record_restart()  # the restarts counter is exported from the first failure on
        drive(cfg, executor)
        # Each query is asked again until its answer is complete: data, and every member for a
        # per-member panel (members' series reach Prometheus one scrape at a time).
        per_member = {t["expr"] for _, t in targets if "member" in legend_labels(t)}

        def complete(expr: str, series: list) -> bool:
            return bool(series) and (
                expr not in per_member or {s["metric"].get("member") for s in series} >= set(MEMBERS)
            )

        exprs = {target["expr"] for _, target in targets}
        results: dict[str, list] = {}
        deadline = time.time() + 30  # Ray reports every 0.5 s, Prometheus scrapes every 1 s
        while results.keys() < exprs and time.time() < deadline:
            for expr in exprs - results.keys():
                if complete(expr, series := prometheus.query(fill(expr))):
                    results[expr] = series
            time.sleep(0.5)
        empty = [title for title, target in targets if target["expr"] not in results]
        assert not empty, f"panels with no data: {empty}"
        for title, target in targets:
            series = results[target["expr"]]
            assert {s["metric"].get("run") for s in series} == {RUN}, title
            for label in legend_labels(target):
                assert all(label in s["metric"] for s in series), f"{title}: legend needs {label}"
            if "member" in legend_labels(target):  # one line per member
                assert sorted(s["metric"]["member"] for s in series) == sorted(MEMBERS), title
            else:
                assert len(series) == 1, title

        for title, target in code_targets:
            assert prometheus.query(fill(target["expr"])) == [], title

        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        values = {}
        for name in ("run", "member"):
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variables[name]["definition"])
            selector, label = fill(match.group(1)), match.group(2)
            values[name] = set(prometheus.label_values(label, selector))
        assert RUN in values["run"]
        assert values["member"] == MEMBERS
    finally:
        executor.close()


def test_copy_lands_in_the_folder_ray_provisions(ray_local, capsys):
    """Against the provisioning Ray really generated for this session, not a copy of its template."""
    session = Path(ray_local.ctx.address_info["session_dir"])
    provider = session / "metrics" / "grafana" / "provisioning" / "dashboards" / "default.yml"
    deadline = time.time() + 30  # written when the dashboard's metrics module starts
    while not provider.is_file() and time.time() < deadline:
        time.sleep(0.2)
    dashboards_dir = Path(yaml.safe_load(provider.read_text())["providers"][0]["options"]["path"])
    assert (dashboards_dir / "default_grafana_dashboard.json").is_file()  # Ray's own are there

    assert main(["dashboards", "install", "--ray-session-dir", str(session)]) == 0
    written = dashboards_dir / "popgrpo_grafana_dashboard.json"
    assert json.loads(written.read_text())["uid"] == "popgrpo"
    assert str(written) in capsys.readouterr().out
