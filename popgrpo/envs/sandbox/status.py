"""What a finished run left behind, read back: its status lines, its output's tails, its reason."""

from __future__ import annotations

import math
import os
import re
import secrets
import signal
from dataclasses import dataclass
from typing import Generic, TypeVar

from popgrpo.envs.sandbox.child import FORBIDDEN_EXIT, MEMORY_EXIT
from popgrpo.envs.sandbox.limits import ExecutionResult, SandboxLimits

__all__ = ["STDERR_TAIL_BYTES", "Interpret", "Outcome", "classify", "read_status", "tail"]

STDERR_TAIL_BYTES = 8192
"""How much of a program's stderr is kept (its end)."""
_DETAIL_CHARS = 300
_MEMORY_PATTERN = re.compile(
    r"MemoryError|Cannot allocate memory|out of memory|std::bad_alloc|Unable to allocate", re.IGNORECASE
)


def tail(path: str, limit: int) -> str:
    """The last ``limit`` bytes of a file, decoded leniently (the file may be far larger)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read(limit).decode("utf-8", "replace")


def _last_line(text: str) -> str:
    """The last non-empty line of ``text``, shortened for logs."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:_DETAIL_CHARS] if lines else ""


def read_status(path: str, nonce: str) -> dict[str, str]:
    """The child's out-of-band reports (``tag<TAB>detail`` lines), the first of each tag.

    A ``score`` line counts only with this run's nonce (``score<TAB>nonce<TAB>float.hex``): the
    program can write to the descriptor too, but it never learns the nonce. ``score`` is kept as
    the float's hex text; lines carrying a wrong nonce are recorded as ``forged``.
    """
    status: dict[str, str] = {}
    for line in tail(path, 16384).splitlines():
        tag, _, detail = line.partition("\t")
        if tag == "score":
            given, _, value = detail.partition("\t")
            if not secrets.compare_digest(given.encode(), nonce.encode()):
                status.setdefault("forged", "a score line without this run's nonce")
                continue
            detail = value
        status.setdefault(tag, detail[:_DETAIL_CHARS])
    return status


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


@dataclass(frozen=True)
class Outcome:
    """What the parent observed about one finished (reaped) program."""

    returncode: int
    wall_timeout: bool
    cpu_time_s: float
    status: dict[str, str]
    stdout: str
    stderr: str
    leftover: int = 0  # processes of the program's session still alive after it exited
    status_text: str = ""  # the whole status file, read only for a run that asked for it (a test run)


R = TypeVar("R")


class Interpret(Generic[R]):
    """How a run's :class:`Outcome` becomes its result, for a run that is not a scored program.

    :mod:`popgrpo.envs.harness` gives one for a test run: ``interpret(outcome, nonce, limits)``
    reads the harness's reports from ``outcome.status_text``. ``status_bytes`` is how much of the
    status file to read (its end is kept when it is longer).
    """

    status_bytes: int = 1 << 24

    def __call__(self, outcome: Outcome, nonce: str, limits: SandboxLimits) -> R:
        raise NotImplementedError


def _score_of(status: dict[str, str]) -> float | None:
    try:
        value = float.fromhex(status["score"])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def classify(o: Outcome, limits: SandboxLimits, score_range: tuple[float, float]) -> ExecutionResult:
    """Map an outcome to a reason, in the precedence :mod:`popgrpo.envs.sandbox` documents."""
    rc, err_line = o.returncode, _last_line(o.stderr)
    if "forbidden" in o.status or rc == FORBIDDEN_EXIT:
        detail = o.status.get("forbidden") or err_line or f"refused operation (exit status {FORBIDDEN_EXIT})"
        return ExecutionResult(0.0, "forbidden", detail)
    if o.leftover:
        return ExecutionResult(0.0, "leftover", f"{o.leftover} process(es) still running after the program ended")
    if o.wall_timeout:
        return ExecutionResult(0.0, "timeout", f"wall-clock limit of {limits.timeout_s:g} s exceeded")
    # The kernel kills at the limit by its own count; the rusage the parent reads for a sandbox
    # killed there fell short of it by up to 8% on a loaded 2-core machine (0.93 s for a 1 s
    # limit), which read as the OOM killer. Any SIGKILL past 85% of the limit is the CPU limit.
    cpu_hit = rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and o.cpu_time_s >= 0.85 * limits.cpu_s)
    if cpu_hit:
        return ExecutionResult(0.0, "timeout", f"CPU limit of {limits.cpu_s} s exceeded ({_signal_name(rc)})")
    if "memory" in o.status or rc == MEMORY_EXIT or (rc != 0 and _MEMORY_PATTERN.search(o.stderr)):
        return ExecutionResult(0.0, "memory", f"memory limit of {limits.memory_mb} MiB: {err_line or 'MemoryError'}")
    if rc == -signal.SIGKILL:  # not ours, not the CPU limit: the one other SIGKILL sender is the OOM killer
        return ExecutionResult(0.0, "memory", "killed by SIGKILL outside the sandbox (most likely the OOM killer)")
    if rc < 0:
        return ExecutionResult(0.0, "crash", f"killed by {_signal_name(rc)}" + (f": {err_line}" if err_line else ""))
    if rc != 0:
        return ExecutionResult(0.0, "crash", err_line or f"exit status {rc}")
    score = _score_of(o.status)
    if score is None:
        if "noscore" in o.status:
            detail = o.status["noscore"]
        elif "forged" in o.status:
            detail = o.status["forged"]
        else:
            detail = "the program stopped before its end (sys.exit, os._exit) or set no finite `score`"
        return ExecutionResult(0.0, "no_score", detail)
    low, high = score_range
    if not low <= score <= high:
        return ExecutionResult(0.0, "out_of_range", f"score {score!r} outside [{low:g}, {high:g}]")
    return ExecutionResult(score, "ok")
