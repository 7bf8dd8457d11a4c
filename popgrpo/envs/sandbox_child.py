"""The sandbox's child: runs inside bubblewrap as ``python -I -B -X utf8 sandbox_child.py CONTROL_FD``.

The trainer (:mod:`popgrpo.envs.sandbox`) starts one interpreter per program with this file as its
script (bound read-only into the sandbox; the package itself is not visible there, so this module
imports nothing but the standard library). Everything the child learns arrives on one pipe, the
control descriptor named by its only argument:

1. **The limits**, one JSON line (:func:`parse_limits`): ``{"status_fd": int, "ready_fd": int,
   "cpu_s": int, "memory_bytes": int, "file_size_bytes": int, "nproc": int, "contain": bool}``.
   The child applies them (:func:`apply_limits`), blocks every asynchronous signal, imports what
   the audit hook needs, writes one byte to ``ready_fd`` and closes it: it is now warm.
2. **The program**, when the trainer has one: the run's nonce, a newline, the source, then end
   of file. A warm pool (:mod:`popgrpo.envs.sandbox_pool`) keeps children waiting here for as
   long as it needs; the one-shot path writes it at once. End of file before any program (the
   trainer closed the pool, or died) ends the child quietly with :data:`NO_PROGRAM_EXIT`.

Then the audit hook is installed with the nonce (:func:`install_hook`), the program runs in a
fresh ``__main__`` with its own copy of the builtins, and its global ``score`` is reported on the
status descriptor as ``score<TAB>nonce<TAB>float.hex`` (:func:`run_program`). The nonce lives only
in the hook's closure while the program runs. Every name the hook uses is bound before it is
installed, and it checks exact types, so no code of the program's ever runs inside the hook.
The threat model, the reasons and how the trainer reads them are in :mod:`popgrpo.envs.sandbox`.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:  # the annotations only; the child imports as little as it can
    from typing import NoReturn

__all__ = [
    "FORBIDDEN_EXIT",
    "LIMIT_FIELDS",
    "MEMORY_EXIT",
    "NO_PROGRAM_EXIT",
    "install_hook",
    "main",
    "parse_limits",
    "read_program",
    "split_header",
]

FORBIDDEN_EXIT = 86
"""Exit status when the program did something the hook refused."""
MEMORY_EXIT = 87
"""Exit status when ``MemoryError`` reached the top level."""
NO_PROGRAM_EXIT = 88
"""Exit status when the control pipe closed before a program arrived (nothing ran)."""

LIMIT_FIELDS: dict[str, type] = {
    "status_fd": int,
    "ready_fd": int,
    "cpu_s": int,
    "memory_bytes": int,
    "file_size_bytes": int,
    "nproc": int,
    "contain": bool,
}
"""The keys of the limits message and their exact types (``nproc`` 0: leave RLIMIT_NPROC alone)."""

_READ_CHUNK = 1 << 16
_MAX_HEADER_BYTES = 4096


def parse_limits(line: bytes) -> dict[str, int | bool]:
    """The limits message (one JSON object, see the module docstring) → a validated dict.

    Raises ``ValueError`` on anything but exactly :data:`LIMIT_FIELDS` with their exact types
    (``bool`` is not an ``int`` here), non-negative numbers and positive limits.
    """
    message = json.loads(line.decode("utf-8"))
    if type(message) is not dict:
        raise ValueError("the limits message must be a JSON object")
    if set(message) != set(LIMIT_FIELDS):
        raise ValueError(f"the limits message has keys {sorted(message)}, expected {sorted(LIMIT_FIELDS)}")
    for key, kind in LIMIT_FIELDS.items():
        if type(message[key]) is not kind:
            raise ValueError(f"limit {key} must be {kind.__name__}, got {message[key]!r}")
        if kind is int and message[key] < 0:
            raise ValueError(f"limit {key} must not be negative, got {message[key]}")
    for key in ("cpu_s", "memory_bytes", "file_size_bytes"):
        if message[key] == 0:
            raise ValueError(f"limit {key} must be positive")
    return message


def split_header(fd: int) -> tuple[bytes, bytes] | None:
    """Read ``fd`` up to the first newline: (the header line, the bytes read after it).

    None when the pipe closes first. The header is short; more than ``_MAX_HEADER_BYTES``
    without a newline is refused with ``ValueError``.
    """
    buffer = b""
    while b"\n" not in buffer:
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            return None
        buffer += chunk
        if len(buffer) > _MAX_HEADER_BYTES and b"\n" not in buffer[:_MAX_HEADER_BYTES]:
            raise ValueError("the limits message is too long")
    line, _, rest = buffer.partition(b"\n")
    return line, rest


def read_program(fd: int, already: bytes = b"") -> tuple[str, str] | None:
    """Read ``fd`` to its end and close it: (nonce, source), or None when nothing came.

    The payload is ``nonce\\nsource`` in UTF-8 (:mod:`popgrpo.envs.sandbox` writes it).
    """
    chunks = [already]
    while True:
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    payload = b"".join(chunks)
    if not payload:
        return None
    nonce, _, source = payload.decode("utf-8").partition("\n")
    return nonce, source


def set_limit(kind: int, soft: int, hard: int) -> None:
    """``setrlimit`` that never asks for more than the current hard limit (which would fail)."""
    cur_hard = resource.getrlimit(kind)[1]
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def apply_limits(limits: dict[str, int | bool]) -> None:
    """No core files; CPU, address-space and file-size limits; RLIMIT_NPROC when ``nproc`` > 0.

    RLIMIT_CPU has soft = hard: ``SIGXCPU`` stays blocked (:func:`block_signals`), so the kernel's
    ``SIGKILL`` at the same limit ends the program.
    """
    set_limit(resource.RLIMIT_CORE, 0, 0)
    cpu_s, memory, fsize, nproc = (int(limits[k]) for k in ("cpu_s", "memory_bytes", "file_size_bytes", "nproc"))
    set_limit(resource.RLIMIT_CPU, cpu_s, cpu_s)
    set_limit(resource.RLIMIT_AS, memory, memory)
    set_limit(resource.RLIMIT_FSIZE, fsize, fsize)
    if nproc > 0:
        set_limit(resource.RLIMIT_NPROC, nproc, nproc)


def block_signals() -> None:
    """Block every signal but the synchronous faults, for the rest of the child's life.

    The seccomp filter refuses unblocking them, so no handler of the program's can run between
    its last statement and the score's report. Faults and ``abort()`` stay deliverable: they are
    synchronous, so never pending past the program.
    """
    import signal

    synchronous = {
        signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
    }  # fmt: skip
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - synchronous)


def install_hook(status_fd: int, nonce: str, contain: bool) -> None:
    """Add the audit hook: with ``contain`` it refuses what a program may not do; it always
    keeps the nonce and writes the one score line the template's own frame asks for.

    The first violation is written to the status descriptor *before* ``PermissionError`` is
    raised, so a ``try/except`` in the program cannot hide it. ``contain=False`` (tests of the
    kernel layer alone) keeps only the score reporting.
    """
    root = os.path.realpath(os.getcwd())
    prefix = root.rstrip(os.sep) + os.sep
    me = os.getpid()
    realpath, fsdecode, write, getframe = os.path.realpath, os.fsdecode, os.write, sys._getframe  # pyright: ignore[reportPrivateUsage]
    _str, _bytes, _int, _float, _type, _repr = str, bytes, int, float, type, repr
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    devices = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
    path_args: dict[str, tuple[int, ...]] = {
        "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
        "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
        "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
        "os.chdir": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
    }  # fmt: skip
    processes = frozenset({
        "subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
        "os.forkpty", "os.startfile", "pty.spawn", "_posixsubprocess.fork_exec", "_thread.start_new_thread",
    })  # fmt: skip
    network = frozenset({
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.sethostname",
    })  # fmt: skip
    limits = frozenset({"resource.setrlimit", "resource.prlimit"})
    # What would reach the interpreter's objects behind the program's back: every object (gc),
    # other frames' code and locals from a trace or profile function, raw memory (ctypes).
    introspection = frozenset({
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
        "sys._current_frames", "sys._current_exceptions", "sys.monitoring.register_callback",
        "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.string_at", "ctypes.wstring_at", "ctypes.cdata",
        "ctypes.cdata/buffer", "ctypes.call_function", "cpython.PyInterpreterState_New",
        "cpython._PySys_ClearAuditHooks",
    })  # fmt: skip
    # Interpreters without this hook, and modules whose job is to poke at interpreter internals.
    modules = frozenset({
        "_xxsubinterpreters", "_interpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi",
        "_testmultiphase", "_testsinglephase", "_ctypes_test",
    })  # fmt: skip
    state: dict[str, object] = {"violated": False, "frame": None, "scored": False}

    # pathlib's paths, read through the slot their text is cached in (set by os.fspath before the
    # audit event), so that nothing the program may have overridden runs here.
    import pathlib

    path_types = (pathlib.PosixPath, pathlib.PurePosixPath)
    path_class_dict = pathlib.PurePath.__dict__  # a live view: later patches of the class show in it
    path_fspath = path_class_dict.get("__fspath__")
    path_text = path_class_dict["_str"].__get__ if "_str" in path_class_dict else None

    def text_of(path: object) -> str | None:
        t = _type(path)
        if t is _str:
            return path  # pyright: ignore[reportReturnType]  # the exact type was checked
        if t is _bytes:
            return fsdecode(path)  # pyright: ignore[reportArgumentType]
        if (
            (t is path_types[0] or t is path_types[1])
            and path_text is not None
            and (path_class_dict.get("__fspath__") is path_fspath)
        ):
            try:
                text = path_text(path)
            except AttributeError:
                return None
            return text if _type(text) is _str else None
        return None  # a str/bytes subclass or another path object: its methods are the program's code

    def inside(path: object) -> bool:
        if path is None or _type(path) is _int:
            return True  # an already-open descriptor: its opening was checked
        text = text_of(path)
        if text is None:
            return False
        if text in devices:
            return True
        real = realpath(text)
        return real == root or real.startswith(prefix)

    def under_proc(path: object) -> bool:
        text = text_of(path)
        if text is None:
            return _type(path) is not _int
        real = realpath(text)
        return real == "/proc" or real.startswith("/proc/")

    def refuse(event: str, why: str) -> NoReturn:
        if not state["violated"]:
            state["violated"] = True
            try:  # noqa: SIM105  # no contextlib here: a module the program can patch
                write(status_fd, ("forbidden\t" + event + ": " + why + "\n").encode("utf-8", "replace")[:2000])
            except OSError:
                pass
        raise PermissionError("sandbox refused " + event + ": " + why)

    def report(value: float) -> None:
        # Only the template's own frame, registered before the program ran, may report, once.
        if state["scored"] or getframe(2) is not state["frame"]:
            refuse("popgrpo.score", "only the sandbox reports a score")
        state["scored"] = True
        write(status_fd, ("score\t" + nonce + "\t" + _float.hex(value) + "\n").encode())

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event[:8] == "popgrpo.":
            if event == "popgrpo.begin":
                if state["frame"] is not None:
                    refuse(event, "only the sandbox starts a program")
                state["frame"] = getframe(1)
            elif event == "popgrpo.score":
                report(args[0])  # pyright: ignore[reportArgumentType]  # run_program passes an exact float
            elif event == "popgrpo.violated" and state["violated"]:
                raise PermissionError("violated")
        elif not contain:
            return
        elif event == "open":
            path, mode, flags = args
            writing = (_type(mode) is _str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (  # pyright: ignore[reportOperatorIssue]
                _type(flags) is _int and flags & write_flags  # pyright: ignore[reportOperatorIssue]
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
                refuse(event, "module " + name + " is not allowed")  # pyright: ignore[reportOperatorIssue]
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


def flush_and_exit(code: int) -> NoReturn:
    """Flush the standard streams (they may be broken: ignored) and leave at once."""
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  # no contextlib here: a module the program can patch
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def run_program(source: str, status_fd: int) -> NoReturn:
    """Run ``source`` as a fresh ``__main__`` and report its global ``score``; never returns.

    The hook must be installed. Everything used after the program starts is bound to a local
    first: the program can reach this module's globals through its frames, not these locals.
    """
    audit, _type, _float, _int, _bool, _write = sys.audit, type, float, int, bool, os.write
    _issubclass, _dict_get, _permission_error, _exit = issubclass, dict.get, PermissionError, flush_and_exit
    forbidden_exit, memory_exit = FORBIDDEN_EXIT, MEMORY_EXIT

    def violated() -> bool:
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
    module.__builtins__ = dict(vars(builtins))  # pyright: ignore[reportAttributeAccessIssue]
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
            _exit(forbidden_exit)
    if out_of_memory:
        namespace.clear()
        try:
            _write(status_fd, b"memory\tMemoryError\n")
            _write(2, b"MemoryError\n")
        except OSError:
            pass
        _exit(memory_exit)
    # The program ran to its end: its global ``score`` is the result. Exact types only, so that
    # no method of the program's runs here; int and float subclasses are read through the base.
    value = _dict_get(namespace, "score")
    kind = _type(value)
    if kind is _bool or value is None:
        value = None
    elif _issubclass(kind, _float):
        value = _float.__float__(value)  # pyright: ignore[reportArgumentType]
    elif _issubclass(kind, _int):
        value = _float(_int.__index__(value))  # pyright: ignore[reportArgumentType]
    else:
        value = None
    if value is None:
        _write(status_fd, b"noscore\tthe program ran to its end without a numeric global `score`\n")
    else:
        audit("popgrpo.score", value)
    _exit(0)


def main(argv: list[str] | None = None) -> NoReturn:
    """Read the limits, get warm, wait for the program, run it (see the module docstring)."""
    control_fd = int((sys.argv if argv is None else argv)[1])
    header = split_header(control_fd)
    if header is None:
        os._exit(NO_PROGRAM_EXIT)
    line, rest = header
    del header  # with the one-shot path ``rest`` may already hold the nonce: no reference may stay here
    limits = parse_limits(line)
    status_fd, ready_fd = int(limits["status_fd"]), int(limits["ready_fd"])
    apply_limits(limits)
    block_signals()
    import pathlib  # noqa: F401  # the hook's; imported while warming up, not on the program's clock

    try:  # noqa: SIM105  # contextlib is not imported in the child
        os.write(ready_fd, b"r")  # the one-shot path does not listen: its end may be closed
    except OSError:
        pass
    os.close(ready_fd)
    program = read_program(control_fd, rest)
    del rest
    if program is None:
        os._exit(NO_PROGRAM_EXIT)
    nonce, source = program
    del program
    install_hook(status_fd, nonce, bool(limits["contain"]))
    del nonce  # it lives on only inside the hook, which no program code can reach
    run_program(source, status_fd)


if __name__ == "__main__":
    main()
