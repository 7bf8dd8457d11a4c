"""Execution reward: run model-written Python in a fresh, isolated process and take its score.

A policy proposes completions containing a fenced Python block; :func:`extract_code` takes the
last one and :class:`Sandbox` runs it. RL optimises against whatever the reward lets through, so
this package treats every program as an attacker's: it is a security boundary. Each program
runs in its **own** new interpreter, in layers:

* **bubblewrap** (``isolation="bwrap"``, the default; :func:`~popgrpo.envs.sandbox.bwrap.bwrap_command`):
  ``--unshare-all --die-with-parent --as-pid-1``, uid/gid 65534 in a new user namespace, a new
  root holding only ``/usr``, the interpreter's prefix (and virtualenv) read-only, a private
  ``/dev`` and ``/tmp``, no ``/proc`` at all (not even its own: ``/proc/self/mem`` would read
  the interpreter's memory), and the empty working directory at :data:`SANDBOX_WORKDIR`. No
  host process, file, socket or network interface is reachable.
* **seccomp** (:func:`seccomp_program`): a libseccomp filter, compiled in the trainer and passed
  to ``bwrap --seccomp``, so the kernel enforces it from the interpreter's first instruction. It
  refuses process and thread creation, ``connect``, ``ptrace``, other processes' memory and
  signals, io_uring, namespaces, mounts and unblocking signals (the list is
  ``_SECCOMP_REFUSED`` in :mod:`popgrpo.envs.sandbox.seccomp`).
* **limits**, set by the child (:mod:`popgrpo.envs.sandbox.child`) before the program runs: ``RLIMIT_CPU`` (``cpu_s``; its
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
  started ahead of its program (the warm pool, :mod:`popgrpo.envs.sandbox.pool`).

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

Reasons (:data:`REASONS`) and how each is detected, first match wins (:func:`~popgrpo.envs.sandbox.status.classify`):

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

The package, one module per part, bottom to top:

``limits``    what a run is given and gives back: :class:`SandboxLimits`, :class:`ExecutionResult`,
              :data:`REASONS`, :class:`SandboxUnavailable`;
``parsing``   :func:`extract_code`;
``child``     the child's script, run inside the sandbox; it imports only the standard library;
``command``   the child's argv, environment and first control line;
``seccomp``   the syscall filter;
``bwrap``     the namespace command, :func:`bwrap_problem`, :data:`ISOLATIONS`;
``process``   waiting for a sandbox's leader without reaping it, killing its session;
``status``    reading back a finished run: :class:`Outcome`, :class:`Interpret`, the reasons' rules;
``spawn``     one sandbox's life: :func:`spawn_child`, :class:`SandboxChild`;
``runner``    the public run API, :class:`Sandbox`;
``pool``      the warm pool, :class:`~popgrpo.envs.sandbox.pool.SandboxPool`;
``reward``    :func:`score_completions`.

Every public name but the pool's is importable from ``popgrpo.envs.sandbox`` itself.
"""

from popgrpo.envs.sandbox.bwrap import ISOLATIONS, bwrap_problem
from popgrpo.envs.sandbox.command import CHILD_SCRIPT, SANDBOX_CHILD, SANDBOX_UID, SANDBOX_WORKDIR, child_env
from popgrpo.envs.sandbox.limits import REASONS, ExecutionResult, SandboxLimits, SandboxUnavailable
from popgrpo.envs.sandbox.parsing import extract_code
from popgrpo.envs.sandbox.reward import score_completions
from popgrpo.envs.sandbox.runner import Sandbox
from popgrpo.envs.sandbox.seccomp import seccomp_program
from popgrpo.envs.sandbox.spawn import SandboxChild, spawn_child
from popgrpo.envs.sandbox.status import Interpret, Outcome

__all__ = [
    "CHILD_SCRIPT",
    "ISOLATIONS",
    "REASONS",
    "SANDBOX_CHILD",
    "SANDBOX_UID",
    "SANDBOX_WORKDIR",
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
