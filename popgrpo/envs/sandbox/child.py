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
   of file. A warm pool (:mod:`popgrpo.envs.sandbox.pool`) keeps children waiting here for as
   long as it needs; the one-shot path writes it at once. End of file before any program (the
   trainer closed the pool, or died) ends the child quietly with :data:`NO_PROGRAM_EXIT`.

Then the audit hook is installed with the nonce (:func:`install_hook`), the program runs in a
fresh ``__main__`` with its own copy of the builtins, and its global ``score`` is reported on the
status descriptor as ``score<TAB>nonce<TAB>float.hex`` (:func:`run_program`). A payload whose source
starts with :data:`TESTS_MARK` is a test run instead: a problem's program and tests as JSON,
run by the harness (:func:`run_tests`), which reports each test's outcome, tagged under the
nonce, rather than a score (:mod:`popgrpo.envs.harness`). The nonce lives only
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
    "TESTS_MARK",
    "install_hook",
    "main",
    "parse_limits",
    "read_program",
    "run_tests",
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


def install_hook(status_fd: int, nonce: str, contain: bool, harness: bool = False) -> None:
    """Add the audit hook: with ``contain`` it refuses what a program may not do; it always
    keeps the nonce and writes the one score line the template's own frame asks for.

    The first violation is written to the status descriptor *before* ``PermissionError`` is
    raised, so a ``try/except`` in the program cannot hide it. ``contain=False`` (tests of the
    kernel layer alone) keeps only the score reporting.

    With ``harness`` (a test run, :func:`run_tests`) the hook writes the harness's reports
    instead of a score: ``report<TAB>body<TAB>mac`` for each ``popgrpo.report`` event the
    harness's own frame raises, ``mac`` the keyed BLAKE2b of ``body`` under the nonce, so a
    line the program writes, or rewrites in place, is rejected by the trainer. From the moment
    the harness registers its frame, frames are out of the program's reach (``sys._getframe``
    answers ``ValueError``, as it does past the top of the stack, so the standard library's
    callers fall back to their defaults; reading ``tb_frame``, ``gi_frame``, ``cr_frame`` or
    ``ag_frame`` raises ``PermissionError``), and ``sys.addaudithook`` adds no hook: a hook of
    the program's would see the code objects of the tests the harness runs. Neither refusal
    makes the run ``forbidden``: a program gains nothing by trying.
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
    state: dict[str, object] = {"violated": False, "frame": None, "scored": False, "internal": False}
    frame_attributes = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
    _tuple, _len, _value_error, _permission_error, _runtime_error = (
        tuple,
        len,
        ValueError,
        PermissionError,
        RuntimeError,
    )
    report_kinds = frozenset({"program", "test", "done"})
    from _blake2 import blake2b

    mac_key = nonce.encode()

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

    def frame_at(depth: int) -> object:
        # The hook's own frame lookups raise the sys._getframe event too: let those through.
        state["internal"] = True
        try:
            return getframe(depth + 1)
        finally:
            state["internal"] = False

    def report(value: float) -> None:
        # Only the template's own frame, registered before the program ran, may report, once.
        if harness or state["scored"] or frame_at(2) is not state["frame"]:
            refuse("popgrpo.score", "only the sandbox reports a score")
        state["scored"] = True
        write(status_fd, ("score\t" + nonce + "\t" + _float.hex(value) + "\n").encode())

    def harness_report(args: tuple[object, ...]) -> None:
        # (kind, index, verdict, payload), all of exact types, from the harness's own frame.
        if not harness or frame_at(2) is not state["frame"] or _type(args) is not _tuple or _len(args) != 4:
            refuse("popgrpo.report", "only the sandbox's harness reports")
        kind, index, verdict, payload = args
        if _type(kind) is not _str or kind not in report_kinds or _type(index) is not _int:
            refuse("popgrpo.report", "malformed report")
        if _type(verdict) is not _str or _type(payload) is not _str:
            refuse("popgrpo.report", "malformed report")
        if "\n" in payload or "\t" in payload or "\n" in verdict or "\t" in verdict:  # pyright: ignore[reportOperatorIssue]
            verdict, payload = "error", '"unprintable report"'
        body = kind + "\t" + _int.__repr__(index) + "\t" + verdict + "\t" + payload  # pyright: ignore[reportOperatorIssue, reportArgumentType]
        data = body.encode("utf-8", "replace")
        line = b"report\t" + data + b"\t" + blake2b(data, key=mac_key, digest_size=16).hexdigest().encode() + b"\n"
        try:  # noqa: SIM105  # no contextlib here: a module the program can patch
            write(status_fd, line)
        except OSError:
            pass  # a closed or full status file: the trainer counts the test as not reported

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event[:8] == "popgrpo.":
            if event == "popgrpo.begin":
                if state["frame"] is not None:
                    refuse(event, "only the sandbox starts a program")
                state["frame"] = frame_at(1)
            elif event == "popgrpo.report":
                harness_report(args)
            elif event == "popgrpo.score":
                report(args[0])  # pyright: ignore[reportArgumentType]  # run_program passes an exact float
            elif event == "popgrpo.violated" and state["violated"]:
                raise PermissionError("violated")
        elif harness and state["frame"] is not None and not state["internal"] and event == "sys._getframe":
            raise _value_error("call stack is not deep enough")  # what sys._getframe says past the top
        elif harness and event == "object.__getattr__" and args[1] in frame_attributes:
            raise _permission_error("frames are not available to a program under test")
        elif harness and event == "sys.addaudithook":
            raise _runtime_error("the sandbox adds no audit hooks")  # the new hook is silently not added
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


TESTS_MARK = "\x00"
"""A payload whose source starts with this is a test run (:func:`run_tests`), its spec the JSON
after it. No program can begin with it: a NUL byte does not compile."""

_PREIMPORTED = ("math", "re", "collections", "itertools", "functools", "operator", "string", "heapq", "bisect")
"""Modules imported before the program runs, so their state is among what the harness restores
before each assert-based test (a module the program imports first is not)."""


def run_tests(spec: dict[str, object], status_fd: int) -> NoReturn:
    """Run a problem's tests against its program and report each outcome; never returns.

    The hook must be installed with ``harness=True``. ``spec`` (written by
    :mod:`popgrpo.envs.harness`): ``mode`` (``call``, ``stdio`` or ``assert``), ``program``,
    ``entry_point``, ``inputs`` (``call``: each test's arguments as JSON text; ``stdio``: its
    standard input), ``tests`` (``assert``: each test's source), ``setup`` (``assert``: code run
    in each test's namespace first) and ``max_output`` (characters of one test's output).

    The harness, not the program, decides what is reported: each test's verdict comes from the
    harness's control flow and each ``call``/``stdio`` output from an encoding that reads exact
    types only. The expected outputs of ``call`` and ``stdio`` tests never enter the sandbox:
    the trainer compares. Reports go through the hook (``popgrpo.report``), which accepts them
    only from this function's frame. Everything used after the program starts is bound to a
    local first, as in :func:`run_program`.
    """
    audit = sys.audit
    audit("popgrpo.begin")  # registers this frame: from here on only it reports, and frames are closed
    import io

    for name in _PREIMPORTED:
        __import__(name)
    from _json import encode_basestring_ascii as quote

    _type, _int, _float, _str, _bool, _list, _tuple, _dict, _range = (
        type, int, float, str, bool, list, tuple, dict, range,
    )  # fmt: skip
    _set, _frozenset, _none, _id, _len, _callable, _exec, _compile = (
        set, frozenset, type(None), id, len, callable, exec, compile,
    )  # fmt: skip
    _base_exception, _assertion_error, _system_exit, _module_type = (
        BaseException, AssertionError, SystemExit, types.ModuleType,
    )  # fmt: skip
    int_repr, float_repr, str_join, str_startswith = _int.__repr__, _float.__repr__, _str.join, _str.startswith
    dict_get, dict_items, dict_clear, dict_update, dict_keys = (
        _dict.get,
        _dict.items,
        _dict.clear,
        _dict.update,
        _dict.keys,
    )
    list_append, list_copy = _list.append, _list.copy
    type_name = type.__dict__["__name__"].__get__
    sys_module, modules = sys, sys.modules
    dup2, close, lseek, read, memfd, write, finish = (
        os.dup2,
        os.close,
        os.lseek,
        os.read,
        os.memfd_create,
        os.write,
        flush_and_exit,
    )
    text_wrapper, file_io = io.TextIOWrapper, io.FileIO
    import fcntl

    def move_up(fd: int, lowest: int, keep: int) -> int:
        # A copy of ``fd`` numbered ``lowest`` or above; ``fd`` itself is closed unless ``keep``.
        copy = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)
        if not keep:
            close(fd)
        return copy

    mode, program, entry_point = spec["mode"], spec["program"], spec["entry_point"]
    inputs, test_sources, setup = spec["inputs"], spec["tests"], spec["setup"]
    max_output = _int(spec["max_output"])  # pyright: ignore[reportArgumentType]
    n_tests = _len(inputs if mode != "assert" else test_sources)  # pyright: ignore[reportArgumentType]
    del spec

    pristine_builtins = dict(vars(builtins))
    if "exit" not in pristine_builtins:
        # python -S has no site, whose exit() programs often call. sys.exit is the same in C: a
        # function defined here would hand the program this module's globals (its __globals__).
        pristine_builtins["exit"] = pristine_builtins["quit"] = sys.exit
    exception_names = {
        _id(v): k for k, v in pristine_builtins.items() if isinstance(v, type) and issubclass(v, BaseException)
    }

    def describe(error: BaseException) -> str:
        # The builtin exception's name, or "exception": nothing of the program's runs here.
        return quote(dict_get(exception_names, _id(_type(error)), "exception"))

    class _Unsupported(Exception):
        pass

    def encode(value: object, depth: int, budget: list[int]) -> str:
        # JSON of exact builtin types only; sets as {"$set": [...]}, dicts as {"$dict": [[k, v], ...]}.
        kind = _type(value)
        if depth > 64:
            raise _Unsupported("nested deeper than 64")
        if value is None:
            text = "null"
        elif kind is _bool:
            text = "true" if value else "false"
        elif kind is _int:
            text = int_repr(value)  # pyright: ignore[reportArgumentType]  # ValueError past 4300 digits
        elif kind is _float:
            text = float_repr(value)  # pyright: ignore[reportArgumentType]
            if text == "nan":
                text = "NaN"
            elif text == "inf":
                text = "Infinity"
            elif text == "-inf":
                text = "-Infinity"
        elif kind is _str:
            text = quote(value)  # pyright: ignore[reportArgumentType]  # the exact type was checked
        elif kind is _list or kind is _tuple:
            text = "[" + str_join(",", [encode(v, depth + 1, budget) for v in value]) + "]"  # pyright: ignore[reportGeneralTypeIssues]
        elif kind is _set or kind is _frozenset:
            text = '{"$set":[' + str_join(",", [encode(v, depth + 1, budget) for v in value]) + "]}"  # pyright: ignore[reportGeneralTypeIssues]
        elif kind is _dict:
            pairs = [
                "[" + encode(k, depth + 1, budget) + "," + encode(v, depth + 1, budget) + "]"
                for k, v in dict_items(value)  # pyright: ignore[reportArgumentType]
            ]
            text = '{"$dict":[' + str_join(",", pairs) + "]}"
        else:
            raise _Unsupported(type_name(kind))
        budget[0] -= _len(text)
        if budget[0] < 0:
            raise _Unsupported("output longer than " + int_repr(max_output) + " characters")
        return text

    def fresh_namespace() -> dict[str, object]:
        module = _module_type("__main__")
        module.__file__ = "<program>"
        module.__builtins__ = dict(pristine_builtins)  # pyright: ignore[reportAttributeAccessIssue]
        modules["__main__"] = module
        return module.__dict__

    # Decoded and compiled before the program runs: nothing of the program's sees a test's source.
    arguments_list: list[object] = []
    if mode == "call":
        import json

        arguments_list = [json.loads(text) for text in inputs]  # pyright: ignore[reportGeneralTypeIssues]
    compiled_tests = []
    compiled_setup = None
    if mode == "assert":
        try:
            compiled_setup = _compile(setup, "<setup>", "exec") if setup else None  # pyright: ignore[reportArgumentType, reportCallIssue]
            for source in test_sources:  # pyright: ignore[reportGeneralTypeIssues]
                list_append(compiled_tests, _compile(source, "<test>", "exec"))
        except _base_exception as error:
            audit(
                "popgrpo.report", "program", 0, "error", quote("the tests do not compile: " + type_name(_type(error)))
            )
            audit("popgrpo.report", "done", n_tests, "done", '""')
            finish(0)
    try:
        compiled = _compile(program, "<program>", "exec")  # pyright: ignore[reportArgumentType, reportCallIssue]
    except _base_exception as error:
        audit("popgrpo.report", "program", 0, "error", describe(error))
        audit("popgrpo.report", "done", n_tests, "done", '""')
        finish(0)
    del program, test_sources, setup

    # Module state to restore before each assert-based test (the program's own __main__ aside).
    namespace = fresh_namespace()
    snapshot = [
        (vars(m), dict(vars(m))) for k, m in list(modules.items()) if _type(m) is _module_type and k != "__main__"
    ]
    saved_modules = {k: m for k, m in modules.items() if k != "__main__"}
    lists = [
        (sys.meta_path, list_copy(sys.meta_path)),
        (sys.path_hooks, list_copy(sys.path_hooks)),
        (sys.path, list_copy(sys.path)),
    ]
    importer_cache = sys.path_importer_cache
    real_stdout = move_up(1, 10, 1)

    def restore_modules() -> None:
        for live, saved in snapshot:
            dict_clear(live)
            dict_update(live, saved)
        for key in [k for k in dict_keys(modules) if k != "__main__" and k not in saved_modules]:
            del modules[key]
        dict_update(modules, saved_modules)
        for live, saved in lists:
            live[:] = saved
        dict_clear(importer_cache)

    if mode == "stdio":
        for index in _range(n_tests):
            namespace = fresh_namespace()
            # Above the standard descriptors whatever the last test closed (open(0) closes 0).
            stdin_fd = move_up(memfd("popgrpo-stdin"), 10, 0)
            out_fd = move_up(memfd("popgrpo-stdout"), 10, 0)
            data = inputs[index].encode("utf-8")  # pyright: ignore[reportIndexIssue, reportOptionalSubscript]
            view = memoryview(data)
            while view:
                view = view[write(stdin_fd, view) :]
            lseek(stdin_fd, 0, 0)
            dup2(stdin_fd, 0)
            dup2(out_fd, 1)
            close(stdin_fd)
            stdin = text_wrapper(file_io(0, "r", closefd=False), encoding="utf-8")
            stdout = text_wrapper(file_io(1, "w", closefd=False), encoding="utf-8")
            sys_module.stdin, sys_module.stdout = stdin, stdout  # pyright: ignore[reportAttributeAccessIssue]
            verdict = "returned"
            try:
                _exec(compiled, namespace)
            except _system_exit as stop:
                if stop.code is not None and (_type(stop.code) is not _int or stop.code != 0):
                    verdict = "error"
            except _base_exception:
                verdict = "error"
            try:  # noqa: SIM105  # no contextlib here: a module the program can patch
                stdout.flush()
            except _base_exception:
                pass
            dup2(real_stdout, 1)
            size = lseek(out_fd, 0, 2)
            lseek(out_fd, 0, 0)
            output = b""
            if size <= max_output * 4:
                chunks = []
                while True:
                    chunk = read(out_fd, 1 << 16)
                    if not chunk:
                        break
                    list_append(chunks, chunk)
                output = b"".join(chunks)
            close(out_fd)
            text = output.decode("utf-8", "replace")
            if verdict == "returned" and (size > max_output * 4 or _len(text) > max_output):
                verdict, payload = "error", quote("output longer than " + int_repr(max_output) + " characters")
            else:
                payload = quote(text)
            audit("popgrpo.report", "test", index, verdict, payload)
        audit("popgrpo.report", "done", n_tests, "done", '""')
        finish(0)

    try:
        _exec(compiled, namespace)
    except _base_exception as error:
        audit("popgrpo.report", "program", 0, "error", describe(error))
        audit("popgrpo.report", "done", n_tests, "done", '""')
        finish(0)
    audit("popgrpo.report", "program", 0, "ran", '""')

    if mode == "call":
        function = dict_get(namespace, entry_point) if _type(entry_point) is _str else None
        if function is None or not _callable(function):
            audit("popgrpo.report", "program", 1, "error", quote("no function " + _str(entry_point) + " defined"))
            audit("popgrpo.report", "done", n_tests, "done", '""')
            finish(0)
        for index in _range(n_tests):
            arguments, arguments_list[index] = arguments_list[index], None
            try:
                value = function(*arguments)  # pyright: ignore[reportCallIssue, reportOptionalIterable, reportGeneralTypeIssues]
            except _base_exception as error:
                audit("popgrpo.report", "test", index, "error", describe(error))
                continue
            try:
                payload = encode(value, 0, [max_output])
            except _base_exception as error:
                audit(
                    "popgrpo.report",
                    "test",
                    index,
                    "unsupported",
                    quote(_str(error.args[0]) if _type(error) is _Unsupported else "unencodable"),
                )
                continue
            finally:
                value = None
            audit("popgrpo.report", "test", index, "returned", payload)
    else:  # assert
        for index in _range(n_tests):
            restore_modules()
            test_namespace: dict[str, object] = {"__builtins__": dict(pristine_builtins), "__name__": "__test__"}
            for key, value in dict_items(namespace):
                if _type(key) is not _str or str_startswith(key, "__") or key in pristine_builtins:
                    continue
                if _type(value) is _module_type and dict_get(modules, dict_get(vars(value), "__name__")) is not value:
                    continue  # a module the program made or swapped: not the one the test would import
                test_namespace[key] = value
            value = None
            verdict = "passed"
            try:
                if compiled_setup is not None:
                    _exec(compiled_setup, test_namespace)
                _exec(compiled_tests[index], test_namespace)
            except _assertion_error:
                verdict = "failed"
            except _base_exception:
                verdict = "error"
            audit("popgrpo.report", "test", index, verdict, '""')
    audit("popgrpo.report", "done", n_tests, "done", '""')
    finish(0)


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
    if source[:1] == TESTS_MARK:
        spec = json.loads(source[1:])
        del source
        install_hook(status_fd, nonce, bool(limits["contain"]), harness=True)
        del nonce
        run_tests(spec, status_fd)
    install_hook(status_fd, nonce, bool(limits["contain"]))
    del nonce  # it lives on only inside the hook, which no program code can reach
    run_program(source, status_fd)


if __name__ == "__main__":
    main()
