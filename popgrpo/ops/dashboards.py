"""Grafana dashboards: what ``popgrpo dashboards install`` and ``popgrpo dashboards export`` do
(their parsers: :mod:`popgrpo.cli.ops`).

The dashboard is a plain file, ``dashboards/popgrpo.json`` at the repository root (uid
``popgrpo``), that a user can also import by hand. Its panels read the ``ray_popgrpo_*``
series of :data:`popgrpo.telemetry.live.METRICS` through a ``${datasource}`` variable, so the
file names no particular Prometheus.

``install`` does one of two things:

- **Upload** to a Grafana over its HTTP API (``grafana-client``), authenticated with a
  service-account token from ``GRAFANA_TOKEN``. It looks the Prometheus datasource up by
  name and creates it when absent (``--datasource-url``), then posts the dashboard with
  ``overwrite: true``, so an older version with the same uid is replaced. Tokens are the one
  credential accepted: Grafana recommends service accounts for automation, and basic auth
  would put a password in a URL or an environment variable for no gain.
- **Copy** into the dashboards folder of a Ray session's generated Grafana provisioning
  (``--ray-session-dir`` or ``--ray-provisioning-dir``): a Grafana started with Ray's
  ``grafana.ini`` then lists it next to Ray's own dashboards.

The token is sent as a header and never printed: every message from a failed request is
passed through :func:`redact` first. This module imports neither Ray (it must work on a
laptop that only reaches Grafana) nor, until ``install`` runs, grafana-client: the CLI builds
every sub-command's parser on each ``popgrpo`` call.

Exit codes follow the CLI's: bad input (URL, missing token, unknown folder layout) raises
:class:`~popgrpo.config.ConfigError` → 2; a failed upload prints one line → 1.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import yaml

from popgrpo.config import ConfigError
from popgrpo.telemetry.atomic import atomic_write
from popgrpo.telemetry.watching import DASHBOARD_PATH

__all__ = [
    "DASHBOARD_PATH",
    "DASHBOARD_UID",
    "InstallError",
    "copy_to_ray",
    "dashboard_payload",
    "datasource_payload",
    "install",
    "load_dashboard",
    "panel_targets",
    "redact",
    "resolve_ray_dashboards_dir",
    "with_datasource",
]

DASHBOARD_UID = "popgrpo"
TOKEN_ENV = "GRAFANA_TOKEN"
# Ray's generated prometheus.yml scrapes every 10 s. Grafana's "scrape interval" setting
# (jsonData.timeInterval) sizes $__rate_interval, which must span several scrapes.
RAY_SCRAPE_INTERVAL = "10s"
# File name in Ray's dashboards folder; Ray's own are *_grafana_dashboard.json.
RAY_DASHBOARD_FILE = "popgrpo_grafana_dashboard.json"


class InstallError(RuntimeError):
    """Grafana could not be reached or refused a request; the message is already redacted."""


# ---- pure logic: the dashboard and the payloads ------------------------------------------


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict:
    """The dashboard JSON model, as a dict."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"dashboard file not found: {path}") from None


def panel_targets(dashboard: dict) -> list[tuple[str, dict]]:
    """``[(panel title, target)]`` for every PromQL target (``target["expr"]``), rows included."""
    out = []

    def walk(panels):
        for panel in panels:
            out.extend((panel.get("title", ""), t) for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))  # a collapsed row keeps its panels inside it

    walk(dashboard.get("panels", []))
    return out


def with_datasource(dashboard: dict, name: str, uid: str) -> dict:
    """A copy whose ``datasource`` variable starts on this datasource.

    Panels keep ``${datasource}``, so a user can still switch; without a current value
    Grafana would open on its default datasource, which need not be the one scraping Ray.
    """
    out = copy.deepcopy(dashboard)
    for var in out.get("templating", {}).get("list", []):
        if var.get("type") == "datasource" and var.get("name") == "datasource":
            var["current"] = {"selected": True, "text": name, "value": uid}
            return out
    raise ConfigError("the dashboard has no 'datasource' variable of type datasource")


