"""The test helpers' promises: nothing a test starts outlives it, even if pytest is SIGKILLed;
a test whose program is missing skips with the reason, and fails in CI."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services import PROGRAMS, run_isolated

ROOT = Path(__file__).resolve().parent.parent


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie awaiting its reaper counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.requires("redis-server")
def test_redis_server_dies_with_a_sigkilled_test_process(tmp_path):
    fake_pytest = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom tests.services import RedisServer\n"
         f"server = RedisServer({str(tmp_path)!r})\nprint(server.proc.pid, flush=True)\ntime.sleep(600)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert fake_pytest.stdout is not None
    redis_pid = int(fake_pytest.stdout.readline())
    assert not _gone(redis_pid, timeout=0.2)
    fake_pytest.send_signal(signal.SIGKILL)  # no finally, no atexit: only the watchdog can act
    fake_pytest.wait()
    assert _gone(redis_pid), f"redis-server {redis_pid} outlived the process that started it"


def test_an_isolated_driver_is_killed_with_its_children_at_its_timeout():
    code = "import subprocess, time\nprint(subprocess.Popen(['sleep', '600']).pid, flush=True)\ntime.sleep(600)\n"
    done = run_isolated([sys.executable, "-c", code], timeout=3)
    assert done.returncode == -signal.SIGKILL and "killed after the 3 s timeout" in done.stdout
    assert _gone(int(done.stdout.split()[0]))


NEEDS = """import pytest

@pytest.fixture
def started(tmp_path_factory):
    (tmp_path_factory.getbasetemp().parent / "fixture-ran").touch()

@pytest.mark.requires("redis-server")
def test_redis(started):
    pass

@pytest.mark.requires("sandbox")
def test_sandbox(started):
    pass
"""


def test_a_missing_program_skips_with_its_package_before_any_fixture_and_fails_in_ci(tmp_path):
    (tmp_path / "test_needs.py").write_text(NEEDS)
    nothing = tmp_path / "empty-path"  # PATH holds no program at all
    nothing.mkdir()
    for ci, outcome in (("", "2 skipped"), ("true", "2 error")):
        base = tmp_path / f"base-ci{ci}"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-ra", "-W", "ignore::pytest.PytestUnknownMarkWarning",
             f"--basetemp={base}", str(tmp_path / "test_needs.py")],
            cwd=ROOT, env=os.environ | {"PATH": str(nothing), "CI": ci}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert outcome in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        assert "redis-server is not installed (apt-get install redis-server)" in done.stdout
        assert "bwrap is not installed (apt-get install bubblewrap)" in done.stdout
        assert ("CI installs it (.ci/run)" in done.stdout) == bool(ci)
        assert not (tmp_path / "fixture-ran").exists(), "a fixture was set up before the requirement was checked"


UNDECLARED = """import shutil, subprocess
import pytest
from tests.services import require

def visible():
    return sorted(p for p in ("bwrap", "redis-server", "prometheus", "chromium") if shutil.which(p))

def test_undeclared():
    assert visible() == []
    shell = subprocess.run(["sh", "-c", "command -v redis-server || echo none"], capture_output=True, text=True)
    assert shell.stdout.strip() == "none"  # a subprocess's own lookup finds nothing either
    assert shutil.which("sh")  # the other programs of the same folders are still there

@pytest.mark.requires("redis-server")
def test_declared():
    assert visible() == ["redis-server"]

def test_declared_mid_test():
    assert visible() == []
    require("chromium")
    assert visible() == ["chromium"]

def test_the_next_test_starts_hidden_again():
    assert visible() == []
"""


def test_with_the_hiding_variable_a_test_sees_only_the_programs_it_declared(tmp_path):
    """What CI's pass with ``POPGRPO_TEST_HIDE_PROGRAMS=1`` relies on: a test that uses a program
    it did not declare finds it missing (so it fails in CI), one that declares it finds it."""
    (tmp_path / "test_undeclared.py").write_text(UNDECLARED)
    fake = tmp_path / "bin"  # every program, as a script, first on PATH: found unless hidden
    fake.mkdir()
    for name in ("bwrap", "redis-server", "prometheus", "chromium"):
        (fake / name).write_text("#!/bin/sh\nexit 0\n")
        (fake / name).chmod(0o755)
    outcomes, stdout = {}, {}
    for hide in ("1", ""):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-rA", "-W", "ignore::pytest.PytestUnknownMarkWarning",
             f"--basetemp={tmp_path / f'base-{hide}'}", str(tmp_path / "test_undeclared.py")],
            cwd=ROOT, env=os.environ | {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "CI": "", "POPGRPO_TEST_HIDE_PROGRAMS": hide},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        stdout[hide] = done.stdout
        outcomes[hide] = {t: o for o, t in re.findall(r"^(PASSED|FAILED) \S+::(\w+)", done.stdout, re.M)}
    assert outcomes["1"] == dict.fromkeys(
        ("test_undeclared", "test_declared", "test_declared_mid_test", "test_the_next_test_starts_hidden_again"),
        "PASSED",
    ), stdout["1"][-3000:]
    # Without the variable nothing is hidden: the undeclared test sees every program, the declared one too.
    assert outcomes[""]["test_undeclared"] == "FAILED" and outcomes[""]["test_declared"] == "FAILED", stdout[""][-3000:]


def test_ci_installs_every_program_a_test_may_require():
    script = (ROOT / ".ci" / "run").read_text()
    [install] = re.findall(r"apt-get install ([^>\n]*)", script)
    assert set(PROGRAMS.values()) <= set(install.split()), install
