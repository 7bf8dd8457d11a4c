"""A started sandbox's processes: waiting for the leader without reaping it, and killing its session."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

__all__ = ["has_exited", "kill_below_leader", "kill_group", "session_members", "wait_for_exit", "wait_session_gone"]


def has_exited(pid: int) -> bool:
    """Whether ``pid`` has exited, *without* reaping it (the zombie keeps its pid and pgid reserved)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Block until ``pid`` exits (left unreaped) or ``timeout`` passes; True if it exited.

    Uses a pidfd where the kernel has one (no polling), else polls ``waitid`` with a growing
    sleep. ``poll`` rather than ``select``: descriptor numbers in a Ray/torch process can exceed
    ``FD_SETSIZE``.
    """
    deadline = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                if time.monotonic() >= deadline:
                    return has_exited(pid)
            return True
        finally:
            os.close(pidfd)
    delay = 0.001
    while not has_exited(pid):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)
    return True


def kill_group(pgid: int) -> None:
    """SIGKILL the program's whole process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def session_members(sid: int) -> int:
    """How many live (non-zombie) processes belong to session ``sid``."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 4 and int(fields[3]) == sid and fields[0] != b"Z":
            count += 1
    return count


def kill_below_leader(leader: int, timeout: float = 2.0) -> None:
    """SIGKILL every process of the leader's session but the leader, and give it time to reap them.

    bubblewrap (the leader) reaps the program it started; killing it first would hand the
    program to the host's init, which need not reap it (a zombie per timed-out run).
    """
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != leader:
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    sid = int(f.read().rsplit(b")", 1)[1].split()[3])
            except (OSError, IndexError, ValueError):
                continue
            if sid == leader:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry), signal.SIGKILL)
    wait_for_exit(leader, timeout)


def wait_session_gone(sid: int, timeout: float = 5.0) -> None:
    """Wait until no live process of session ``sid`` remains (SIGKILLed ones take a moment)."""
    deadline = time.monotonic() + timeout
    while session_members(sid) and time.monotonic() < deadline:
        kill_group(sid)
        time.sleep(0.005)
