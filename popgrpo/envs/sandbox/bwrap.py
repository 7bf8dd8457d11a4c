"""bubblewrap: the namespace a program runs in, whether it can run here, and the opt-out's warning."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence

from popgrpo.envs.sandbox.command import CHILD_SCRIPT, SANDBOX_CHILD, SANDBOX_UID, SANDBOX_WORKDIR, child_env
from popgrpo.envs.sandbox.limits import SandboxUnavailable
from popgrpo.envs.sandbox.seccomp import memfd, seccomp_program

__all__ = ["ISOLATIONS", "bwrap_command", "bwrap_problem", "interpreter_roots", "warn_unisolated"]

ISOLATIONS = ("bwrap", "none")
"""``bwrap``: namespaces + seccomp (required by default); ``none``: the audit hook alone (opt-in)."""


def interpreter_roots(python: str, site_packages: bool) -> list[str]:
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


def bwrap_command(bwrap: str, work: str, seccomp_fd: int, roots: Sequence[str]) -> list[str]:
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
        fd = memfd("popgrpo-seccomp", program)
        try:
            cmd = [
                *bwrap_command(bwrap, work, fd, interpreter_roots(python, False)),
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


def warn_unisolated() -> None:
    message = (
        "popgrpo sandbox: isolation='none' — untrusted programs run WITHOUT namespaces or seccomp, "
        "contained only by a Python audit hook that a determined program can bypass (files, network, "
        "other processes, forged scores). Use it only on a disposable machine."
    )
    if not _WARNED_UNISOLATED[0]:
        _WARNED_UNISOLATED[0] = True
        print(f"WARNING: {message}", file=sys.stderr, flush=True)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
