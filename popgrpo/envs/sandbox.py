"""Execution reward: run model-written Python in a fresh, limited process and read its score.

A policy proposes completions containing a fenced Python block; :func:`extract_code` takes the
last one, :class:`Sandbox` runs it and :func:`parse_score` reads the score the program printed.
Every program runs in its **own** new interpreter:

* ``python -I -B -X utf8 -c BOOTSTRAP``: isolated mode (no user site, no ``PYTHON*`` variables, no
  script directory on ``sys.path``), no ``.pyc`` writes (they would land outside the working
  directory and count as a violation).
* ``start_new_session=True``: the program leads its own process group, which is killed as a whole
  (``os.killpg``) when the run ends, on time or not, and the leader is reaped (no zombies).
* a fresh, empty working directory under a :class:`tempfile.TemporaryDirectory` that is removed
  afterwards; stdout, stderr, the program file and a status file live next to it, *outside* it.
* a scrubbed environment (:func:`child_env`): nothing is inherited, so tokens, ``RAY_*``,
  ``REDIS_*`` and ``*PASSWORD*`` variables cannot leak; ``HOME`` and ``TMPDIR`` point at the
  working directory so that well-behaved caches and temp files stay inside it.
* resource limits set by the bootstrap before the program runs: ``RLIMIT_CPU`` (soft = ``cpu_s``,
  hard one second later), ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_CORE = 0``. They are set in the
  child rather than in ``preexec_fn`` because ``preexec_fn`` is unsafe with threads and
  :meth:`Sandbox.run_many` spawns from a thread pool. ``RLIMIT_NPROC`` is *not* set: it counts
  every process of the user (the trainer, Ray workers, other sandboxes), so a value low enough to
  matter would make unrelated runs fail at random; child processes are refused by the hook instead.
* an audit hook (:func:`sys.addaudithook`, PEP 578) installed by the bootstrap before it ``exec``-s
  the program. It refuses writes (``open`` in a write/append/create mode, ``os.remove``,
  ``os.rename``, ``os.mkdir``, ``os.rmdir``, ``shutil.rmtree``, ``os.link``/``symlink``,
  ``os.chmod``/``chown``/``utime``/``truncate``, ``sqlite3.connect`` ...) whose resolved path
  (:func:`os.path.realpath`, so symlinks are followed) is outside the working directory; child
  processes (``subprocess.Popen``, ``os.system``, ``os.exec*``, ``os.spawn*``, ``os.posix_spawn``,
  ``os.fork``, ``pty.spawn``); the network (``socket.connect``/``bind``/``sendto``/``sendmsg`` and
  name lookups); signals to other processes; and raising resource limits. The first violation
  is written to the status file *before* ``PermissionError`` is raised, so a ``try/except`` in the
  program cannot hide it: the run is ``"forbidden"`` whatever happens next.

**This is not a security boundary.** An audit hook is best-effort containment against a model's
accidental or naive behaviour (deleting files, writing results to ``/tmp``, calling ``pip``). It
is trivially bypassed on purpose: ``ctypes`` can call ``libc`` directly, ``os.open(..., dir_fd=)``
is checked against the working directory instead of ``dir_fd``, path checks race with
concurrent renames, closing the status descriptor hides violations the exit code would otherwise
report, and reads are not restricted at all. On a cluster, run the sandbox workers themselves in
a container / gVisor / nsjail with no credentials mounted and no network. A stronger per-program
isolation layer (e.g. ``bwrap --unshare-all --die-with-parent --ro-bind / / --bind WORK WORK``,
when installed) would be prefixed to the command built in :func:`_command`; nothing here
requires it.

**Memory.** ``RLIMIT_AS`` caps *virtual address space*, not resident memory. Python turns a
refused allocation into ``MemoryError`` (the usual path, caught by the bootstrap), but the limit
also counts what is reserved and never touched: 8 MiB of stack per thread, glibc malloc arenas
(hence ``MALLOC_ARENA_MAX=2``), numpy/OpenBLAS buffers; a CUDA context would not fit at all. Set
``memory_mb`` with headroom for the libraries the programs import (``import numpy`` fits in
256 MiB). A C extension may abort instead of raising; that is caught through its stderr message.

Reasons (:data:`REASONS`) and how each is detected, first match wins (:func:`_classify`):

``forbidden``  the hook recorded a violation in the status file (or the bootstrap exited 86);
``timeout``    the wall clock ran out (we killed the group), or the CPU limit fired
               (``SIGXCPU``, or ``SIGKILL`` with CPU time at the limit);
``memory``     ``MemoryError`` reached the top level (status file / exit 87), an allocation
               failure message on stderr with a non-zero exit, or a ``SIGKILL`` that neither we nor
               the CPU limit sent (the kernel OOM killer; ``ru_maxrss`` cannot confirm it, as Linux
               folds the parent's pre-``exec`` peak into the child's);
``crash``      any other non-zero exit or signal (uncaught exception, ``os.abort()``, a write
               past ``RLIMIT_FSIZE`` (Python ignores ``SIGXFSZ``, so it is ``OSError: File too
               large``), ``sys.exit(3)``, a ``SyntaxError``);
``no_score``   exit 0 but the last non-empty stdout line is not a finite score;
``no_code``    nothing to run (no fenced block; never started);
``ok``         exit 0 and a finite score, clipped to ``score_range`` when one is given.

Only ``ok`` has a non-zero score.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, replace

__all__ = [
    "REASONS",
    "ExecutionResult",
    "Sandbox",
    "SandboxLimits",
    "child_env",
    "execution_reward",
    "extract_code",
    "parse_score",
]

REASONS = ("ok", "timeout", "memory", "crash", "forbidden", "no_score", "no_code")

FORBIDDEN_EXIT = 86
"""Exit status the bootstrap uses when the program did something the hook refused."""
MEMORY_EXIT = 87
"""Exit status the bootstrap uses when ``MemoryError`` reached the top level."""

_STDERR_TAIL_BYTES = 8192
_DETAIL_CHARS = 300
_MEMORY_PATTERN = re.compile(
    r"MemoryError|Cannot allocate memory|out of memory|std::bad_alloc|Unable to allocate", re.IGNORECASE
)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. Frozen (hashable) so it can key the default-sandbox cache."""

    timeout_s: float = 5.0  # wall clock
    cpu_s: int = 5  # RLIMIT_CPU (soft; the hard limit is one second later)
    memory_mb: int = 512  # RLIMIT_AS: virtual address space, not resident memory
    max_output_bytes: int = 65536  # stdout kept (the tail: the score is on the last line)
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


