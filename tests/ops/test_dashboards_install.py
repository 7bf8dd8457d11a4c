"""``popgrpo dashboards install|export`` and the dashboard file itself.

No Grafana server can be had here (no package, no network), so :class:`FakeGrafana` stands
in: a loopback ``http.server`` that answers the endpoints grafana-client calls during an
install, the way Grafana does (status codes, bodies, uid/overwrite/version semantics for
dashboards), and records every request. The queries themselves are checked against a real
Prometheus in ``tests/runtime/test_dashboards_prometheus.py``.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest

from popgrpo.cli import main
from popgrpo.ops import dashboards
from popgrpo.telemetry.live import METRICS
from tests.services import free_port


class FakeGrafana:
    """Grafana's HTTP API as far as ``dashboards install`` uses it, on 127.0.0.1.

    ``GET /api/frontend/settings`` (grafana-client's health check), ``GET
    /api/datasources/name/:name``, ``POST /api/datasources``, ``GET``/``POST /api/folders``
    and ``POST /api/dashboards/db``. Like Grafana, it answers 401 to a wrong bearer token, 409
    to a second datasource with the same name, and 412 to a dashboard whose uid exists unless
    ``overwrite`` is true; a stored dashboard's version goes up by one on each save.

    ``fail_status``/``fail_path``: answer that status to every request (or to that path),
    with a body that quotes the request's Authorization header, as a careless proxy or debug
    error page would, so a client that prints error bodies verbatim would leak the token.
    ``not_grafana``: answer every request with an HTML page and status 200.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.requests: list[dict] = []
        self.datasources: dict[str, dict] = {}
        self.folders: list[dict] = []
        self.dashboards: dict[str, dict] = {}  # uid -> {"dashboard", "version", "folderUid"}
        self.fail_status: int | None = None
        self.fail_path: str | None = None
        self.not_grafana = False
        self._ids = iter(range(1, 10_000))
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test's stderr to what popgrpo prints
                pass

            def do_GET(self):
                fake._handle(self, "GET")

            def do_POST(self):
                fake._handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def calls(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == method and r["path"] == path]

    def add_datasource(self, name: str, uid: str, url: str = "http://prometheus:9090", kind: str = "prometheus"):
        self.datasources[name] = {"id": next(self._ids), "uid": uid, "name": name, "type": kind, "url": url}

    # ---- request handling ----

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(urlsplit(h.path).path)
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        auth = h.headers.get("Authorization", "")
        self.requests.append({"method": method, "path": path, "auth": auth, "body": body})
        if self.not_grafana:
            return self._send(h, 200, "<html><body>Welcome to nginx!</body></html>", "text/html")
        if self.fail_status and (self.fail_path is None or self.fail_path == path):
            return self._send(
                h, self.fail_status, {"message": f"upstream error; request headers: Authorization: {auth}"}
            )
        if auth != f"Bearer {self.token}":
            return self._send(h, 401, {"message": "invalid API key"})
        status, answer = self._route(method, path, body)
        self._send(h, status, answer)

    def _route(self, method: str, path: str, body):
        if (method, path) == ("GET", "/api/frontend/settings"):
            return 200, {"buildInfo": {"version": "12.0.2", "commit": "fake"}}
        if method == "GET" and path.startswith("/api/datasources/name/"):
            ds = self.datasources.get(path.removeprefix("/api/datasources/name/"))
            return (200, ds) if ds else (404, {"message": "Data source not found"})
        if (method, path) == ("POST", "/api/datasources"):
            if body["name"] in self.datasources:
                return 409, {"message": "data source with the same name already exists"}
            self.add_datasource(body["name"], f"ds{len(self.datasources) + 1}", body["url"], body["type"])
            ds = self.datasources[body["name"]]
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added", "name": ds["name"]}
        if (method, path) == ("GET", "/api/folders"):
            return 200, self.folders
        if (method, path) == ("POST", "/api/folders"):
            folder = {"id": next(self._ids), "uid": f"f{len(self.folders) + 1}", "title": body["title"]}
            self.folders.append(folder)
            return 200, folder
        if (method, path) == ("POST", "/api/dashboards/db"):
            dash, uid = body["dashboard"], body["dashboard"].get("uid")
            old = self.dashboards.get(uid)
            if old is not None and not body.get("overwrite"):
                return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
            version = old["version"] + 1 if old else 1
            self.dashboards[uid] = {"dashboard": dash, "version": version, "folderUid": body.get("folderUid")}
            slug = re.sub(r"[^a-z0-9]+", "-", dash["title"].lower()).strip("-")
            return 200, {"id": 1, "uid": uid, "url": f"/d/{uid}/{slug}", "status": "success", "version": version}
        return 404, {"message": "Not found"}

    @staticmethod
    def _send(h, status: int, answer, content_type: str = "application/json") -> None:
        data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("GRAFANA_URL", "GRAFANA_TOKEN", "RAY_GRAFANA_HOST", "RAY_PROMETHEUS_NAME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def token(monkeypatch):
    value = "glsa_" + secrets.token_hex(16)
    monkeypatch.setenv("GRAFANA_TOKEN", value)
    return value


@pytest.fixture
def grafana(token):
    server = FakeGrafana(token)
    yield server
    server.stop()


def install(grafana, *extra) -> int:
    return main(["dashboards", "install", "--grafana-url", grafana.url, *extra])


def uploaded(grafana) -> list[dict]:
    return [r["body"] for r in grafana.calls("POST", "/api/dashboards/db")]


# ---- upload ----------------------------------------------------------------------------


def test_install_creates_the_datasource_and_uploads_with_the_bearer_token(grafana, token, capfd):
    assert install(grafana, "--datasource-url", "http://prometheus.example:9090") == 0
    out, err = capfd.readouterr()
    assert err == ""
    assert grafana.requests and all(r["auth"] == f"Bearer {token}" for r in grafana.requests)
    # Looked up first, then created, with what a Prometheus datasource needs.
    assert grafana.calls("GET", "/api/datasources/name/Prometheus")
    [created] = [r["body"] for r in grafana.calls("POST", "/api/datasources")]
    assert created["name"] == "Prometheus"
    assert created["type"] == "prometheus"
    assert created["url"] == "http://prometheus.example:9090"
    assert created["access"] == "proxy"
    [body] = uploaded(grafana)
    assert body["overwrite"] is True
    assert "folderUid" not in body
    dash = body["dashboard"]
    assert dash["uid"] == "popgrpo" and dash["id"] is None
    assert dash["panels"] == dashboards.load_dashboard()["panels"]
    # The dashboard opens on the datasource just created, not on Grafana's default.
    [ds_var] = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
    assert ds_var["current"]["value"] == grafana.datasources["Prometheus"]["uid"]
    assert "created" in out and f"{grafana.url}/d/popgrpo/popgrpo" in out
    assert token not in out


def test_an_existing_datasource_is_used_not_created_again(grafana, capfd):
    grafana.add_datasource("Prometheus", uid="ray-prom", url="http://ray-head:9090")
    assert install(grafana, "--datasource-url", "http://elsewhere:9090") == 0
    assert grafana.calls("POST", "/api/datasources") == []
    assert grafana.datasources["Prometheus"]["url"] == "http://ray-head:9090"  # left as it was
    [body] = uploaded(grafana)
    [ds_var] = [v for v in body["dashboard"]["templating"]["list"] if v["name"] == "datasource"]
    assert ds_var["current"]["value"] == "ray-prom"
    out = capfd.readouterr().out
    assert "exists" in out and "left as it is" in out


def test_the_datasource_name_follows_ray_prometheus_name(grafana, monkeypatch):
    monkeypatch.setenv("RAY_PROMETHEUS_NAME", "Ray Prom")
    grafana.add_datasource("Ray Prom", uid="rp")
    assert install(grafana) == 0
    assert grafana.calls("GET", "/api/datasources/name/Ray Prom")  # sent URL-quoted, found
    assert grafana.calls("POST", "/api/datasources") == []


def test_a_missing_datasource_without_a_url_is_bad_input(grafana, capfd):
    assert install(grafana) == 2
    err = capfd.readouterr().err
    assert "no datasource named 'Prometheus'" in err and "--datasource-url" in err
    assert uploaded(grafana) == []


def test_a_datasource_of_another_type_is_refused(grafana, capfd):
    grafana.add_datasource("Prometheus", uid="l1", kind="loki")
    assert install(grafana) == 2
    assert "type 'loki'" in capfd.readouterr().err
    assert uploaded(grafana) == []


def test_installing_again_replaces_the_older_dashboard(grafana, capfd):
    grafana.add_datasource("Prometheus", uid="p1")
    grafana.dashboards["popgrpo"] = {
        "dashboard": {"uid": "popgrpo", "title": "popgrpo (old)", "panels": []},
        "version": 7,
        "folderUid": None,
    }
    assert install(grafana) == 0
    assert install(grafana) == 0
    assert list(grafana.dashboards) == ["popgrpo"]  # one dashboard, replaced in place
    stored = grafana.dashboards["popgrpo"]
    assert stored["version"] == 9
    assert stored["dashboard"]["title"] == "popgrpo"
    assert stored["dashboard"]["panels"] == dashboards.load_dashboard()["panels"]
    assert [b["overwrite"] for b in uploaded(grafana)] == [True, True]
    assert "version 9" in capfd.readouterr().out


def test_a_folder_is_created_once_and_holds_the_dashboard(grafana):
    grafana.add_datasource("Prometheus", uid="p1")
    assert install(grafana, "--folder", "ML runs") == 0
    assert install(grafana, "--folder", "ML runs") == 0
    assert len(grafana.calls("POST", "/api/folders")) == 1
    [folder] = grafana.folders
    assert folder["title"] == "ML runs"
    assert [b["folderUid"] for b in uploaded(grafana)] == [folder["uid"], folder["uid"]]
    assert grafana.dashboards["popgrpo"]["folderUid"] == folder["uid"]


@pytest.mark.parametrize("env", ["GRAFANA_URL", "RAY_GRAFANA_HOST"])
def test_the_grafana_url_defaults_to_the_environment(grafana, monkeypatch, env):
    grafana.add_datasource("Prometheus", uid="p1")
    monkeypatch.setenv(env, grafana.url)
    assert main(["dashboards", "install"]) == 0
    assert uploaded(grafana)


def test_grafana_under_a_sub_path(token):
    """``--grafana-url http://host/grafana`` must reach ``/grafana/api/...``, not ``/grafanaapi``."""
    # A Grafana served under /grafana: the fake sees the prefix in every path.
    server = FakeGrafana(token)
    try:
        server.add_datasource("Prometheus", uid="p1")
        route = server._route
        server._route = lambda method, path, body: (
            route(method, path.removeprefix("/grafana"), body) if path.startswith("/grafana/api/") else (404, {})
        )
        assert main(["dashboards", "install", "--grafana-url", server.url + "/grafana/"]) == 0
        assert server.calls("POST", "/grafana/api/dashboards/db")
    finally:
        server.stop()


# ---- failures: one line, the right exit code, never the token ------------------------------


@pytest.mark.parametrize("fail_path", [None, "/api/datasources", "/api/dashboards/db"])
def test_a_server_error_gives_one_line_and_never_the_token(grafana, token, capfd, fail_path):
    grafana.fail_status, grafana.fail_path = 500, fail_path
    assert install(grafana, "--datasource-url", "http://prometheus:9090") == 1
    out, err = capfd.readouterr()
    assert token not in out + err
    assert "HTTP 500" in err and "<redacted>" in err  # the server's message, with the token masked
    assert len(err.strip().splitlines()) == 1
    assert grafana.dashboards == {}


def test_a_wrong_token_is_reported_as_401(grafana, capfd, monkeypatch):
    wrong = "glsa_" + secrets.token_hex(16)
    monkeypatch.setenv("GRAFANA_TOKEN", wrong)
    assert install(grafana) == 1
    out, err = capfd.readouterr()
    assert "401" in err and "GRAFANA_TOKEN" in err
    assert wrong not in out + err


def test_a_missing_token_is_a_clear_error_before_any_request(grafana, capfd, monkeypatch):
    monkeypatch.delenv("GRAFANA_TOKEN")
    assert install(grafana) == 2
    assert "GRAFANA_TOKEN is not set" in capfd.readouterr().err
    assert grafana.requests == []


def test_a_token_with_a_newline_is_refused_without_printing_it(grafana, capfd, monkeypatch):
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_abc\ndef123")
    assert install(grafana) == 2
    err = capfd.readouterr().err
    assert "control characters" in err and "def123" not in err
    assert grafana.requests == []


@pytest.mark.parametrize(
    "url, says",
    [
        ("ftp://grafana:3000", "expected http(s)://"),
        ("grafana:3000", "expected http(s)://"),
        ("http://:3000", "expected http(s)://"),
        ("http://grafana:99999", "not a valid URL"),
        ("http://admin:s3cretpw@grafana:3000", "no credentials in the URL"),
    ],
)
def test_a_bad_grafana_url_is_bad_input(token, capfd, url, says):
    assert main(["dashboards", "install", "--grafana-url", url]) == 2
    err = capfd.readouterr().err
    assert says in err
    assert "s3cretpw" not in err and token not in err


def test_an_unreachable_grafana_fails_with_one_line(token, capfd):
    assert main(["dashboards", "install", "--grafana-url", f"http://127.0.0.1:{free_port()}"]) == 1
    out, err = capfd.readouterr()
    assert "cannot reach Grafana" in err and "Connection refused" in err
    assert len(err.strip().splitlines()) == 1
    assert token not in out + err


def test_a_server_that_is_not_grafana(grafana, token, capfd):
    grafana.not_grafana = True
    assert install(grafana) == 1
    out, err = capfd.readouterr()
    assert "did not answer like Grafana" in err
    assert token not in out + err


# ---- copy into Ray's Grafana provisioning --------------------------------------------------


@pytest.fixture
def ray_session(tmp_path):
    """A session directory laid out the way Ray's MetricsHead writes it, using Ray's own
    provisioning template (the real one is checked in tests/runtime/test_dashboards_prometheus.py)."""
    templates = pytest.importorskip("ray.dashboard.modules.metrics.templates")
    session = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    grafana_dir = session / "metrics" / "grafana"
    (grafana_dir / "dashboards").mkdir(parents=True)
    provider = grafana_dir / "provisioning" / "dashboards"
    provider.mkdir(parents=True)
    (provider / "default.yml").write_text(
        templates.DASHBOARD_PROVISIONING_TEMPLATE.format(dashboard_output_folder=grafana_dir / "dashboards")
    )
    return session


def test_copy_into_a_ray_session(ray_session, capfd, monkeypatch):
    monkeypatch.setenv("GRAFANA_TOKEN", "unused")  # a copy needs no token and sends nothing
    assert main(["dashboards", "install", "--ray-session-dir", str(ray_session)]) == 0
    written = ray_session / "metrics" / "grafana" / "dashboards" / "popgrpo_grafana_dashboard.json"
    assert json.loads(written.read_text()) == dashboards.load_dashboard()
    assert str(written) in capfd.readouterr().out
    assert [p.name for p in written.parent.iterdir()] == [written.name]  # no temporary file left


@pytest.mark.parametrize("which", ["provisioning", "dashboards"])
def test_copy_into_a_provisioning_dir(ray_session, which):
    base = ray_session / "metrics" / "grafana"
    target = base / "provisioning" if which == "provisioning" else base / "dashboards"
    assert main(["dashboards", "install", "--ray-provisioning-dir", str(target)]) == 0
    assert (base / "dashboards" / "popgrpo_grafana_dashboard.json").is_file()


def test_copy_needs_a_session_with_ray_provisioning(tmp_path, capfd):
    assert main(["dashboards", "install", "--ray-session-dir", str(tmp_path)]) == 2
    assert "default.yml not found" in capfd.readouterr().err
    assert main(["dashboards", "install", "--ray-provisioning-dir", str(tmp_path / "nope")]) == 2


def test_copy_and_upload_options_do_not_mix(ray_session, capfd):
    argv = ["dashboards", "install", "--ray-session-dir", str(ray_session), "--grafana-url", "http://g:3000"]
    assert main(argv) == 2
    assert "drop --grafana-url" in capfd.readouterr().err


# ---- the dashboard file and the pure helpers -----------------------------------------------


def test_export_prints_the_dashboard(capsys):
    assert main(["dashboards", "export"]) == 0
    assert json.loads(capsys.readouterr().out) == dashboards.load_dashboard()


def test_dashboards_without_a_command_is_bad_input(capsys):
    assert main(["dashboards"]) == 2
    assert "install or export" in capsys.readouterr().err


def test_the_dashboard_model():
    dash = dashboards.load_dashboard()
    assert dash["uid"] == "popgrpo"
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["run"]["definition"] == "label_values(ray_popgrpo_round, run)"
    member = variables["member"]
    assert member["definition"] == 'label_values(ray_popgrpo_reward_mean{run=~"$run"}, member)'
    assert member["multi"] is True and member["includeAll"] is True
    for var in (variables["run"], member):
        assert var["query"]["query"] == var["definition"]
        assert var["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"] == p["datasource"] for t in p["targets"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_every_query_filters_by_run_and_member():
    targets = dashboards.panel_targets(dashboards.load_dashboard())
    assert len(targets) >= 12
    for title, target in targets:
        expr = target["expr"]
        assert 'run=~"$run"' in expr, title
        for name in re.findall(r"ray_(popgrpo_\w+)\{", expr):
            if "member" in METRICS[name].tags:
                assert 'member=~"$member"' in expr, title


def test_every_exported_metric_has_a_panel():
    exprs = " ".join(t["expr"] for _, t in dashboards.panel_targets(dashboards.load_dashboard()))
    used = set(re.findall(r"ray_(popgrpo_\w+)\{", exprs))
    assert used == set(METRICS)


def test_the_code_panels_chart_each_member_and_the_population():
    """Every code series (pass@1, pass@k, problems solved, distinct correct) is on a Code panel:
    per member one line each (``max by (run, member)``, legend naming the member), the
    population's and the best member's one line per run."""
    code = {name: spec for name, spec in METRICS.items() if spec.code}
    assert {
        "popgrpo_code_pass_at_group",
        "popgrpo_population_code_pass_at_group",
        "popgrpo_population_code_solved",
    } <= set(code)
    found: dict[str, tuple[str, dict]] = {}
    for title, target in dashboards.panel_targets(dashboards.load_dashboard()):
        names = re.findall(r"ray_(popgrpo_\w+)\{", target["expr"])
        assert len(names) == 1, title
        [name] = names
        if name in code:
            found[name] = (title, target)
        else:
            assert not title.startswith("Code"), title
    assert set(found) == set(code)
    for name, (title, target) in found.items():
        assert title.startswith("Code: "), name
        if "member" in code[name].tags:
            assert target["expr"] == f'max by (run, member) (ray_{name}{{run=~"$run", member=~"$member"}})'
            assert "{{member}}" in target["legendFormat"]
        else:
            assert target["expr"] == f'max by (run) (ray_{name}{{run=~"$run"}})'
            assert "{{member}}" not in target["legendFormat"]
    # A panel shows one figure for members and population alike: pass@1 with pass@1, etc.
    by_panel: dict[str, set[str]] = {}
    for name, (title, _) in found.items():
        by_panel.setdefault(title, set()).add(name.replace("population_", "").replace("best_member_", ""))
    assert all(len(figures) == 1 for figures in by_panel.values()), by_panel


def test_with_datasource_and_the_payloads_are_pure():
    dash = dashboards.load_dashboard()
    before = copy.deepcopy(dash)
    chosen = dashboards.with_datasource(dash, "Prom", "uid-1")
    assert dash == before  # the input is not modified
    [var] = [v for v in chosen["templating"]["list"] if v["name"] == "datasource"]
    assert var["current"] == {"selected": True, "text": "Prom", "value": "uid-1"}
    body = dashboards.dashboard_payload(dict(chosen, id=42), folder_uid="f1")
    assert body["overwrite"] is True and body["folderUid"] == "f1" and body["dashboard"]["id"] is None
    ds = dashboards.datasource_payload("Prom", "http://p:9090")
    assert (ds["type"], ds["url"], ds["isDefault"]) == ("prometheus", "http://p:9090", False)
    assert dashboards.redact("a glsa_x b", "glsa_x") == "a <redacted> b"


def test_the_module_needs_neither_ray_nor_grafana_client_to_import():
    code = (
        "import json, sys, popgrpo.ops.dashboards as d; board = d.load_dashboard(); "
        "print(json.dumps({'uid': board['uid'], 'panels': len(board['panels']), "
        "'imported': sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'grafana_client'))}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    board = dashboards.load_dashboard()
    assert json.loads(proc.stdout) == {"uid": board["uid"], "panels": len(board["panels"]), "imported": []}
