"""Execution reward: run model-written Python in a fresh, isolated process and take its score.

A policy proposes completions containing a fenced Python block; :func:`extract_code` takes the
last one and :class:`Sandbox` runs it. RL optimises against whatever the reward lets through, so
this module treats every program as an attacker's: it is a security boundary. Each program
runs in its **own** new interpreter, in layers:

* **bubblewrap** (``isolation="bwrap"``, the default; :func:`_bwrap_command`):
  ``--unshare-all --die-with-parent --as-pid-1``, uid/gid 65534 in a new user namespace, a new
  root holding only ``/usr``, the interpreter's prefix (and virtualenv) read-only, a private
  ``/dev`` and ``/tmp``, no ``/proc`` at all (not even its own: ``/proc/self/mem`` would read
  the interpreter's memory), and the empty working directory at :data:`SANDBOX_WORKDIR`. No
  host process, file, socket or network interface is reachable.
* **seccomp** (:func:`seccomp_program`): a libseccomp filter, compiled in the trainer and passed
  to ``bwrap --seccomp``, so the kernel enforces it from the interpreter's first instruction. It
  refuses process and thread creation, ``connect``, ``ptrace``, other processes' memory and
  signals, io_uring, namespaces, mounts and unblocking signals (the list is
  ``_SECCOMP_REFUSED``).
* **limits**, set by the child (:mod:`popgrpo.envs.sandbox_child`) before the program runs: ``RLIMIT_CPU`` (``cpu_s``; its
  ``SIGXCPU`` is blocked, so the kernel's ``SIGKILL`` at the same limit ends the program), ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_CORE = 0`` and, under
  bubblewrap, ``RLIMIT_NPROC = 1`` (per user namespace). They are set in the child rather than
  in ``preexec_fn``, which is unsafe with threads (:meth:`Sandbox.run_many` spawns from a
  thread pool). As no second process or thread can start, ``RLIMIT_AS`` bounds the program's
  total memory.
* **an audit hook** (:func:`sys.addaudithook`, PEP 578), the inner layer. It gives clear reasons
  and works where the kernel layer is opted out. It refuses writes outside the working
  directory (``open`` in a write mode, ``os.remove``/``rename``/``mkdir``/``chdir``/...,
  ``sqlite3.connect``), child processes, the network, signals to other processes, raising
  limits, opening anything under ``/proc``, ``gc``'s object walks, trace/profile functions
  and subinterpreters; ``import ctypes`` fails as if it were not installed. The first violation is
  written to the status descriptor *before* ``PermissionError`` is raised, so a ``try/except``
  in the program cannot hide it: the run is ``"forbidden"`` whatever happens next. The hook
  checks exact types and binds every name it uses before the program runs. No program code
  ever runs inside it, so patching builtins does not change what it refuses.
* ``python -I -B -X utf8 sandbox_child.py CONTROL_FD``: isolated mode, no ``.pyc`` writes; the
  child's script is a module of its own that imports only the standard library, bound
  read-only at :data:`SANDBOX_CHILD`; a scrubbed environment (:func:`child_env`);
  ``start_new_session=True``, so the group is killed as a whole when the run ends and the
  leader is reaped. The child reads its limits as one JSON line on the control pipe, gets warm,
  then reads the program from the same pipe (:class:`SandboxChild`), so a sandbox can be
  started ahead of its program (the warm pool, :mod:`popgrpo.envs.sandbox_pool`).

**The score** is the program's global ``score`` when it runs to its end. Printed output is not
a score. The parent draws a nonce per run and writes it, with the program's source, on the
control pipe, which the child reads to its end and closes before the program starts. The
nonce then lives only in the audit hook's closure. After ``exec`` returns, the child reads
``score`` (exact ``int``/``float`` only, never calling the program's methods) and raises the
``popgrpo.score`` audit event. The hook accepts that event only from the child's own
frame (registered before the program ran) and only once, and writes
``score<TAB>nonce<TAB>value`` to the status descriptor. Signals other than synchronous faults
stay blocked, so no handler of the program's runs between its last statement and that read.
The parent accepts only a line with its nonce, then checks ``score_range``. A program that
prints a number, writes lines to every descriptor, raises ``SystemExit(0)`` after setting
``score``, or leaves a process behind gets no score. The program runs with its own copy of the
builtins, so patching the ``builtins`` module does not change the template's own lookups.

``isolation="none"`` is the explicit opt-out where bubblewrap cannot run (:func:`bwrap_problem`
says why): the audit hook alone, with a warning. It is not a security boundary. ``ctypes``, a
subinterpreter or ``dir_fd`` tricks the hook misses reach the host, and only processes that
stay in the program's session are detected as left behind.

**Memory.** ``RLIMIT_AS`` caps *virtual address space*, not resident memory. Python turns a
refused allocation into ``MemoryError`` (the usual path, caught by the child), but the limit
also counts what is reserved and never touched: glibc malloc arenas (hence
``MALLOC_ARENA_MAX=2``), numpy/OpenBLAS buffers; a CUDA context would not fit at all. Set
``memory_mb`` with headroom for the libraries the programs import (``import numpy`` fits in
256 MiB). A C extension may abort instead of raising; that is caught through its stderr message.

Reasons (:data:`REASONS`) and how each is detected, first match wins (:func:`_classify`):

``forbidden``     the hook recorded a violation in the status file (or the child exited 86);
``leftover``      another process of the program's session was alive when it exited;
``timeout``       the wall clock ran out (we killed the group), or the CPU limit fired
                  (``SIGXCPU``, or ``SIGKILL`` with CPU time at the limit);
``memory``        ``MemoryError`` reached the top level (status file / exit 87), an allocation
                  failure message on stderr with a non-zero exit, or a ``SIGKILL`` that neither we
                  nor the CPU limit sent (the kernel OOM killer);
``crash``         any other non-zero exit or signal (uncaught exception, ``os.abort()``, a write
                  past ``RLIMIT_FSIZE``, ``sys.exit(3)``, a ``SyntaxError``, a thread refused);
``no_score``      exit 0 without a nonce-bearing score: the program ended early or left no
                  finite numeric ``score``;
``out_of_range``  a score outside ``score_range`` (default ``[0, 1]``);
``no_code``       nothing to run (no fenced block; never started);
``ok``            a score within range.

Only ``ok`` has a non-zero score.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from popgrpo.envs import sandbox_child
from popgrpo.envs.sandbox_child import FORBIDDEN_EXIT, MEMORY_EXIT

__all__ = [
    "ISOLATIONS",
    "REASONS",
    "ExecutionResult",
    "Interpret",
    "Outcome",
    "Sandbox",
    "SandboxChild",
    "SandboxLimits",
    "SandboxUnavailable",
    "bwrap_problem",
    "child_env",
    "extract_code",
    "score_completions",
    "seccomp_program",
    "spawn_child",
]

REASONS = ("ok", "timeout", "memory", "crash", "forbidden", "leftover", "no_score", "out_of_range", "no_code")


_STDERR_TAIL_BYTES = 8192
_DETAIL_CHARS = 300
_MEMORY_PATTERN = re.compile(
    r"MemoryError|Cannot allocate memory|out of memory|std::bad_alloc|Unable to allocate", re.IGNORECASE
)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. Frozen (hashable) so it can key the default-sandbox cache."""

    timeout_s: float = 5.0  # wall clock
    cpu_s: int = 5  # RLIMIT_CPU (soft = hard: SIGXCPU is blocked, the kernel's SIGKILL ends the program)
    memory_mb: int = 512  # RLIMIT_AS: virtual address space, not resident memory
    max_output_bytes: int = 65536  # stdout kept for diagnostics (its tail); never a score
    file_size_mb: int = 16  # RLIMIT_FSIZE: any single file, stdout included

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_output_bytes", "file_size_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ExecutionResult:
    """One program's outcome: ``score`` is 0.0 unless ``reason == "ok"``."""

    score: float
    reason: str  # one of REASONS
    detail: str = ""  # short human-readable cause (last stderr line, limit hit, ...), for logs


