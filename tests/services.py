"""Real services for tests: started here, on loopback and free ports, stopped by their own handle.

A test that needs a service skips with a reason when it is not installed, except in CI
(``CI=true``), where ``.ci/run`` installs it and its absence is a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed; .ci/run must install it (apt-get install {name})")
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A password-protected redis-server on 127.0.0.1, no persistence."""

    def __init__(self, workdir: str) -> None:
        self.port = free_port()
        self.password = secrets.token_hex(8)
        self.proc = subprocess.Popen(
            [require_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(self.port), "--requirepass",
             self.password, "--save", "", "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
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
        self.proc.terminate()
        self.proc.wait(timeout=10)


def ray_subprocess_env(prefix: str = "pgsub-") -> dict[str, str]:
    """Environment for a ``popgrpo`` subprocess whose embedded Ray must be the test's own:
    a fresh short temp root (``RAY_TMPDIR``; Ray's socket paths are length-limited), a free
    dashboard port, and no inherited ``RAY_ADDRESS``. The caller removes ``env["RAY_TMPDIR"]``."""
    import tempfile

    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_TMPDIR": tempfile.mkdtemp(prefix=prefix, dir="/tmp"),
        "POPGRPO_RAY_DASHBOARD_PORT": str(free_port()),
    }
