"""Where bubblewrap cannot run, untrusted code is refused unless the user opts out explicitly."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time

import pytest

from popgrpo.envs.rewards import execution_score
from popgrpo.envs.sandbox import Sandbox, SandboxUnavailable, bwrap_problem


@pytest.fixture
def no_bwrap(monkeypatch):
    """This process sees no bubblewrap (as on a machine without the package)."""
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    bwrap_problem.cache_clear()
    yield
    bwrap_problem.cache_clear()


def test_without_bubblewrap_untrusted_code_is_refused(no_bwrap):
    assert "bubblewrap is not installed" in (bwrap_problem() or "")
    with pytest.raises(SandboxUnavailable, match=r"refusing to run untrusted code.*isolation='none'"):
        Sandbox()
    with pytest.raises(SandboxUnavailable):
        execution_score(["p"], ["score = 1"], fenced=False)


def test_the_explicit_opt_out_runs_with_a_loud_warning(no_bwrap):
    with pytest.warns(RuntimeWarning, match="WITHOUT namespaces or seccomp"):
        scores, reasons = execution_score(["p"], ["score = 0.5"], fenced=False, isolation="none", site_packages=False)
    assert (scores, reasons) == ([0.5], ["ok"])
    with pytest.warns(RuntimeWarning), Sandbox(isolation="none", site_packages=False) as sb:
        assert sb.run("open('/tmp/x', 'w')").reason == "forbidden"  # the audit hook still stands


def test_isolation_must_be_named():
    with pytest.raises(ValueError, match="isolation must be one of"):
        Sandbox(isolation="docker")


def test_without_namespaces_a_process_left_in_the_session_scores_zero_and_is_killed(no_bwrap):
    marker = f"popgrpo-leftover-{os.getpid()}-{time.monotonic_ns()}"
    code = f"import os\nif os.fork() == 0:\n    os.execv('/bin/sh', ['sh', '-c', 'sleep 30', {marker!r}])\nscore = 1.0"
    with pytest.warns(RuntimeWarning), Sandbox(isolation="none", site_packages=False, _audit_hook=False) as sb:
        result = sb.run(code)
    assert (result.score, result.reason) == (0.0, "leftover")
    survivors = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
            if marker.encode() in f.read():
                survivors.append(int(entry))
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
