"""``popgrpo submit``, ``popgrpo jobs``, ``popgrpo dashboards`` and ``popgrpo monitor``: argument
handling over :mod:`popgrpo.ops` (ray_jobs, dashboards, monitor).

None of these imports Ray or grafana-client until its command runs: the usage builds every
parser.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from popgrpo.config import ConfigError
from popgrpo.ops import dashboards, monitor, ray_jobs

__all__ = ["add_parsers"]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``submit``, ``jobs``, ``dashboards`` and ``monitor`` to the ``popgrpo`` sub-commands."""
    _add_job_parsers(sub)
    _add_dashboards_parsers(sub)
    _add_monitor_parser(sub)


# ---- submit, jobs ------------------------------------------------------------------------------
def _exit_for(status: str) -> int:
    return 0 if status == "SUCCEEDED" else 1


def _cmd_submit(args: argparse.Namespace) -> int:
    from popgrpo.config import load_args_config

    config = load_args_config(args)
    runtime_env = None
    if args.runtime_env:
        path = Path(args.runtime_env)
        if not path.is_file():
            raise ConfigError(f"runtime env file not found: {path}")
        runtime_env = yaml.safe_load(path.read_text()) or {}
        if not isinstance(runtime_env, dict):
            raise ConfigError(f"{path}: a runtime env must be a mapping")
    client = ray_jobs.job_client(args.address)
    with tempfile.TemporaryDirectory(prefix="popgrpo-submit-") as staging:
        spec = ray_jobs.build_job(
            config,
            Path(staging),
            request=ray_jobs.config_request(args.config, args.set, args.seed),
            submission_id=args.submission_id,
            out=args.out,
            python=args.python,
            runtime_env=runtime_env,
            quiet=args.quiet,
        )
        try:  # the working dir is uploaded during this call, so the staging dir can go after it
            client.submit_job(
                entrypoint=spec.entrypoint,
                runtime_env=spec.runtime_env,
                submission_id=spec.submission_id,
                metadata=spec.metadata,
            )
        except Exception as exc:
            raise ray_jobs.JobsError(f"submission refused: {ray_jobs.first_line(exc)}") from None
    print(f"submitted: {spec.submission_id}")
    print(f"run directory (on the cluster): {spec.out}")
    if args.no_wait:
        print(f"follow it with: popgrpo jobs logs --follow {spec.submission_id}")
        return 0
    try:
        status = ray_jobs.follow(client, spec.submission_id)
    except KeyboardInterrupt:
        print(f"\nstopped following; the job keeps running. Stop it with: popgrpo jobs stop {spec.submission_id}")
        return 130
    print(f"job {spec.submission_id}: {status}")
    return _exit_for(status)


def _cmd_status(args: argparse.Namespace) -> int:
    info = ray_jobs.job_client(args.address).get_job_info(args.id)
    print(f"{args.id}: {info.status.value}" + (f" ({info.message})" if info.message else ""))
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    client = ray_jobs.job_client(args.address)
    if args.follow:
        return _exit_for(ray_jobs.follow(client, args.id))
    sys.stdout.write(client.get_job_logs(args.id))
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    client = ray_jobs.job_client(args.address)
    stopped = client.stop_job(args.id)
    print(f"{args.id}: {'stop requested' if stopped else 'already ended'} ({client.get_job_status(args.id).value})")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    jobs = [j for j in ray_jobs.job_client(args.address).list_jobs() if (j.submission_id or "").startswith("popgrpo-")]
    for job in sorted(jobs, key=lambda j: j.start_time or 0):
        print(f"{job.submission_id}\t{job.status.value}")
    return 0


def _guard(func):
    """Job-server failures (unreachable, refused, unknown job id, bad token) are one line on
    stderr and exit 1, not a traceback. The SDK reports HTTP errors as RuntimeError."""

    def run(args: argparse.Namespace) -> int:
        from ray.exceptions import RayError

        try:
            return func(args)
        except (ray_jobs.JobsError, RuntimeError, ConnectionError, RayError) as exc:
            print(f"popgrpo: {ray_jobs.first_line(exc)}", file=sys.stderr)
            return 1

    return run


