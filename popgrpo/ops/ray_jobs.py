"""Ray Jobs: what ``popgrpo submit`` and ``popgrpo jobs status|logs|stop|list`` do (their parsers:
:mod:`popgrpo.cli.ops`).

``submit`` validates the config here, before anything reaches the cluster, writes the
resolved config (file + ``--set`` overrides) into a small staging directory that becomes the
job's ``working_dir``, ships this very ``popgrpo`` package as a ``py_module`` (so the job
runs the code that validated the config, whatever is installed on the cluster), and runs
``python -m popgrpo.cli.job --config config.yaml --out DIR`` there. The run directory is
written on the node the job's driver runs on (the head node, unless the job asks for other
entrypoint resources): ``~/popgrpo-runs/<submission id>`` by default.

What the dashboard's Jobs page shows of it: the Name column is the metadata's ``job_name``
(``popgrpo <run name>, seed <seed>``), the Entrypoint column that short command, and the job's
page, under "User-provided metadata", the run name, the config as it was asked for (preset or
file, with its ``--set`` overrides), the seed, the run directory on the cluster and the
popgrpo version (:func:`job_metadata`).

The token of a cluster with Ray token authentication (on by default since Ray 2.52) is
taken the way Ray's own CLI takes it: ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token``. It is sent as a header and never printed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import popgrpo
from popgrpo.config import Config, ConfigError

__all__ = [
    "JobSpec",
    "JobsError",
    "build_job",
    "config_request",
    "first_line",
    "follow",
    "job_client",
    "job_metadata",
    "submission_id_for",
]

DEFAULT_RUNS_ROOT = "~/popgrpo-runs"
# Keys of a runtime env that ``submit`` sets itself; a user's runtime env may add the rest.
_OWNED_KEYS = ("working_dir",)
_EXCLUDES = ["__pycache__", "*.pyc"]


@dataclass(frozen=True)
class JobSpec:
    """Everything ``JobSubmissionClient.submit_job`` needs, built without touching a cluster."""

    submission_id: str
    entrypoint: str
    runtime_env: dict
    out: str  # run directory on the cluster (may start with ~)
    metadata: dict[str, str]  # shown on the Jobs page (job_metadata)


def submission_id_for(config: Config) -> str:
    """``popgrpo-<run name>-<UTC timestamp>-<4 hex>``: readable in the dashboard, unique."""
    return f"popgrpo-{config.run.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def config_request(config_arg: str | None, overrides: list[str] | None = None, seed: int | None = None) -> str:
    """The config as the user asked for it: ``pop_grpo --set population.size=3 --seed 3``."""
    words = [config_arg or "pop_grpo"]
    for item in overrides or []:
        words += ["--set", item]
    if seed is not None:
        words += ["--seed", str(seed)]
    return shlex.join(words)


def job_metadata(config: Config, out: str, request: str | None = None) -> dict[str, str]:
    """The job's metadata (strings, as Ray wants them): ``job_name`` is the Jobs page's Name
    column; every key is listed on the job's own page. ``request``: :func:`config_request`."""
    return {
        "job_name": f"popgrpo {config.run.name}, seed {config.run.seed}",
        "popgrpo_run_name": config.run.name,
        "popgrpo_config": request or config.run.name,
        "popgrpo_seed": str(config.run.seed),
        "popgrpo_run_dir": out,
        "popgrpo_version": popgrpo.__version__,
    }


def build_job(
    config: Config,
    staging_dir: Path,
    *,
    request: str | None = None,
    submission_id: str | None = None,
    out: str | None = None,
    python: str = "python",
    runtime_env: dict | None = None,
    quiet: bool = False,
) -> JobSpec:
    """Write ``config.yaml`` into ``staging_dir`` and describe the job that trains it.

    ``request``: the config as asked for (:func:`config_request`), for the job's metadata.

    ``runtime_env`` (e.g. ``cluster/runtime_env.yaml``) is merged in: its ``env_vars``,
    ``pip`` and the like are kept, ``py_modules`` gets this package appended, and
    ``working_dir`` is refused, because the staging directory must be the job's
    working directory (that is how the config travels).
    """
    user_env = dict(runtime_env or {})
    owned = [k for k in _OWNED_KEYS if k in user_env]
    if owned:
        raise ConfigError(
            f"runtime env sets {', '.join(owned)}; popgrpo submit ships the config as the job's working_dir, "
            "so leave it out (use py_modules for extra code)"
        )
    submission_id = submission_id or submission_id_for(config)
    out = out or f"{DEFAULT_RUNS_ROOT}/{submission_id}"
    staging_dir.mkdir(parents=True, exist_ok=True)
    (staging_dir / "config.yaml").write_text(config.to_yaml())
    package_dir = str(Path(popgrpo.__file__).resolve().parent)
    env = {
        **user_env,
        "working_dir": str(staging_dir),
        "py_modules": [*user_env.get("py_modules", []), package_dir],
        "excludes": [*user_env.get("excludes", []), *_EXCLUDES],
    }
    args = [python, "-m", "popgrpo.cli.job", "--config", "config.yaml", "--out", out]
    if quiet:
        args.append("--quiet")
    # ``~`` must reach the job unexpanded (the job expands it on its own node), so it is
    # not shell-quoted away: popgrpo.cli.job expands it itself.
    entrypoint = " ".join(shlex.quote(a) for a in args)
    return JobSpec(
        submission_id=submission_id,
        entrypoint=entrypoint,
        runtime_env=env,
        out=out,
        metadata=job_metadata(config, out, request),
    )


# ---- talking to the cluster ---------------------------------------------------------------
def job_client(address: str | None):
    """A ``JobSubmissionClient`` for ``address`` (or ``RAY_API_SERVER_ADDRESS`` / ``RAY_ADDRESS``,
    else ``http://127.0.0.1:8265``), with the cluster's auth token when one is available."""
    from ray.job_submission import JobSubmissionClient

    try:  # what `ray job submit` does: use a token if one exists, even with RAY_AUTH_MODE unset
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        setup_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = setup_log.level
        setup_log.setLevel(logging.ERROR)  # its "token auth is enabled" banner is noise for a client
        try:
            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        finally:
            setup_log.setLevel(level)
    except ImportError:  # Ray without token auth
        pass
    address = address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    address = address or "http://127.0.0.1:8265"
    if "://" not in address:
        address = f"http://{address}"
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # connection refused, auth failure, not a dashboard…
        raise JobsError(f"cannot reach the Ray job server at {address}: {first_line(exc)}") from None


class JobsError(RuntimeError):
    """The job server could not be reached or refused a request (exit 1, one line)."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def follow(client, submission_id: str, stream=None) -> str:
    """Print the job's logs as they come until it ends; return its final status name."""
    stream = stream or sys.stdout

    async def tail() -> None:
        async for chunk in client.tail_job_logs(submission_id):
            stream.write(chunk)
            stream.flush()

    asyncio.run(tail())
    # The log stream closes as the job ends; the status may take a moment to become final.
    deadline = time.time() + 30
    status = client.get_job_status(submission_id)
    while not status.is_terminal() and time.time() < deadline:
        time.sleep(0.5)
        status = client.get_job_status(submission_id)
    return str(status.value)