_SCORE_LINE = re.compile(r"^(?:score\s*[:=]?\s*)?(\S+)$", re.IGNORECASE)


def parse_score(stdout: str) -> float | None:
    """The score a program printed, or None.

    Rule: the **last non-empty line** of stdout, stripped, must be a finite float, optionally
    prefixed by ``score`` (any case) and ``:`` or ``=`` — ``0.75``, ``SCORE: 0.75``, ``score=1e-3``.
    ``nan``/``inf`` and anything else (``hello``, ``0.5 points``) give None: a program that printed
    its score and then more output has not followed the protocol.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    m = _SCORE_LINE.match(lines[-1])
    if m is None:
        return None
    try:
        value = float(m.group(1))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------- the child side

# Runs in the child before the program: limits, audit hook, a fresh ``__main__``, then exec.
# Kept free of the parent's imports; every name the hook needs is bound before it is installed.
_BOOTSTRAP = r"""
import builtins, os, resource, sys, types

FORBIDDEN_EXIT, MEMORY_EXIT = @FORBIDDEN_EXIT@, @MEMORY_EXIT@


def set_limit(kind, soft, hard):
    cur_hard = resource.getrlimit(kind)[1]
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def install_hook(status_fd):
    root = os.path.realpath(os.getcwd())
    prefix = root.rstrip(os.sep) + os.sep
    me = os.getpid()
    realpath, fspath, fsdecode, write = os.path.realpath, os.fspath, os.fsdecode, os.write
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    devices = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
    path_args = {
        "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
        "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
        "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
    }
    processes = frozenset({
        "subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
        "os.forkpty", "os.startfile", "pty.spawn",
    })
    network = frozenset({
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.sethostname",
    })
    limits = frozenset({"resource.setrlimit", "resource.prlimit"})
    state = {"violated": False}

    def inside(path):
        if path is None or isinstance(path, int):
            return True  # an already-open descriptor: its opening was checked
        try:
            text = fsdecode(fspath(path))
        except TypeError:
            return False
        if text in devices:
            return True
        real = realpath(text)
        return real == root or real.startswith(prefix)

    def refuse(event, why):
        if not state["violated"]:
            state["violated"] = True
            try:
                write(status_fd, f"forbidden\t{event}: {why}\n".encode("utf-8", "replace")[:2000])
            except OSError:
                pass
        raise PermissionError(f"sandbox refused {event}: {why}")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            if writing and not inside(path):
                refuse(event, f"write to {path!r} outside the working directory")
        elif event in path_args:
            for i in path_args[event]:
                if not inside(args[i]):
                    refuse(event, f"{args[i]!r} is outside the working directory")
        elif event in processes:
            refuse(event, "child processes are not allowed")
        elif event in network:
            refuse(event, "network access is not allowed")
        elif event in limits:
            refuse(event, "resource limits are fixed")
        elif event in ("os.kill", "os.killpg") and args[0] not in (0, me, -me):
            refuse(event, "signals to other processes are not allowed")
        elif event == "sqlite3.connect":
            db = args[0]
            if isinstance(db, str) and db.startswith("file:"):
                db = db[5:].split("?", 1)[0]
            if db not in (":memory:", "", b":memory:", b"") and not inside(db):
                refuse(event, f"database {args[0]!r} outside the working directory")

    sys.addaudithook(hook)
    return state