def _add_job_parsers(sub: argparse._SubParsersAction) -> None:
    address_help = "job server: http://HEAD:8265 (default $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS, or 127.0.0.1:8265)"
    submit = sub.add_parser("submit", help="submit a training run to a Ray cluster as a Ray job")
    submit.add_argument("config", help="YAML file or preset name (grpo, qd_grpo, maxent_grpo, pop_grpo)")
    submit.add_argument("--address", help=address_help)
    submit.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field (repeatable)")
    submit.add_argument("--seed", type=int, help="shorthand for --set run.seed=N")
    submit.add_argument(
        "--out", help=f"run directory on the cluster (default {ray_jobs.DEFAULT_RUNS_ROOT}/<submission id>)"
    )
    submit.add_argument("--submission-id", help="job id (default popgrpo-<run name>-<time>-<hex>)")
    submit.add_argument("--runtime-env", metavar="YAML", help="extra runtime env, e.g. cluster/runtime_env.yaml")
    submit.add_argument("--python", default="python", help="python executable on the cluster (default: python)")
    submit.add_argument("--no-wait", action="store_true", help="print the submission id and return")
    submit.add_argument("--quiet", action="store_true", help="no progress bar in the job's logs")
    submit.set_defaults(func=_guard(_cmd_submit))

    jobs = sub.add_parser("jobs", help="status, logs, stop or list popgrpo jobs on a Ray cluster")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    for name, func, help_text in (
        ("status", _cmd_status, "a job's status"),
        ("logs", _cmd_logs, "a job's logs (--follow to stream until it ends)"),
        ("stop", _cmd_stop, "stop a job"),
        ("list", _cmd_list, "every popgrpo job the cluster knows"),
    ):
        cmd = jobs_sub.add_parser(name, help=help_text)
        if name != "list":
            cmd.add_argument("id", help="submission id, as printed by popgrpo submit")
        if name == "logs":
            cmd.add_argument("--follow", action="store_true")
        cmd.add_argument("--address", help=address_help)
        cmd.set_defaults(func=_guard(func))


# ---- dashboards --------------------------------------------------------------------------------


def _default_grafana_url() -> str:
    # GRAFANA_URL is grafana-client's own convention; RAY_GRAFANA_HOST is where a Ray head
    # reaches Grafana, often the same place.
    ray_host = os.environ.get("RAY_GRAFANA_HOST", "")
    if ray_host == "DISABLED":  # Ray's switch for "no Grafana", not an address
        ray_host = ""
    return os.environ.get("GRAFANA_URL") or ray_host or "http://localhost:3000"


def _cmd_dashboards_install(args: argparse.Namespace) -> int:
    if args.ray_session_dir or args.ray_provisioning_dir:
        if args.grafana_url or args.folder or args.datasource_url:
            raise ConfigError(
                "--ray-session-dir/--ray-provisioning-dir copy the file for Ray's provisioning (folder 'Ray', "
                "Ray's datasource); drop --grafana-url, --folder and --datasource-url"
            )
        target = dashboards.resolve_ray_dashboards_dir(args.ray_provisioning_dir, args.ray_session_dir)
        written = dashboards.copy_to_ray(target)
        print(f"dashboard {dashboards.DASHBOARD_UID!r} written to {written}")
        print("a Grafana started with Ray's grafana.ini lists it in its 'Ray' folder within seconds")
        return 0
    token = dashboards.read_token()
    try:
        dashboards.install(
            args.grafana_url or _default_grafana_url(),
            token,
            # Ray names the datasource it provisions $RAY_PROMETHEUS_NAME: the same default
            # finds that one in a Grafana set up from Ray's provisioning.
            datasource_name=args.datasource_name or os.environ.get("RAY_PROMETHEUS_NAME") or "Prometheus",
            datasource_url=args.datasource_url,
            folder=args.folder,
        )
    except dashboards.InstallError as exc:
        print(f"popgrpo: {dashboards.redact(str(exc), token)}", file=sys.stderr)
        return 1
    return 0


def _cmd_dashboards_export(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(dashboards.load_dashboard(), indent=2, ensure_ascii=False) + "\n")
    return 0


def _cmd_dashboards_missing(args: argparse.Namespace) -> int:
    raise ConfigError("dashboards: choose a command: install or export (popgrpo dashboards --help)")


