"""The seccomp filter bubblewrap installs, and the in-memory file that hands it over."""

from __future__ import annotations

import functools
import os
import signal
import tempfile

__all__ = ["memfd", "seccomp_program"]


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
    ``rt_sigprocmask`` only to block (the child blocks every signal; see :func:`popgrpo.envs.sandbox.child.block_signals`).
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


def memfd(name: str, data: bytes) -> int:
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