def dashboard_payload(dashboard: dict, folder_uid: str | None = None) -> dict:
    """Body of ``POST /api/dashboards/db``.

    ``id`` is cleared so Grafana matches on ``uid``; ``overwrite`` replaces a dashboard with
    that uid whatever its version, which is what re-running ``install`` after an upgrade needs.
    Without ``folderUid`` Grafana puts (or moves) it at the top level.
    """
    body = {"dashboard": dict(dashboard, id=None), "overwrite": True, "message": "popgrpo dashboards install"}
    if folder_uid:
        body["folderUid"] = folder_uid
    return body


def datasource_payload(name: str, url: str) -> dict:
    """Body of ``POST /api/datasources`` for a Prometheus read through Grafana's backend.

    Not made the default datasource: an existing Grafana's default is not ours to change.
    """
    return {
        "name": name,
        "type": "prometheus",
        "access": "proxy",
        "url": url,
        "isDefault": False,
        "jsonData": {"httpMethod": "POST", "timeInterval": RAY_SCRAPE_INTERVAL},
    }


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` masked: for anything printed after a request carried it."""
    return text.replace(secret, "<redacted>") if secret else text


@dataclass(frozen=True)
class GrafanaAddress:
    protocol: str
    host: str
    port: int | None
    prefix: str  # sub-path Grafana is served under, "" or ending in "/"

    def __str__(self) -> str:
        port = f":{self.port}" if self.port else ""
        return f"{self.protocol}://{self.host}{port}/{self.prefix}".rstrip("/")


def parse_http_url(url: str, what: str) -> GrafanaAddress:
    """Check an http(s) URL given on the command line; refuse credentials inside it
    (they would be printed with the URL, and a token belongs in ``GRAFANA_TOKEN``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{what}: not a valid URL: {url!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what}: expected http(s)://HOST[:PORT][/PATH], got {url!r}")
    if parts.username or parts.password:
        raise ConfigError(f"{what}: put no credentials in the URL; the Grafana token goes in ${TOKEN_ENV}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6 literal
    prefix = parts.path.strip("/")
    return GrafanaAddress(parts.scheme, host, port, f"{prefix}/" if prefix else "")


def read_token(environ: Mapping[str, str] = os.environ) -> str:
    token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(
            f"${TOKEN_ENV} is not set: create a service account token in Grafana "
            f"(Administration → Service accounts, role Editor) and export {TOKEN_ENV}=<token>"
        )
    # An HTTP library rejecting such a header would quote it in its error message.
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"${TOKEN_ENV} contains whitespace or control characters")
    return token


# ---- upload to Grafana ---------------------------------------------------------------------


@dataclass(frozen=True)
class InstallResult:
    datasource_uid: str
    datasource_created: bool
    folder_uid: str | None
    dashboard_url: str
    version: int | None


def install(
    grafana_url: str,
    token: str,
    *,
    datasource_name: str = "Prometheus",
    datasource_url: str | None = None,
    folder: str | None = None,
    dashboard: dict | None = None,
    log=print,
) -> InstallResult:
    """Upload the dashboard to Grafana; create its datasource (and folder) when absent.

    Raises :class:`ConfigError` for bad input and :class:`InstallError` when Grafana cannot
    be reached or refuses; neither message contains ``token``.
    """
    address = parse_http_url(grafana_url, "--grafana-url")
    if datasource_url is not None:
        parse_http_url(datasource_url, "--datasource-url")
    dashboard = load_dashboard() if dashboard is None else dashboard
    api = _connect(address, token)

    def call(what, fn, *args, missing_ok=False):
        return _call(what, address, token, fn, *args, missing_ok=missing_ok)

    build = call("reading Grafana's build info", api.health.check)
    version = build.get("version", "?") if isinstance(build, dict) else "?"
    log(f"Grafana {version} at {address}")

    datasource, created = _ensure_datasource(api, call, datasource_name, datasource_url)
    ds_uid = str(datasource.get("uid", ""))
    if not ds_uid:
        raise InstallError(f"Grafana returned datasource {datasource_name!r} without a uid")
    if created:
        log(f"datasource {datasource_name!r}: created (uid {ds_uid}) for {datasource_url}")
    else:
        log(f"datasource {datasource_name!r}: exists (uid {ds_uid}, url {datasource.get('url', '?')})")
        if datasource_url and datasource.get("url") not in (datasource_url, datasource_url.rstrip("/")):
            log(f"  left as it is: --datasource-url {datasource_url} is used only to create a missing datasource")

    folder_uid = _ensure_folder(api, call, folder, log) if folder else None
    body = dashboard_payload(with_datasource(dashboard, datasource_name, ds_uid), folder_uid)
    answer = _expect_dict(call("uploading the dashboard", api.dashboard.update_dashboard, body), "the dashboard upload")
    path = str(answer.get("url") or f"/d/{body['dashboard'].get('uid', DASHBOARD_UID)}")
    # Grafana's url already carries its sub-path when it is served from one.
    url = f"{address.protocol}://{address.host}{f':{address.port}' if address.port else ''}{path}"
    log(f"dashboard {answer.get('uid', DASHBOARD_UID)!r}: version {answer.get('version', '?')} → {url}")
    return InstallResult(ds_uid, created, folder_uid, url, answer.get("version"))


def _connect(address: GrafanaAddress, token: str):
    from grafana_client.api import GrafanaApi  # here, not at import: see the module docstring

    # GrafanaApi.from_url would drop the "/" between a sub-path and "api"; build it ourselves.
    return GrafanaApi(
        auth=token, protocol=address.protocol, host=address.host, port=address.port, url_path_prefix=address.prefix
    )


def _call(what: str, address: GrafanaAddress, token: str, fn, *args, missing_ok: bool = False):
    """Run one grafana-client request; turn every way it can fail into one redacted line.

    ``missing_ok``: a 404 answers "absent" (returns ``None``) instead of failing.
    """
    import niquests
    from grafana_client.client import GrafanaException

    try:
        return fn(*args)
    except GrafanaException as exc:
        status = exc.status_code
        if missing_ok and status == 404:
            return None
        if status == 401:
            detail = f"Grafana rejected ${TOKEN_ENV} (401 Unauthorized)"
        elif status == 403:
            detail = "the token's service account may not do this (403 Forbidden); it needs the Editor role"
        elif status:
            detail = f"HTTP {status}: {exc.message}"
        else:
            detail = str(exc.message)
        message = f"{what} at {address} failed: {detail}"
    except niquests.exceptions.RequestException as exc:
        message = f"{what}: cannot reach Grafana at {address} ({_network_reason(exc)})"
    except (ValueError, AttributeError, TypeError) as exc:
        # A 200 that is not Grafana's JSON (a login page, another service): grafana-client
        # fails decoding or indexing it.
        message = f"{what}: {address} did not answer like Grafana ({type(exc).__name__}: {exc})"
    # One line (a server's error page can span many), and never the token.
    raise InstallError(" ".join(redact(message, token).split())) from None


def _network_reason(exc: Exception) -> str:
    """The short cause inside urllib3's nested retry message ("Connection refused", ...)."""
    text = str(exc)
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if match:
        return match.group(1).strip()
    if "NameResolutionError" in text:
        return "host name not found"
    return "timed out" if "timeout" in type(exc).__name__.lower() else type(exc).__name__


def _expect_dict(answer, what: str) -> dict:
    if not isinstance(answer, dict):
        raise InstallError(f"{what}: unexpected answer from Grafana ({type(answer).__name__}); is this Grafana?")
    return answer


def _ensure_datasource(api, call, name: str, url: str | None) -> tuple[dict, bool]:
    found = call(
        f"looking up datasource {name!r}", api.datasource.get_datasource_by_name, quote(name, safe=""), missing_ok=True
    )
    if found is not None:
        found = _expect_dict(found, f"looking up datasource {name!r}")
        if found.get("type") != "prometheus":
            raise ConfigError(
                f"datasource {name!r} in Grafana is of type {found.get('type')!r}, not prometheus; "
                "pick another with --datasource-name"
            )
        return found, False
    if url is None:
        raise ConfigError(
            f"Grafana has no datasource named {name!r}: pass --datasource-url http://PROMETHEUS:9090 to create it, "
            "or --datasource-name for an existing one"
        )
    answer = _expect_dict(
        call(f"creating datasource {name!r}", api.datasource.create_datasource, datasource_payload(name, url)),
        f"creating datasource {name!r}",
    )
    return answer.get("datasource") or answer, True


def _ensure_folder(api, call, title: str, log) -> str:
    folders = call("listing folders", api.folder.get_all_folders)
    for f in folders if isinstance(folders, list) else []:
        if isinstance(f, dict) and f.get("title") == title:
            return str(f["uid"])
    created = _expect_dict(call(f"creating folder {title!r}", api.folder.create_folder, title), "creating a folder")
    log(f"folder {title!r}: created (uid {created.get('uid')})")
    return str(created["uid"])


# ---- copy into Ray's Grafana provisioning ----------------------------------------------------


def resolve_ray_dashboards_dir(provisioning_dir: str | None = None, session_dir: str | None = None) -> Path:
    """The folder Grafana's dashboard provider reads, as Ray's generated provisioning names it.

    Ray 2.60's dashboard writes, under ``<session dir>/metrics/grafana/``, a ``grafana.ini``
    whose provisioning path is ``<temp dir>/session_latest/metrics/grafana/provisioning``, and
    there ``dashboards/default.yml``, whose provider (folder "Ray") reads
    ``<session dir>/metrics/grafana/dashboards`` (or ``$RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR``).
    That file is the one source of truth, so it is read rather than the path guessed.

    ``session_dir``: a Ray session directory (e.g. ``/tmp/ray/session_latest``).
    ``provisioning_dir``: Ray's ``metrics/grafana/provisioning`` folder, or the dashboards
    folder itself.
    """
    if session_dir is not None:
        provider = Path(session_dir) / "metrics" / "grafana" / "provisioning" / "dashboards" / "default.yml"
        if not provider.is_file():
            raise ConfigError(
                f"{provider} not found: is {session_dir} a Ray session directory whose dashboard is running? "
                "(Ray writes it when the dashboard starts; with RAY_METRICS_OUTPUT_ROOT set, pass "
                "--ray-provisioning-dir instead)"
            )
        return _provider_path(provider)
    assert provisioning_dir is not None
    base = Path(provisioning_dir)
    provider = base / "dashboards" / "default.yml"
    if provider.is_file():
        return _provider_path(provider)
    if not base.is_dir():
        raise ConfigError(f"--ray-provisioning-dir: {base} is not a directory")
    return base


def _provider_path(provider_file: Path) -> Path:
    try:
        spec = yaml.safe_load(provider_file.read_text()) or {}
        path = Path(spec["providers"][0]["options"]["path"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"{provider_file}: no dashboard provider path in it ({exc!r})") from None
    if not path.is_dir():
        raise ConfigError(f"{provider_file} names {path}, which does not exist")
    return path


def copy_to_ray(target_dir: Path, dashboard: dict | None = None) -> Path:
    """Write the dashboard into Ray's dashboards folder; return the file written.

    Written to a temporary name and renamed, so Grafana's provider, which rescans the folder
    every few seconds, never reads half a file. The ``datasource`` variable is left without a
    current value: Grafana then uses its default, which Ray's provisioning makes the
    datasource it wrote (``$RAY_PROMETHEUS_NAME``).
    """
    dashboard = load_dashboard() if dashboard is None else dashboard
    return atomic_write(target_dir / RAY_DASHBOARD_FILE, json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n")