_NO_CODE = ExecutionResult(0.0, "no_code", "no fenced Python block in the completion")


# --------------------------------------------------------------------------- parsing


_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,})[ \t]*([\w.+-]*)[^\n`]*$")
_PYTHON_TAGS = frozenset({"", "python", "python3", "py", "py3"})


def extract_code(completion: str) -> str | None:
    """The last fenced block tagged ``python``/``py`` (or untagged) in ``completion``; else None.

    Parsed line by line rather than with one regex so that the closing fence of a block in
    another language (```` ```bash ````) is never mistaken for the opening of an untagged one,
    and so that an unterminated final block (generation cut off) is not run half-written.
    Blocks that are empty or only whitespace count as no code.
    """
    last: str | None = None
    fence: str | None = None  # the opening backticks of the block we are in
    tag = ""
    body: list[str] = []
    for line in completion.splitlines():
        if fence is None:
            m = _FENCE_OPEN.match(line)
            if m:
                fence, tag, body = m.group(1), m.group(2).lower(), []
        elif line.strip().startswith(fence) and set(line.strip()) == {"`"}:
            if tag in _PYTHON_TAGS and "\n".join(body).strip():
                last = "\n".join(body) + "\n"
            fence = None
        else:
            body.append(line)
    return last


# --------------------------------------------------------------------------- the child side

CHILD_SCRIPT = os.path.abspath(sandbox_child.__file__)
"""The child's source on the host (:mod:`popgrpo.envs.sandbox_child`), run by path."""