def flush_and_exit(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def main():
    program, status_fd = sys.argv[1], int(sys.argv[2])
    cpu_s, as_bytes, fsize_bytes = (int(a) for a in sys.argv[3:6])
    set_limit(resource.RLIMIT_CORE, 0, 0)
    set_limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
    set_limit(resource.RLIMIT_AS, as_bytes, as_bytes)
    set_limit(resource.RLIMIT_FSIZE, fsize_bytes, fsize_bytes)
    state = install_hook(status_fd)
    module = types.ModuleType("__main__")
    module.__file__ = program
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [program]
    out_of_memory = False
    try:
        with open(program, encoding="utf-8") as f:
            code = compile(f.read(), program, "exec")
        exec(code, module.__dict__)
    except MemoryError:
        out_of_memory = True  # handled below, once the traceback's frames are released
    finally:
        if state["violated"]:
            flush_and_exit(FORBIDDEN_EXIT)
    if out_of_memory:
        module.__dict__.clear()
        try:
            os.write(status_fd, b"memory\tMemoryError\n")
            os.write(2, b"MemoryError\n")
        except OSError:
            pass
        flush_and_exit(MEMORY_EXIT)


main()
""".replace("@FORBIDDEN_EXIT@", str(FORBIDDEN_EXIT)).replace("@MEMORY_EXIT@", str(MEMORY_EXIT))


def child_env(workdir: str) -> dict[str, str]:
    """The whole environment a program sees: nothing inherited from the trainer.

    ``PYTHONHASHSEED`` is deliberately absent: ``-I`` makes the child ignore every ``PYTHON*``
    variable, so it would only suggest a determinism that is not there (string hashing, hence
    set iteration order, stays randomised per run). ``MALLOC_ARENA_MAX`` keeps glibc from
    reserving 64 MiB of address space per thread, which ``RLIMIT_AS`` would count.
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


def _command(python: str, site_packages: bool, program: str, status_fd: int, limits: SandboxLimits) -> list[str]:
    """The child's argv; a stronger isolation layer (bwrap, nsjail) would be prefixed here."""
    flags = ["-I", "-B", "-X", "utf8"] + ([] if site_packages else ["-S"])
    mb = 1024 * 1024
    return [
        python,
        *flags,
        "-c",
        _BOOTSTRAP,
        program,
        str(status_fd),
        str(int(limits.cpu_s)),
        str(int(limits.memory_mb) * mb),
        str(int(limits.file_size_mb) * mb),
    ]


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


def _read_status(path: str) -> dict[str, str]:
    """The bootstrap's out-of-band reports (``kind<TAB>detail`` lines), first of each kind."""
    status: dict[str, str] = {}
    for line in _tail(path, 16384).splitlines():
        kind, _, detail = line.partition("\t")
        status.setdefault(kind, detail[:_DETAIL_CHARS])
    return status


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


@dataclass(frozen=True)
class _Outcome:
    """What the parent observed about one finished (reaped) program."""

    returncode: int
    wall_timeout: bool
    cpu_time_s: float
    status: dict[str, str]
    stdout: str
    stderr: str


def _classify(o: _Outcome, limits: SandboxLimits, score_range: tuple[float, float] | None) -> ExecutionResult:
    """Map an outcome to a reason, in the precedence documented in the module docstring."""
    rc, err_line = o.returncode, _last_line(o.stderr)
    if "forbidden" in o.status or rc == FORBIDDEN_EXIT:
        detail = o.status.get("forbidden") or err_line or f"refused operation (exit status {FORBIDDEN_EXIT})"
        return ExecutionResult(0.0, "forbidden", detail)
    if o.wall_timeout:
        return ExecutionResult(0.0, "timeout", f"wall-clock limit of {limits.timeout_s:g} s exceeded")
    cpu_hit = rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and o.cpu_time_s >= limits.cpu_s - 0.05)
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
    score = parse_score(o.stdout)
    if score is None:
        last = _last_line(o.stdout)
        return ExecutionResult(
            0.0, "no_score", f"last stdout line {last!r} is not a finite score" if last else "no output"
        )
    if score_range is not None:
        score = min(max(score, score_range[0]), score_range[1])
    return ExecutionResult(float(score), "ok")


