"""One sandbox's life: started (its limits sent), handed its program, waited for, reaped, classified."""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
from typing import TypeVar

from popgrpo.envs.sandbox.bwrap import bwrap_command, interpreter_roots
from popgrpo.envs.sandbox.command import (
    CHILD_SCRIPT,
    SANDBOX_CHILD,
    SANDBOX_WORKDIR,
    child_env,
    limits_message,
    python_command,
)
from popgrpo.envs.sandbox.limits import ExecutionResult, SandboxLimits, SandboxUnavailable
from popgrpo.envs.sandbox.process import (
    has_exited,
    kill_below_leader,
    kill_group,
    session_members,
    wait_for_exit,
    wait_session_gone,
)
from popgrpo.envs.sandbox.seccomp import memfd, seccomp_program
from popgrpo.envs.sandbox.status import STDERR_TAIL_BYTES, Interpret, Outcome, classify, read_status, tail

__all__ = ["SandboxChild", "execute", "spawn_child"]

R = TypeVar("R")


class SandboxChild:
    """One started sandbox: its process, its directory and the pipes it reads and answers on.

    :func:`spawn_child` starts it and sends the limits; the child then gets warm and writes one
    byte on :attr:`ready_fd` (the warm pool polls it), and waits for its program, which
    :meth:`send` writes. :meth:`finish` waits for the end (the wall clock runs from the moment
    the program was written), kills the group, reaps, classifies and removes the directory.
    :meth:`discard` does the killing and cleaning for a child that never ran a program. Each
    child runs at most one program.
    """

    def __init__(self, proc: subprocess.Popen[bytes], base: str, control_fd: int, ready_fd: int, bwrap: bool) -> None:
        self.proc = proc
        self.base = base
        self.control_fd: int | None = control_fd
        self.ready_fd: int | None = ready_fd
        self.bwrap = bwrap
        self.late = False  # the wall clock ran out before the whole program was written

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        """Whether the child has exited (left unreaped, so its pid and group stay reserved)."""
        return has_exited(self.proc.pid)

    def close_ready(self) -> None:
        """Stop listening for the warm signal (the child ignores a closed pipe)."""
        if self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None

    def read_ready(self) -> bool:
        """After :attr:`ready_fd` polled readable: True when the child is warm, False when it died."""
        assert self.ready_fd is not None
        try:
            warm = os.read(self.ready_fd, 1) == b"r"
        except OSError:
            warm = False
        self.close_ready()
        return warm

    def send(self, nonce: str, code: str, deadline: float) -> bool:
        """Write the nonce and the program, then end of file; False when the child was gone.

        Non-blocking writes, so a child that does not read cannot hold the caller past
        ``deadline`` (the program's wall clock, already running); it is then killed before its
        pipe closes, so it never runs part of a program, and :meth:`finish` reports a timeout.
        """
        payload = memoryview(f"{nonce}\n{code}".encode())
        fd = self.control_fd
        assert fd is not None, "a sandbox runs one program"
        os.set_blocking(fd, False)
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        try:
            while payload:
                try:
                    payload = payload[os.write(fd, payload) :]
                except BlockingIOError:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        # Killed before the pipe closes: a program cut short must never run.
                        self.late = True
                        if self.bwrap:
                            kill_below_leader(self.proc.pid)
                        kill_group(self.proc.pid)
                        break
                    poller.poll(remaining * 1000)
        except BrokenPipeError:
            return False
        finally:
            os.close(fd)
            self.control_fd = None
        return True

    def finish(
        self,
        nonce: str,
        limits: SandboxLimits,
        score_range: tuple[float, float],
        deadline: float,
        interpret: Interpret[R] | None = None,
    ) -> ExecutionResult | R:
        """Wait until the program ends or ``deadline``; always kills its group, reaps it, cleans up.

        The result is the classified :class:`ExecutionResult`, or what ``interpret`` makes of the
        outcome (a test run's)."""
        pid = self.proc.pid
        exited, leftover = False, 0
        try:
            exited = wait_for_exit(pid, max(0.0, deadline - time.monotonic()))
            if exited and not self.bwrap:
                # Under bubblewrap nothing can be left: the program is its pid namespace's init,
                # whose exit kills the namespace, and it cannot create processes. Without it, look
                # (the exited leader is an unreaped zombie; a scan of /proc costs tens of ms here).
                leftover = session_members(pid)
        finally:
            self._close_pipes()
            if self.bwrap and not exited:
                kill_below_leader(pid)
            kill_group(pid)  # the unreaped leader keeps the pgid from being reused
            _, wait_status, usage = os.wait4(pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(wait_status)
            if not exited or leftover:
                wait_session_gone(pid)  # under bwrap the program is a grandchild, killed with its group
        returncode = self.proc.returncode
        if self.bwrap and 128 < returncode < 128 + signal.NSIG:
            returncode = -(returncode - 128)  # bubblewrap reports a signal as 128 + its number
        try:
            status_path = os.path.join(self.base, "status")
            outcome = Outcome(
                returncode=returncode,
                wall_timeout=not exited or self.late,
                cpu_time_s=usage.ru_utime + usage.ru_stime,
                status=read_status(status_path, nonce),
                stdout=tail(os.path.join(self.base, "stdout"), limits.max_output_bytes),
                stderr=tail(os.path.join(self.base, "stderr"), STDERR_TAIL_BYTES),
                leftover=leftover,
                status_text="" if interpret is None else tail(status_path, interpret.status_bytes),
            )
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
        if interpret is not None:
            return interpret(outcome, nonce, limits)
        return classify(outcome, limits, score_range)

    def discard(self) -> None:
        """Kill the child (its whole group), reap it and remove its directory. Idempotent."""
        self._close_pipes()
        if self.proc.returncode is None:
            pid = self.proc.pid
            if self.bwrap and not has_exited(pid):
                kill_below_leader(pid, timeout=0.5)
            kill_group(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self.proc.returncode = -signal.SIGKILL
            wait_session_gone(pid, timeout=1.0)
        shutil.rmtree(self.base, ignore_errors=True)

    def _close_pipes(self) -> None:
        self.close_ready()
        if self.control_fd is not None:
            os.close(self.control_fd)
            self.control_fd = None


def spawn_child(
    limits: SandboxLimits,
    python: str,
    site_packages: bool,
    isolation: str,
    audit_hook: bool = True,
    temp_dir: str | None = None,
) -> SandboxChild:
    """Start one sandbox and send it its limits; it gets warm on its own and waits for a program.

    Its fresh directory under ``temp_dir`` (default: the system's temp dir) holds ``work/`` (the
    program's working directory), ``stdout``, ``stderr`` and ``status``.
    """
    bwrap = shutil.which("bwrap") if isolation == "bwrap" else None
    if isolation == "bwrap" and bwrap is None:
        raise SandboxUnavailable("bubblewrap disappeared since the sandbox was created")
    base = tempfile.mkdtemp(prefix="popgrpo-sandbox-", dir=temp_dir)
    child_fds: list[int] = []  # the child's ends, closed here once it has them
    parent_fds: list[int] = []  # ours, kept by the SandboxChild
    try:
        work = os.path.join(base, "work")
        os.mkdir(work, 0o700)
        control_r, control_w = os.pipe()
        ready_r, ready_w = os.pipe()
        child_fds += [control_r, ready_w]
        parent_fds += [control_w, ready_r]
        with (
            open(os.path.join(base, "stdout"), "wb") as out,
            open(os.path.join(base, "stderr"), "wb") as err,
            open(os.path.join(base, "status"), "wb") as status,
        ):
            if bwrap:
                child_fds.append(memfd("popgrpo-seccomp", seccomp_program()))
                python_cmd = python_command(python, site_packages, SANDBOX_CHILD, control_r)
                cmd = [
                    *bwrap_command(bwrap, work, child_fds[-1], interpreter_roots(python, site_packages)),
                    *python_cmd,
                ]
                env, cwd = child_env(SANDBOX_WORKDIR), None
            else:
                cmd, env, cwd = python_command(python, site_packages, CHILD_SCRIPT, control_r), child_env(work), work
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(status.fileno(), *child_fds),
                start_new_session=True,
            )
            header = limits_message(limits, status.fileno(), ready_w, nproc=1 if bwrap else 0, audit_hook=audit_hook)
    except BaseException:
        for fd in child_fds + parent_fds:
            os.close(fd)
        shutil.rmtree(base, ignore_errors=True)
        raise
    for fd in child_fds:
        os.close(fd)
    child = SandboxChild(proc, base, control_w, ready_r, bwrap=bwrap is not None)
    with contextlib.suppress(BrokenPipeError):
        os.write(control_w, header)  # a few hundred bytes into an empty pipe: never blocks
    return child


def execute(
    code: str,
    limits: SandboxLimits,
    python: str,
    site_packages: bool,
    score_range: tuple[float, float],
    isolation: str,
    audit_hook: bool = True,
    temp_dir: str | None = None,
    interpret: Interpret[R] | None = None,
) -> ExecutionResult | R:
    """Run one program in a fresh sandbox started for it (the one-shot, cold path)."""
    child = spawn_child(limits, python, site_packages, isolation, audit_hook, temp_dir)
    try:
        child.close_ready()
        nonce = secrets.token_hex(16)
        deadline = time.monotonic() + limits.timeout_s
        child.send(nonce, code, deadline)  # a child that died starting is classified by its exit below
    except BaseException:
        child.discard()
        raise
    return child.finish(nonce, limits, score_range, deadline, interpret)
