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
* **limits**, set by the bootstrap before the program runs: ``RLIMIT_CPU`` (``cpu_s``; its
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
* ``python -I -B -X utf8 -c BOOTSTRAP``: isolated mode, no ``.pyc`` writes; a scrubbed
  environment (:func:`child_env`); ``start_new_session=True``, so the group is killed as a
  whole when the run ends and the leader is reaped.

**The score** is the program's global ``score`` when it runs to its end. Printed output is not
a score. The parent draws a nonce per run and passes it, with the program's source, on an
anonymous in-memory file that the bootstrap reads and closes before the program starts. The
nonce then lives only in the audit hook's closure. After ``exec`` returns, the bootstrap reads
``score`` (exact ``int``/``float`` only, never calling the program's methods) and raises the
``popgrpo.score`` audit event. The hook accepts that event only from the bootstrap's own
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
refused allocation into ``MemoryError`` (the usual path, caught by the bootstrap), but the limit
also counts what is reserved and never touched: glibc malloc arenas (hence
``MALLOC_ARENA_MAX=2``), numpy/OpenBLAS buffers; a CUDA context would not fit at all. Set
``memory_mb`` with headroom for the libraries the programs import (``import numpy`` fits in
256 MiB). A C extension may abort instead of raising; that is caught through its stderr message.

Reasons (:data:`REASONS`) and how each is detected, first match wins (:func:`_classify`):

``forbidden``     the hook recorded a violation in the status file (or the bootstrap exited 86);
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

__all__ = [
    "ISOLATIONS",
    "REASONS",
    "ExecutionResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailable",
    "bwrap_problem",
    "child_env",
    "extract_code",
    "score_completions",
    "seccomp_program",
]

REASONS = ("ok", "timeout", "memory", "crash", "forbidden", "leftover", "no_score", "out_of_range", "no_code")

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

# Runs in the child before the program: limits, audit hook, a fresh ``__main__``, then exec.
# Kept free of the parent's imports; every name the hook needs is bound before it is installed,
# and the hook never calls anything the program could have replaced or subclassed (it checks
# exact types), so no program code ever runs inside the hook, where the nonce lives.
_BOOTSTRAP = r"""
import builtins, os, resource, sys, types

FORBIDDEN_EXIT, MEMORY_EXIT = @FORBIDDEN_EXIT@, @MEMORY_EXIT@


def set_limit(kind, soft, hard):
    cur_hard = resource.getrlimit(kind)[1]
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def install_hook(status_fd, nonce, contain):
    root = os.path.realpath(os.getcwd())
    prefix = root.rstrip(os.sep) + os.sep
    me = os.getpid()
    realpath, fsdecode, write, getframe = os.path.realpath, os.fsdecode, os.write, sys._getframe
    _str, _bytes, _int, _float, _type, _repr = str, bytes, int, float, type, repr
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    devices = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
    path_args = {
        "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
        "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
        "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
        "os.chdir": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
    }
    processes = frozenset({
        "subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
        "os.forkpty", "os.startfile", "pty.spawn", "_posixsubprocess.fork_exec", "_thread.start_new_thread",
    })
    network = frozenset({
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.sethostname",
    })
    limits = frozenset({"resource.setrlimit", "resource.prlimit"})
    # What would reach the interpreter's objects behind the program's back: every object (gc),
    # other frames' code and locals from a trace or profile function, raw memory (ctypes).
    introspection = frozenset({
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
        "sys._current_frames", "sys._current_exceptions", "sys.monitoring.register_callback",
        "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.string_at", "ctypes.wstring_at", "ctypes.cdata",
        "ctypes.cdata/buffer", "ctypes.call_function", "cpython.PyInterpreterState_New",
        "cpython._PySys_ClearAuditHooks",
    })
    # Interpreters without this hook, and modules whose job is to poke at interpreter internals.
    modules = frozenset({"_xxsubinterpreters", "_interpreters", "_xxinterpchannels", "_testcapi",
                         "_testinternalcapi", "_testmultiphase", "_testsinglephase", "_ctypes_test"})
    state = {"violated": False, "frame": None, "scored": False}

    # pathlib's paths, read through the slot their text is cached in (set by os.fspath before the
    # audit event), so that nothing the program may have overridden runs here.
    import pathlib
    path_types = (pathlib.PosixPath, pathlib.PurePosixPath)
    path_class_dict = pathlib.PurePath.__dict__  # a live view: later patches of the class show in it
    path_fspath = path_class_dict.get("__fspath__")
    path_text = path_class_dict["_str"].__get__ if "_str" in path_class_dict else None

    def text_of(path):
        t = _type(path)
        if t is _str:
            return path
        if t is _bytes:
            return fsdecode(path)
        if (t is path_types[0] or t is path_types[1]) and path_text is not None and (
            path_class_dict.get("__fspath__") is path_fspath
        ):
            try:
                text = path_text(path)
            except AttributeError:
                return None
            return text if _type(text) is _str else None
        return None  # a str/bytes subclass or another path object: its methods are the program's code

    def inside(path):
        if path is None or _type(path) is _int:
            return True  # an already-open descriptor: its opening was checked
        text = text_of(path)
        if text is None:
            return False
        if text in devices:
            return True
        real = realpath(text)
        return real == root or real.startswith(prefix)

    def under_proc(path):
        text = text_of(path)
        if text is None:
            return _type(path) is not _int
        real = realpath(text)
        return real == "/proc" or real.startswith("/proc/")

    def refuse(event, why):
        if not state["violated"]:
            state["violated"] = True
            try:
                write(status_fd, ("forbidden\t" + event + ": " + why + "\n").encode("utf-8", "replace")[:2000])
            except OSError:
                pass
        raise PermissionError("sandbox refused " + event + ": " + why)

    def report(value):
        # Only the bootstrap's own frame, registered before the program ran, may report, once.
        if state["scored"] or getframe(2) is not state["frame"]:
            refuse("popgrpo.score", "only the sandbox reports a score")
        state["scored"] = True
        write(status_fd, ("score\t" + nonce + "\t" + _float.hex(value) + "\n").encode())

    def hook(event, args):
        if event[:8] == "popgrpo.":
            if event == "popgrpo.begin":
                if state["frame"] is not None:
                    refuse(event, "only the sandbox starts a program")
                state["frame"] = getframe(1)
            elif event == "popgrpo.score":
                report(args[0])
            elif event == "popgrpo.violated" and state["violated"]:
                raise PermissionError("violated")
        elif not contain:
            return
        elif event == "open":
            path, mode, flags = args
            writing = (_type(mode) is _str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                _type(flags) is _int and flags & write_flags
            )
            if writing and not inside(path):
                refuse(event, "write to " + _repr(text_of(path)) + " outside the working directory")
            if under_proc(path):
                refuse(event, "reading /proc, or a path of a type the sandbox does not read, is not allowed")
        elif event in path_args:
            for i in path_args[event]:
                if not inside(args[i]):
                    refuse(event, _repr(text_of(args[i])) + " is outside the working directory")
        elif event in processes:
            refuse(event, "child processes and threads are not allowed")
        elif event in network:
            refuse(event, "network access is not allowed")
        elif event in limits:
            refuse(event, "resource limits are fixed")
        elif event in introspection:
            refuse(event, "introspecting the interpreter is not allowed")
        elif event == "import":
            name = args[0]
            if _type(name) is not _str:
                refuse(event, "module names must be str")
            if name in modules:
                refuse(event, "module " + name + " is not allowed")
            if name == "_ctypes" or name == "ctypes":
                # Not a violation (numpy imports ctypes if it can), just unavailable: it reads
                # and writes the interpreter's memory without any audit event.
                raise ImportError("ctypes is not available in the sandbox")
        elif event in ("os.kill", "os.killpg") and args[0] not in (0, me, -me):
            refuse(event, "signals to other processes are not allowed")
        elif event == "sqlite3.connect":
            db = text_of(args[0])
            if db is None:
                refuse(event, "database names must be str, bytes or a pathlib path")
            if db.startswith("file:"):
                db = db[5:].split("?", 1)[0]
            if db not in (":memory:", "") and not inside(db):
                refuse(event, "database " + _repr(db) + " outside the working directory")
        elif event == "sqlite3.enable_load_extension":
            refuse(event, "sqlite extensions are not allowed")

    sys.addaudithook(hook)


def flush_and_exit(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8")


def main():
    program_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
    cpu_s, as_bytes, fsize_bytes, nproc, contain = (int(a) for a in sys.argv[3:8])
    nonce, _, source = read_all(program_fd).partition("\n")
    set_limit(resource.RLIMIT_CORE, 0, 0)
    set_limit(resource.RLIMIT_CPU, cpu_s, cpu_s)  # SIGXCPU stays blocked (below): the kernel's SIGKILL ends it
    set_limit(resource.RLIMIT_AS, as_bytes, as_bytes)
    set_limit(resource.RLIMIT_FSIZE, fsize_bytes, fsize_bytes)
    if nproc > 0:
        set_limit(resource.RLIMIT_NPROC, nproc, nproc)
    # Signals stay blocked for the whole run (the seccomp filter refuses unblocking them), so no
    # handler of the program's can run in between its last statement and the score's report.
    # Faults and abort() stay deliverable: they are synchronous, so never pending past the program.
    signal = __import__("signal")
    synchronous = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS}
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - synchronous)
    del signal, synchronous
    install_hook(status_fd, nonce, contain)
    del nonce  # it lives on only inside the hook, which no program code can reach
    audit, _type, _float, _int, _bool, _write = sys.audit, type, float, int, bool, os.write
    _issubclass, _dict_get, _permission_error = issubclass, dict.get, PermissionError

    def violated():
        try:
            audit("popgrpo.violated")
        except _permission_error:
            return True
        return False

    audit("popgrpo.begin")
    module = types.ModuleType("__main__")
    module.__file__ = "<program>"
    # A copy: patching the builtins module (``import builtins; builtins.abs = ...``) does not
    # change the names the template's own score computation looks up after the code.
    module.__builtins__ = dict(vars(builtins))
    sys.modules["__main__"] = module
    sys.argv = ["<program>"]
    namespace = module.__dict__
    out_of_memory = False
    try:
        code = compile(source, "<program>", "exec")
        del source
        exec(code, namespace)
    except MemoryError:
        out_of_memory = True  # handled below, once the traceback's frames are released
    finally:
        if violated():
            flush_and_exit(FORBIDDEN_EXIT)
    if out_of_memory:
        namespace.clear()
        try:
            _write(status_fd, b"memory\tMemoryError\n")
            _write(2, b"MemoryError\n")
        except OSError:
            pass
        flush_and_exit(MEMORY_EXIT)
    # The program ran to its end: its global ``score`` is the result. Exact types only, so that
    # no method of the program's runs here; int and float subclasses are read through the base.
    value = _dict_get(namespace, "score")
    kind = _type(value)
    if kind is _bool or value is None:
        value = None
    elif _issubclass(kind, _float):
        value = _float.__float__(value)
    elif _issubclass(kind, _int):
        value = _float(_int.__index__(value))
    else:
        value = None
    if value is None:
        _write(status_fd, b"noscore\tthe program ran to its end without a numeric global `score`\n")
    else:
        audit("popgrpo.score", value)
    flush_and_exit(0)


main()
""".replace("@FORBIDDEN_EXIT@", str(FORBIDDEN_EXIT)).replace("@MEMORY_EXIT@", str(MEMORY_EXIT))


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


def _python_command(
    python: str,
    site_packages: bool,
    program_fd: int,
    status_fd: int,
    limits: SandboxLimits,
    nproc: int,
    audit_hook: bool = True,
) -> list[str]:
    """The interpreter's argv: the bootstrap reads the nonce and the program from ``program_fd``.

    ``audit_hook=False`` keeps only the hook's score reporting, not its refusals: the security
    tests use it to check that the kernel layer contains a program on its own.
    """
    flags = ["-I", "-B", "-X", "utf8"] + ([] if site_packages else ["-S"])
    mb = 1024 * 1024
    return [
        python,
        *flags,
        "-c",
        _BOOTSTRAP,
        str(program_fd),
        str(status_fd),
        str(int(limits.cpu_s)),
        str(int(limits.memory_mb) * mb),
        str(int(limits.file_size_mb) * mb),
        str(nproc),
        str(int(audit_hook)),
    ]


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
    ``rt_sigprocmask`` only to block (the bootstrap blocks every signal; see ``_BOOTSTRAP``).
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
    killing bubblewrap kills the program. The host's ``/proc``, ``/home``, ``/root``, ``/etc``
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
    """The bootstrap's out-of-band reports (``kind<TAB>detail`` lines), first of each kind.

    A ``score`` line counts only with this run's nonce (``score<TAB>nonce<TAB>float.hex``): the
    program can write to the descriptor too, but it never learns the nonce. ``score`` is kept as
    the float's hex text; lines carrying a wrong nonce are recorded as ``forged``.
    """
    status: dict[str, str] = {}
    for line in _tail(path, 16384).splitlines():
        kind, _, detail = line.partition("\t")
        if kind == "score":
            given, _, value = detail.partition("\t")
            if not secrets.compare_digest(given.encode(), nonce.encode()):
                status.setdefault("forged", "a score line without this run's nonce")
                continue
            detail = value
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
    leftover: int = 0  # processes of the program's session still alive after it exited


def _score_of(status: dict[str, str]) -> float | None:
    try:
        value = float.fromhex(status["score"])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _classify(o: _Outcome, limits: SandboxLimits, score_range: tuple[float, float]) -> ExecutionResult:
    """Map an outcome to a reason, in the precedence documented in the module docstring."""
    rc, err_line = o.returncode, _last_line(o.stderr)
    if "forbidden" in o.status or rc == FORBIDDEN_EXIT:
        detail = o.status.get("forbidden") or err_line or f"refused operation (exit status {FORBIDDEN_EXIT})"
        return ExecutionResult(0.0, "forbidden", detail)
    if o.leftover:
        return ExecutionResult(0.0, "leftover", f"{o.leftover} process(es) still running after the program ended")
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


def _execute(
    code: str,
    limits: SandboxLimits,
    python: str,
    site_packages: bool,
    score_range: tuple[float, float],
    isolation: str,
    audit_hook: bool = True,
) -> ExecutionResult:
    """Run one program in a fresh process and directory; always kills its group and reaps it."""
    nonce = secrets.token_hex(16)
    bwrap = shutil.which("bwrap") if isolation == "bwrap" else None
    if isolation == "bwrap" and bwrap is None:
        raise SandboxUnavailable("bubblewrap disappeared since the sandbox was created")
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(tempfile.TemporaryDirectory(prefix="popgrpo-sandbox-", ignore_cleanup_errors=True))
        work = os.path.join(base, "work")
        os.mkdir(work, 0o700)
        paths = {name: os.path.join(base, name) for name in ("stdout", "stderr", "status")}
        fds: list[int] = []
        stack.callback(lambda: [os.close(fd) for fd in fds])
        fds.append(_memfd("popgrpo-program", f"{nonce}\n{code}".encode()))
        with (
            open(paths["stdout"], "wb") as out,
            open(paths["stderr"], "wb") as err,
            open(paths["status"], "wb") as status,
        ):
            python_cmd = _python_command(
                python, site_packages, fds[0], status.fileno(), limits, nproc=1 if bwrap else 0, audit_hook=audit_hook
            )
            if bwrap:
                fds.append(_memfd("popgrpo-seccomp", seccomp_program()))
                cmd = [*_bwrap_command(bwrap, work, fds[1], _interpreter_roots(python, site_packages)), *python_cmd]
                env, cwd = child_env(SANDBOX_WORKDIR), None
            else:
                cmd, env, cwd = python_cmd, child_env(work), work
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(status.fileno(), *fds),
                start_new_session=True,
            )
        for fd in fds:
            os.close(fd)
        fds.clear()
        exited, leftover = False, 0
        try:
            exited = _wait_for_exit(proc.pid, limits.timeout_s)
            if exited and not bwrap:
                # Under bubblewrap nothing can be left: the program is its pid namespace's init,
                # whose exit kills the namespace, and it cannot create processes. Without it, look
                # (the exited leader is an unreaped zombie; a scan of /proc costs tens of ms here).
                leftover = _session_members(proc.pid)
        finally:
            if bwrap and not exited:
                _kill_below_leader(proc.pid)
            _kill_group(proc.pid)  # the unreaped leader keeps the pgid from being reused
            _, wait_status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(wait_status)
            if not exited or leftover:
                _wait_session_gone(proc.pid)  # under bwrap the program is a grandchild, killed with its group
        returncode = proc.returncode
        if bwrap and 128 < returncode < 128 + signal.NSIG:
            returncode = -(returncode - 128)  # bubblewrap reports a signal as 128 + its number
        outcome = _Outcome(
            returncode=returncode,
            wall_timeout=not exited,
            cpu_time_s=usage.ru_utime + usage.ru_stime,
            status=_read_status(paths["status"], nonce),
            stdout=_tail(paths["stdout"], limits.max_output_bytes),
            stderr=_tail(paths["stderr"], _STDERR_TAIL_BYTES),
            leftover=leftover,
        )
    return _classify(outcome, limits, score_range)


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
    report; anything outside scores 0 with reason ``out_of_range``.
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

        run = functools.partial(
            _execute,
            limits=self.limits,
            python=self.python,
            site_packages=self.site_packages,
            score_range=self.score_range,
            isolation=self.isolation,
            audit_hook=self._audit_hook,
        )
        items = [self._pool.submit(run, code) for _, code in pending]
        batch.add_done_callback(lambda b: [f.cancel() for f in items] if b.cancelled() else None)
        for (index, _), fut in zip(pending, items, strict=True):
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


def score_completions(
    completions: Sequence[str], *, sandbox: Sandbox | None = None, **limit_overrides: float
) -> tuple[list[float], list[str]]:
    """Rewards and reasons for a batch of completions: :func:`extract_code` → :meth:`Sandbox.run_many`.

    Without ``sandbox`` a module-level default is created on first use; ``limit_overrides``
    (fields of :class:`SandboxLimits`, e.g. ``timeout_s=2``) select a default with those limits.
    """
    if sandbox is not None and limit_overrides:
        raise TypeError("pass limits to the Sandbox you give, not to score_completions")
    if sandbox is None:
        sandbox = _default_sandbox(replace(SandboxLimits(), **limit_overrides))
    results = sandbox.run_many([extract_code(c) for c in completions])
    return [r.score for r in results], [r.reason for r in results]