def _execute(
    code: str, limits: SandboxLimits, python: str, site_packages: bool, score_range: tuple[float, float] | None
) -> ExecutionResult:
    """Run one program in a fresh process and directory; always kills its group and reaps it."""
    with tempfile.TemporaryDirectory(prefix="popgrpo-sandbox-", ignore_cleanup_errors=True) as base:
        work = os.path.join(base, "work")
        os.mkdir(work, 0o700)
        paths = {name: os.path.join(base, name) for name in ("program.py", "stdout", "stderr", "status")}
        with open(paths["program.py"], "w", encoding="utf-8") as f:
            f.write(code)
        with (
            open(paths["stdout"], "wb") as out,
            open(paths["stderr"], "wb") as err,
            open(paths["status"], "wb") as status,
        ):
            proc = subprocess.Popen(
                _command(python, site_packages, paths["program.py"], status.fileno(), limits),
                cwd=work,
                env=child_env(work),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(status.fileno(),),
                start_new_session=True,
            )
        exited = False
        try:
            exited = _wait_for_exit(proc.pid, limits.timeout_s)
        finally:
            _kill_group(proc.pid)  # the unreaped leader keeps the pgid from being reused
            _, wait_status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(wait_status)
        outcome = _Outcome(
            returncode=proc.returncode,
            wall_timeout=not exited,
            cpu_time_s=usage.ru_utime + usage.ru_stime,
            status=_read_status(paths["status"]),
            stdout=_tail(paths["stdout"], limits.max_output_bytes),
            stderr=_tail(paths["stderr"], _STDERR_TAIL_BYTES),
        )
    return _classify(outcome, limits, score_range)


class Sandbox:
    """Runs programs, each in its own limited process, on a thread pool.

    Threads are enough for parallelism: each worker only waits on its child (no GIL held). The
    pool bounds how many programs run at once (``max_workers``, default ``os.cpu_count()``);
    every method may be called from several threads. ``site_packages=False`` adds ``-S``: the
    program then sees only the standard library, and the interpreter starts several times faster.
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),  # frozen, so sharing the default is safe
        max_workers: int | None = None,
        python: str = sys.executable,
        score_range: tuple[float, float] | None = None,
        *,
        site_packages: bool = True,
    ) -> None:
        if score_range is not None and not score_range[0] <= score_range[1]:
            raise ValueError(f"score_range must be (low, high) with low <= high, got {score_range}")
        self.limits = limits
        self.python = python
        self.score_range = score_range
        self.site_packages = site_packages
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
        pending = [i for i, c in enumerate(codes) if c is not None]
        if not pending:
            batch.set_result(results)  # type: ignore[arg-type]
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
                            batch.set_result(results)  # type: ignore[arg-type]
                except (InvalidStateError, CancelledError):
                    pass  # the batch already failed or was cancelled by the caller

        run = functools.partial(
            _execute,
            limits=self.limits,
            python=self.python,
            site_packages=self.site_packages,
            score_range=self.score_range,
        )
        items = [self._pool.submit(run, codes[i]) for i in pending]
        batch.add_done_callback(lambda b: [f.cancel() for f in items] if b.cancelled() else None)
        for index, fut in zip(pending, items, strict=True):
            fut.add_done_callback(functools.partial(item_done, index))
        return batch

    def close(self) -> None:
        """Wait for running programs, cancel queued ones, stop the pool. Idempotent."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- the reward

_DEFAULT_SANDBOXES: dict[SandboxLimits, Sandbox] = {}
_DEFAULT_LOCK = threading.Lock()


def _default_sandbox(limits: SandboxLimits) -> Sandbox:
    """One lazily created, shared sandbox per distinct limits (pools are reused across batches)."""
    with _DEFAULT_LOCK:
        if limits not in _DEFAULT_SANDBOXES:
            _DEFAULT_SANDBOXES[limits] = Sandbox(limits)
        return _DEFAULT_SANDBOXES[limits]


def execution_reward(
    completions: Sequence[str], *, sandbox: Sandbox | None = None, **limit_overrides: float
) -> tuple[list[float], list[str]]:
    """Rewards and reasons for a batch of completions: :func:`extract_code` → :meth:`Sandbox.run_many`.

    Without ``sandbox`` a module-level default is created on first use; ``limit_overrides``
    (fields of :class:`SandboxLimits`, e.g. ``timeout_s=2``) select a default with those limits.
    """
    if sandbox is not None and limit_overrides:
        raise TypeError("pass limits to the Sandbox you give, not to execution_reward")
    if sandbox is None:
        sandbox = _default_sandbox(replace(SandboxLimits(), **limit_overrides))
    results = sandbox.run_many([extract_code(c) for c in completions])
    return [r.score for r in results], [r.reason for r in results]