SANDBOX_CHILD = "/popgrpo/sandbox_child.py"
"""Where bubblewrap binds :data:`CHILD_SCRIPT` (read-only) inside the sandbox."""


def child_env(workdir: str) -> dict[str, str]:
    """The whole environment a program sees: nothing inherited from the trainer.

    ``workdir`` is the working directory as the program sees it. ``PYTHONHASHSEED`` is
    deliberately absent: ``-I`` makes the child ignore every ``PYTHON*`` variable, so it would
    only suggest a determinism that is not there (string hashing, hence set iteration order,
    stays randomised per run). ``MALLOC_ARENA_MAX`` keeps glibc from reserving 64 MiB of address
    space per thread, which ``RLIMIT_AS`` would count.
    """
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
    }


def _python_command(python: str, site_packages: bool, script: str, control_fd: int) -> list[str]:
    """The interpreter's argv: the child ``script`` reads everything else from ``control_fd``."""
    flags = ["-I", "-B", "-X", "utf8"] + ([] if site_packages else ["-S"])
    return [python, *flags, script, str(control_fd)]


def _limits_message(limits: SandboxLimits, status_fd: int, ready_fd: int, nproc: int, audit_hook: bool) -> bytes:
    """The child's first line on its control pipe (:func:`popgrpo.envs.sandbox_child.parse_limits`).

    ``audit_hook=False`` keeps only the hook's score reporting, not its refusals: the security
    tests use it to check that the kernel layer contains a program on its own.
    """
    mb = 1024 * 1024
    message = {
        "status_fd": status_fd,
        "ready_fd": ready_fd,
        "cpu_s": int(limits.cpu_s),
        "memory_bytes": int(limits.memory_mb) * mb,
        "file_size_bytes": int(limits.file_size_mb) * mb,
        "nproc": nproc,
        "contain": bool(audit_hook),
    }
    return json.dumps(message).encode() + b"\n"


# --------------------------------------------------------------------------- isolation

ISOLATIONS = ("bwrap", "none")
"""``bwrap``: namespaces + seccomp (required by default); ``none``: the audit hook alone (opt-in)."""

SANDBOX_WORKDIR = "/sandbox"
"""The program's working directory inside bubblewrap (the host directory is bound there)."""

SANDBOX_UID = 65534
"""The program's uid and gid inside its user namespace (``nobody``: no capabilities, owns nothing)."""


class SandboxUnavailable(RuntimeError):
    """The required isolation cannot run here, so untrusted code is not executed at all."""


