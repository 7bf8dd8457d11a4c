"""How a sandbox's interpreter is started: its argv, its environment and its first control line.

The child's script (:mod:`popgrpo.envs.sandbox.child`) is run by path, from the host or, under
bubblewrap, from :data:`SANDBOX_CHILD`; :mod:`popgrpo.envs.sandbox.bwrap` builds the namespace
around it.
"""

from __future__ import annotations

import json
import os

from popgrpo.envs.sandbox import child as sandbox_child
from popgrpo.envs.sandbox.limits import SandboxLimits

__all__ = [
    "CHILD_SCRIPT",
    "SANDBOX_CHILD",
    "SANDBOX_UID",
    "SANDBOX_WORKDIR",
    "child_env",
    "limits_message",
    "python_command",
]

CHILD_SCRIPT = os.path.abspath(sandbox_child.__file__)
"""The child's source on the host (:mod:`popgrpo.envs.sandbox.child`), run by path."""

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


def python_command(python: str, site_packages: bool, script: str, control_fd: int) -> list[str]:
    """The interpreter's argv: the child ``script`` reads everything else from ``control_fd``."""
    flags = ["-I", "-B", "-X", "utf8"] + ([] if site_packages else ["-S"])
    return [python, *flags, script, str(control_fd)]


def limits_message(limits: SandboxLimits, status_fd: int, ready_fd: int, nproc: int, audit_hook: bool) -> bytes:
    """The child's first line on its control pipe (:func:`popgrpo.envs.sandbox.child.parse_limits`).

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


SANDBOX_WORKDIR = "/sandbox"
"""The program's working directory inside bubblewrap (the host directory is bound there)."""

SANDBOX_UID = 65534
"""The program's uid and gid inside its user namespace (``nobody``: no capabilities, owns nothing)."""