def _add_dashboards_parsers(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("dashboards", help="install the popgrpo Grafana dashboard")
    parser.set_defaults(func=_cmd_dashboards_missing)
    cmds = parser.add_subparsers(dest="dashboards_command")

    inst = cmds.add_parser(
        "install",
        help="upload the dashboard to Grafana, or copy it into a Ray session's Grafana provisioning",
        description=f"Upload dashboards/popgrpo.json to Grafana (token from ${dashboards.TOKEN_ENV}, never printed), "
        "replacing an older version; or, with --ray-session-dir/--ray-provisioning-dir, copy it next to "
        "Ray's generated dashboards.",
    )
    inst.add_argument(
        "--grafana-url",
        metavar="URL",
        help="Grafana's address (default: $GRAFANA_URL, else $RAY_GRAFANA_HOST, else http://localhost:3000)",
    )
    inst.add_argument(
        "--folder", metavar="NAME", help="Grafana folder to put it in, created if absent (default: top level)"
    )
    inst.add_argument(
        "--datasource-name",
        metavar="NAME",
        help="Prometheus datasource the dashboard opens on (default: $RAY_PROMETHEUS_NAME, else Prometheus)",
    )
    inst.add_argument(
        "--datasource-url",
        metavar="PROMETHEUS_URL",
        help="create the datasource with this Prometheus URL when Grafana has none by that name",
    )
    ray = inst.add_mutually_exclusive_group()
    ray.add_argument(
        "--ray-session-dir",
        metavar="DIR",
        help="instead of uploading, copy into this Ray session's Grafana provisioning (e.g. /tmp/ray/session_latest)",
    )
    ray.add_argument(
        "--ray-provisioning-dir",
        metavar="DIR",
        help="instead of uploading, copy into this folder (Ray's metrics/grafana/provisioning, or the dashboards "
        "folder a Grafana provider reads)",
    )
    inst.set_defaults(func=_cmd_dashboards_install)

    exp = cmds.add_parser("export", help="print the dashboard JSON (for Grafana's Import dialog)")
    exp.set_defaults(func=_cmd_dashboards_export)


# ---- monitor -----------------------------------------------------------------------------------
def _cmd_monitor(args: argparse.Namespace) -> int:
    session = Path(args.ray_session_dir) if args.ray_session_dir else monitor.default_session_dir()
    config = monitor.scrape_config(session, args.scrape_interval)
    binary = shutil.which("prometheus")
    if binary is None:
        raise ConfigError("prometheus is not installed (Debian/Ubuntu: apt-get install prometheus)")
    # The session folder is a symlink (session_latest): resolve it so a later session cannot
    # take over this Prometheus' storage.
    workdir = Path(args.storage) if args.storage else session.resolve() / "metrics" / "prometheus" / "popgrpo"
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    url = f"http://{args.host}:{args.port}"
    print(f"popgrpo: Prometheus at {url}, scraping Ray session {session.resolve()}", flush=True)
    print(f"popgrpo: live series: {url}/graph?g0.expr=ray_popgrpo_reward_mean (Ctrl-C stops it)", flush=True)
    if args.port != 9090 or args.host not in ("127.0.0.1", "localhost"):
        print(f"popgrpo: for the Ray dashboard to find it, start Ray with RAY_PROMETHEUS_HOST={url}", flush=True)
    return monitor.run_prometheus(binary, config_file, workdir / "data", args.port, args.host)


def _add_monitor_parser(sub: argparse._SubParsersAction) -> None:
    mon = sub.add_parser(
        "monitor",
        help="run a local Prometheus on the Ray session's scrape config (live popgrpo_* metrics)",
        description="Start the installed prometheus with the scrape configuration Ray wrote for the session, "
        "in the foreground. Its page shows every ray_popgrpo_* series live; the Ray dashboard and Grafana read it too.",
    )
    mon.add_argument(
        "--ray-session-dir",
        metavar="DIR",
        help="the Ray session to scrape (default: $RAY_TMPDIR/ray/session_latest, else /tmp/ray/session_latest)",
    )
    mon.add_argument(
        "--port", type=int, default=9090, help="Prometheus' port (default 9090, where Ray's dashboard looks)"
    )
    mon.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    mon.add_argument(
        "--storage", metavar="DIR", help="Prometheus' data folder (default: inside the session's metrics folder)"
    )
    mon.add_argument("--scrape-interval", metavar="DURATION", help="override Ray's scrape interval (10s), e.g. 2s")
    mon.set_defaults(func=_cmd_monitor)