# Syscalls refused with EPERM, whatever their arguments. Process and thread creation (a program
# is one thread: a second one could race the score's report), the network, other processes'
# memory and signals, new namespaces and mounts, and kernel interfaces that bypass the filter
# (io_uring performs connect/open without the syscalls) or widen the attack surface.
_SECCOMP_REFUSED = (
    "fork", "vfork", "clone", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open",
    "pidfd_send_signal", "pidfd_getfd", "kcmp", "connect", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount",
    "open_tree", "fsopen", "fsmount", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "personality", "mknod", "mknodat", "seccomp", "acct", "swapon",
    "swapoff", "reboot", "timer_create", "io_setup", "mq_notify", "settimeofday", "clock_settime", "sethostname", "setdomainname",
    "open_by_handle_at", "name_to_handle_at", "quotactl", "syslog", "vhangup",
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The compiled BPF filter bubblewrap installs before the interpreter's first instruction.

    Built with libseccomp (through ``pyseccomp``): default allow, the syscalls above refused,
    ``clone3`` answered ``ENOSYS`` (so that glibc falls back to ``clone``, which is refused),
    ``kill`` only to the program itself (pid 1 in its namespace) or its group (0),
    ``rt_sigprocmask`` only to block (the child blocks every signal; see :func:`popgrpo.envs.sandbox_child.block_signals`).
    Other architectures' syscall tables (x32, i386) kill the process.
    """
    import errno

    import pyseccomp as sc

    refused = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in _SECCOMP_REFUSED:
        f.add_rule(refused, name)
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(refused, "kill", sc.Arg(0, sc.GT, 1))  # pid_t as unsigned: negative pids are huge
    f.add_rule(refused, "tgkill", sc.Arg(0, sc.GT, 1))
    f.add_rule(refused, "rt_sigprocmask", sc.Arg(0, sc.NE, signal.SIG_BLOCK))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start (closed by the caller)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, 0)
    else:  # no memfd (not Linux): an unlinked temporary file serves the same purpose
        with tempfile.TemporaryFile() as handle:
            fd = os.dup(handle.fileno())
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _interpreter_roots(python: str, site_packages: bool) -> list[str]:
    """Host directories the interpreter needs, bound read-only at the same paths.

    The standard library's prefix; with ``site_packages`` also the environment's own prefix (a
    virtualenv's site-packages). Directories already under ``/usr`` are covered by its bind.
    """
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        prefixes = [sys.base_prefix, sys.base_exec_prefix] + ([sys.prefix] if site_packages else [])
        candidates = [*prefixes, os.path.dirname(python)]
    else:
        candidates = [os.path.dirname(os.path.dirname(os.path.realpath(python))), os.path.dirname(python)]
    roots: list[str] = []
    for path in candidates:
        for variant in {os.path.abspath(path), os.path.realpath(path)}:
            if variant == "/usr" or variant.startswith("/usr/") or not os.path.isdir(variant):
                continue
            if variant not in roots:
                roots.append(variant)
    roots.sort(key=len)
    return [r for i, r in enumerate(roots) if not any(r.startswith(q.rstrip("/") + "/") for q in roots[:i])]


def _bwrap_command(bwrap: str, work: str, seccomp_fd: int, roots: Sequence[str]) -> list[str]:
    """bubblewrap's arguments: every namespace new, a read-only system, a private /tmp and work dir.

    ``--as-pid-1``: the interpreter is the namespace's init, so when it exits the kernel kills
    whatever else is left in it (nothing can be: process creation is refused). ``--die-with-parent``:
    killing bubblewrap kills the program. The child's script is bound at :data:`SANDBOX_CHILD`.
    The host's ``/proc``, ``/home``, ``/root``, ``/etc``
    (beyond the dynamic loader's cache), the trainer's files and sockets are not there at all.
    """
    cmd = [
        bwrap, "--unshare-all", "--die-with-parent", "--as-pid-1", "--hostname", "sandbox",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/localtime"):
        cmd += ["--ro-bind-try", path, path]
    # The private /dev and /tmp first: an interpreter or virtualenv that lives under /tmp (a CI
    # checkout, say) is then bound on top of the new /tmp instead of being hidden by it.
    cmd += ["--dev", "/dev", "--tmpfs", "/tmp"]
    for root in roots:
        if root == SANDBOX_WORKDIR or root.startswith(SANDBOX_WORKDIR + "/"):
            raise SandboxUnavailable(f"the interpreter lives under {SANDBOX_WORKDIR}, where programs run")
        cmd += ["--ro-bind", root, root]
    cmd += ["--ro-bind", CHILD_SCRIPT, SANDBOX_CHILD]  # the child's code, and nothing else of popgrpo's
    cmd += [
        "--bind", work, SANDBOX_WORKDIR,
        "--chdir", SANDBOX_WORKDIR, "--seccomp", str(seccomp_fd), "--",
    ]  # fmt: skip
    return cmd


@functools.cache
def bwrap_problem(python: str = sys.executable) -> str | None:
    """Why programs cannot run under bubblewrap + seccomp here, or None when they can.

    Checked once per interpreter by running ``python -c pass`` exactly as a program would run
    (user namespaces may be disabled, e.g. ``kernel.unprivileged_userns_clone=0`` or an
    AppArmor policy, and bwrap then fails only when it starts).
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    try:
        program = seccomp_program()
    except (ImportError, OSError, RuntimeError) as exc:
        return f"no seccomp filter: {exc} (pip install pyseccomp; apt-get install libseccomp2)"
    with tempfile.TemporaryDirectory(prefix="popgrpo-sandbox-probe-") as work:
        fd = _memfd("popgrpo-seccomp", program)
        try:
            cmd = [
                *_bwrap_command(bwrap, work, fd, _interpreter_roots(python, False)),
                python,
                "-I",
                "-S",
                "-c",
                "pass",
            ]
            res = subprocess.run(cmd, pass_fds=(fd,), capture_output=True, timeout=60, env=child_env(SANDBOX_WORKDIR))
        except (OSError, subprocess.TimeoutExpired, SandboxUnavailable) as exc:
            return f"bubblewrap could not start: {exc}"
        finally:
            os.close(fd)
    if res.returncode != 0:
        return f"bubblewrap failed (exit {res.returncode}): {res.stderr.decode(errors='replace').strip()[-300:]}"
    return None


_WARNED_UNISOLATED = [False]


def _warn_unisolated() -> None:
    message = (
        "popgrpo sandbox: isolation='none' — untrusted programs run WITHOUT namespaces or seccomp, "
        "contained only by a Python audit hook that a determined program can bypass (files, network, "
        "other processes, forged scores). Use it only on a disposable machine."
    )
    if not _WARNED_UNISOLATED[0]:
        _WARNED_UNISOLATED[0] = True
        print(f"WARNING: {message}", file=sys.stderr, flush=True)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


# --------------------------------------------------------------------------- the parent side


def _has_exited(pid: int) -> bool:
    """Whether ``pid`` has exited, *without* reaping it (the zombie keeps its pid and pgid reserved)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _wait_for_exit(pid: int, timeout: float) -> bool:
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
                    return _has_exited(pid)
            return True
        finally:
            os.close(pidfd)
    delay = 0.001
    while not _has_exited(pid):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)
    return True


def _kill_group(pgid: int) -> None:
    """SIGKILL the program's whole process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: str, limit: int) -> str:
    """The last ``limit`` bytes of a file, decoded leniently (the file may be far larger)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read(limit).decode("utf-8", "replace")


def _last_line(text: str) -> str:
    """The last non-empty line of ``text``, shortened for logs."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:_DETAIL_CHARS] if lines else ""


def _read_status(path: str, nonce: str) -> dict[str, str]:
    """The child's out-of-band reports (``tag<TAB>detail`` lines), the first of each tag.

    A ``score`` line counts only with this run's nonce (``score<TAB>nonce<TAB>float.hex``): the
    program can write to the descriptor too, but it never learns the nonce. ``score`` is kept as
    the float's hex text; lines carrying a wrong nonce are recorded as ``forged``.
    """
    status: dict[str, str] = {}
    for line in _tail(path, 16384).splitlines():
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


_Outcome = Outcome
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


def _classify(o: Outcome, limits: SandboxLimits, score_range: tuple[float, float]) -> ExecutionResult:
    """Map an outcome to a reason, in the precedence documented in the module docstring."""
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


def _session_members(sid: int) -> int:
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


def _kill_below_leader(leader: int, timeout: float = 2.0) -> None:
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
    _wait_for_exit(leader, timeout)


def _wait_session_gone(sid: int, timeout: float = 5.0) -> None:
    """Wait until no live process of session ``sid`` remains (SIGKILLed ones take a moment)."""
    deadline = time.monotonic() + timeout
    while _session_members(sid) and time.monotonic() < deadline:
        _kill_group(sid)
        time.sleep(0.005)


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
        return _has_exited(self.proc.pid)

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
                            _kill_below_leader(self.proc.pid)
                        _kill_group(self.proc.pid)
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
            exited = _wait_for_exit(pid, max(0.0, deadline - time.monotonic()))
            if exited and not self.bwrap:
                # Under bubblewrap nothing can be left: the program is its pid namespace's init,
                # whose exit kills the namespace, and it cannot create processes. Without it, look
                # (the exited leader is an unreaped zombie; a scan of /proc costs tens of ms here).
                leftover = _session_members(pid)
        finally:
            self._close_pipes()
            if self.bwrap and not exited:
                _kill_below_leader(pid)
            _kill_group(pid)  # the unreaped leader keeps the pgid from being reused
            _, wait_status, usage = os.wait4(pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(wait_status)
            if not exited or leftover:
                _wait_session_gone(pid)  # under bwrap the program is a grandchild, killed with its group
        returncode = self.proc.returncode
        if self.bwrap and 128 < returncode < 128 + signal.NSIG:
            returncode = -(returncode - 128)  # bubblewrap reports a signal as 128 + its number
        try:
            status_path = os.path.join(self.base, "status")
            outcome = Outcome(
                returncode=returncode,
                wall_timeout=not exited or self.late,
                cpu_time_s=usage.ru_utime + usage.ru_stime,
                status=_read_status(status_path, nonce),
                stdout=_tail(os.path.join(self.base, "stdout"), limits.max_output_bytes),
                stderr=_tail(os.path.join(self.base, "stderr"), _STDERR_TAIL_BYTES),
                leftover=leftover,
                status_text="" if interpret is None else _tail(status_path, interpret.status_bytes),
            )
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
        if interpret is not None:
            return interpret(outcome, nonce, limits)
        return _classify(outcome, limits, score_range)

    def discard(self) -> None:
        """Kill the child (its whole group), reap it and remove its directory. Idempotent."""
        self._close_pipes()
        if self.proc.returncode is None:
            pid = self.proc.pid
            if self.bwrap and not _has_exited(pid):
                _kill_below_leader(pid, timeout=0.5)
            _kill_group(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self.proc.returncode = -signal.SIGKILL
            _wait_session_gone(pid, timeout=1.0)
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
                child_fds.append(_memfd("popgrpo-seccomp", seccomp_program()))
                python_cmd = _python_command(python, site_packages, SANDBOX_CHILD, control_r)
                cmd = [
                    *_bwrap_command(bwrap, work, child_fds[-1], _interpreter_roots(python, site_packages)),
                    *python_cmd,
                ]
                env, cwd = child_env(SANDBOX_WORKDIR), None
            else:
                cmd, env, cwd = _python_command(python, site_packages, CHILD_SCRIPT, control_r), child_env(work), work
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
            header = _limits_message(limits, status.fileno(), ready_w, nproc=1 if bwrap else 0, audit_hook=audit_hook)
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


def _execute(
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


_SandboxT = TypeVar("_SandboxT", bound="Sandbox")


class Sandbox:
    """Runs programs, each in its own isolated, limited process, on a thread pool.

    Threads are enough for parallelism: each worker only waits on its child (no GIL held). The
    pool bounds how many programs run at once (``max_workers``, default ``os.cpu_count()``);
    every method may be called from several threads. ``site_packages=False`` adds ``-S``: the
    program then sees only the standard library, and the interpreter starts several times faster.

    ``isolation="bwrap"`` (the default) runs every program under bubblewrap and seccomp and
    raises :class:`SandboxUnavailable` here, before anything runs, when that is impossible on
    this machine. ``isolation="none"`` is the explicit opt-out: the audit hook alone, with a
    warning on stderr. ``score_range`` (default ``(0, 1)``) bounds the scores a program may
    report; anything outside scores 0 with reason ``out_of_range``. Each program's directory is
    made under ``temp_dir`` (default: the system's temp dir; a size-limited filesystem there
    bounds what programs can write to the disk).
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),  # frozen, so sharing the default is safe
        max_workers: int | None = None,
        python: str = sys.executable,
        score_range: tuple[float, float] = (0.0, 1.0),
        *,
        site_packages: bool = True,
        isolation: str = "bwrap",
        temp_dir: str | None = None,
        _audit_hook: bool = True,
    ) -> None:
        if score_range is None or len(score_range) != 2:
            raise ValueError(f"score_range must be (low, high), got {score_range!r}")
        low, high = (float(v) for v in score_range)
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"score_range must be finite (low, high) with low <= high, got {score_range!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if isolation == "bwrap":
            problem = bwrap_problem(python)
            if problem is not None:
                raise SandboxUnavailable(
                    f"refusing to run untrusted code: {problem}. Install bubblewrap where user namespaces "
                    "are allowed, or opt out explicitly with isolation='none' (audit hook only; not a "
                    "security boundary)"
                )
        else:
            _warn_unisolated()
        self.limits = limits
        self.python = python
        self.score_range = (low, high)
        self.site_packages = site_packages
        self.isolation = isolation
        self.temp_dir = temp_dir
        self._audit_hook = _audit_hook  # False only in tests of the kernel layer alone
        self._pool = ThreadPoolExecutor(max_workers or os.cpu_count() or 1, thread_name_prefix="popgrpo-sandbox")

    def run(self, code: str) -> ExecutionResult:
        """Run one program and wait for its result."""
        return self.run_many([code])[0]

    def run_many(self, codes: Sequence[str | None]) -> list[ExecutionResult]:
        """Run programs in parallel and wait; results in input order, ``None`` → ``no_code``."""
        return self.submit(codes).result()

    def submit(self, codes: Sequence[str | None]) -> Future[list[ExecutionResult]]:
        """Start programs and return at once with a Future of their results (input order).

        Lets a trainer overlap execution with other work. Cancelling the returned Future cancels
        the programs not yet started; :meth:`close` cancels queued ones too (the Future is then
        cancelled).
        """
        codes = list(codes)
        for code in codes:
            if code is not None and not isinstance(code, str):
                raise TypeError(f"codes must be str or None, got {type(code).__name__}")
        batch: Future[list[ExecutionResult]] = Future()
        results: list[ExecutionResult | None] = [None if c is not None else _NO_CODE for c in codes]
        pending = [(i, c) for i, c in enumerate(codes) if c is not None]
        if not pending:
            batch.set_result([r for r in results if r is not None])  # every entry is _NO_CODE
            return batch
        # Re-entrant: cancelling ``batch`` cancels queued items, whose callbacks run right here.
        lock = threading.RLock()
        remaining = [len(pending)]

        def item_done(index: int, fut: Future[ExecutionResult]) -> None:
            with lock:
                try:
                    if fut.cancelled():
                        batch.cancel()
                    elif fut.exception() is not None:
                        batch.set_exception(fut.exception())
                    else:
                        results[index] = fut.result()
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            batch.set_result([r for r in results if r is not None])  # every entry is _NO_CODE
                except (InvalidStateError, CancelledError):
                    pass  # the batch already failed or was cancelled by the caller

        items = [self._pool.submit(self._run_program, code) for _, code in pending]
        batch.add_done_callback(lambda b: [f.cancel() for f in items] if b.cancelled() else None)
        for (index, _), fut in zip(pending, items, strict=True):
            fut.add_done_callback(functools.partial(item_done, index))
        return batch

    def submit_one(self, code: str | None) -> Future[ExecutionResult]:
        """Start one program and return at once with a Future of its result (``None`` → ``no_code``).

        For a trainer that hands each program over as soon as its completion is generated.
        """
        if code is None:
            done: Future[ExecutionResult] = Future()
            done.set_result(_NO_CODE)
            return done
        if not isinstance(code, str):
            raise TypeError(f"code must be str or None, got {type(code).__name__}")
        return self._pool.submit(self._run_program, code)

    def submit_run(self, payload: str, interpret: Interpret[R]) -> Future[R]:
        """Start one run whose outcome ``interpret`` reads (a test run of :mod:`popgrpo.envs.harness`).

        ``payload`` is what the child reads after the nonce (a program, or a test run's spec); the
        run has this sandbox's limits, isolation and pool, exactly as a program has.
        """
        return self._pool.submit(self._run_one, payload, interpret)  # pyright: ignore[reportReturnType]

    def _run_program(self, code: str) -> ExecutionResult:
        """Run one scored program on the calling (worker) thread."""
        result = self._run_one(code)
        assert isinstance(result, ExecutionResult)  # without ``interpret``, the classified result
        return result

    def _run_one(self, code: str, interpret: Interpret[R] | None = None) -> ExecutionResult | R:
        """Run one program on the calling (worker) thread: a fresh sandbox started for it."""
        return _execute(
            code,
            limits=self.limits,
            python=self.python,
            site_packages=self.site_packages,
            score_range=self.score_range,
            isolation=self.isolation,
            audit_hook=self._audit_hook,
            temp_dir=self.temp_dir,
            interpret=interpret,
        )

    def close(self) -> None:
        """Wait for running programs, cancel queued ones, stop the pool. Idempotent."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self: _SandboxT) -> _SandboxT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- the reward

_DEFAULT_SANDBOXES: dict[tuple[object, ...], Sandbox] = {}
_DEFAULT_LOCK = threading.Lock()


def _default_sandbox_for(
    limits: SandboxLimits,
    max_workers: int | None = None,
    score_range: tuple[float, float] = (0.0, 1.0),
    site_packages: bool = True,
    isolation: str = "bwrap",
) -> Sandbox:
    """One lazily created, shared one-shot sandbox per distinct settings (reused across batches)."""
    key = (limits, max_workers, score_range, site_packages, isolation)
    with _DEFAULT_LOCK:
        if key not in _DEFAULT_SANDBOXES:
            _DEFAULT_SANDBOXES[key] = Sandbox(
                limits, max_workers, score_range=score_range, site_packages=site_packages, isolation=isolation
            )
        return _DEFAULT_SANDBOXES[key]


def score_completions(
    completions: Sequence[str], *, sandbox: Sandbox | None = None, **limit_overrides: float
) -> tuple[list[float], list[str]]:
    """Rewards and reasons for a batch of completions: :func:`extract_code` → :meth:`Sandbox.run_many`.

    Without ``sandbox`` a module-level one-shot default is created on first use;
    ``limit_overrides`` (fields of :class:`SandboxLimits`, e.g. ``timeout_s=2``) select a default
    with those limits. For warm sandboxes pass ``sandbox=shared_pool(limits)``
    (:mod:`popgrpo.envs.sandbox_pool`).
    """
    if sandbox is not None and limit_overrides:
        raise TypeError("pass limits to the Sandbox you give, not to score_completions")
    if sandbox is None:
        sandbox = _default_sandbox_for(replace(SandboxLimits(), **limit_overrides))
    results = sandbox.run_many([extract_code(c) for c in completions])
    return [r.score for r in results], [r.reason for r in results]
