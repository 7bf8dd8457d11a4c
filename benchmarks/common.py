"""Shared pieces of the benchmark suite: fits, process memory, local Ray clusters.

Memory is read from ``/proc`` (Linux): psutil is not a dependency. RSS double counts the
pages that processes share (torch's libraries are mapped into every Ray worker), so it is
an upper bound of what a population needs; PSS splits shared pages between the processes
that map them and is the better estimate of the real footprint. Both are reported.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "PeakMemory",
    "driver_and_ray_daemons",
    "fit_line",
    "gib",
    "local_ray",
    "loopback_ray_cluster",
    "met",
    "pss_bytes",
    "replace_between",
    "rss_bytes",
    "write_between",
]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def met(ok: bool, reason: str = "") -> str:
    """``met``, or ``not met: <reason>``."""
    return "met" if ok else f"not met: {reason}" if reason else "not met"


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares ``y = a + b·x``; returns ``(a, b, R²)``."""
    x_arr, y_arr = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    b, a = np.polyfit(x_arr, y_arr, 1)
    residual = y_arr - (a + b * x_arr)
    total = y_arr - y_arr.mean()
    r2 = 1.0 - float(residual @ residual) / float(total @ total) if float(total @ total) > 0 else 1.0
    return float(a), float(b), r2


# ---- process memory ------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def driver_and_ray_daemons() -> list[int]:
    """This process and its descendants that are not Ray worker processes.

    With an embedded Ray (or a ``ray.cluster_utils.Cluster``) started from this process, that
    is the driver, the GCS, the raylet(s) and Ray's agents; the workers (titled ``ray::<actor
    class>`` or ``ray::IDLE``) are left out, so a population's own actors can be added by pid.
    """
    children = _children()
    pids, stack = [], [os.getpid()]
    while stack:
        pid = stack.pop()
        title = _cmdline(pid)
        if not title.startswith("ray::") or title.split()[0].endswith("Agent"):
            pids.append(pid)
        stack.extend(children.get(pid, []))
    return pids


def _sum_over(pids: Iterable[int], read: Callable[[int], int]) -> int:
    """``read(pid)`` summed over the processes (a process that has exited, or a file that does
    not parse, counts 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += read(pid)
    return total


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")), 0)


def rss_bytes(pids: Iterable[int]) -> int:
    """Sum of the processes' resident set sizes (processes that have exited count 0)."""
    return _sum_over(pids, _rss)


def pss_bytes(pids: Iterable[int]) -> int:
    """Sum of the processes' proportional set sizes (``/proc/PID/smaps_rollup``)."""
    return _sum_over(pids, _pss)


class PeakMemory:
    """Samples the summed RSS of ``pids`` every ``interval`` seconds in a thread; ``peak`` in bytes."""

    def __init__(self, pids: Sequence[int], interval: float = 0.1) -> None:
        self.pids, self.interval, self.peak = list(pids), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pids))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pids))


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# ---- Ray, loopback only, own temp dir, stopped by its own handle ------------------------
@contextlib.contextmanager
def local_ray(num_cpus: int, prefix: str = "pgbench-", as_train: bool = False):
    """An embedded single-node Ray on 127.0.0.1, shut down on exit: without the dashboard and
    without forwarding the workers' logs to the driver, or (``as_train``) as ``popgrpo train``
    embeds one (:func:`~popgrpo.runtime.cluster.start_local_ray`'s defaults: both on), its
    dashboard on a free loopback port."""
    import ray

    from popgrpo.runtime.cluster import start_local_ray

    temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's socket paths are length-limited
    if as_train:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        start_local_ray(num_cpus=num_cpus, temp_dir=temp_dir, dashboard_port=port)
    else:
        start_local_ray(num_cpus=num_cpus, temp_dir=temp_dir, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@contextlib.contextmanager
def loopback_ray_cluster(head_node_args: dict, worker_cpus: tuple[int, ...] = (), prefix: str = "pgbcl-"):
    """A real multi-process ``ray.cluster_utils.Cluster`` on 127.0.0.1, this process its driver.

    Every node is a separate raylet (its own processes and object store) on this machine, in one
    temp dir of its own; ``worker_cpus`` adds a worker node per entry. Yields
    ``(cluster, workers, temp_dir)`` and shuts it all down on exit.

    ``Cluster`` records its address in ``$RAY_TMPDIR/ray/ray_current_cluster`` (``/tmp/ray``
    by default), which a bare ``ray.init()`` on this machine reads: pointed into the temp dir,
    that file neither touches another Ray user's nor fails where ``/tmp/ray`` does not exist.
    """
    import ray
    from ray.cluster_utils import Cluster

    from popgrpo.runtime.cluster import force_loopback

    force_loopback()
    temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's socket paths are length-limited
    os.makedirs(os.path.join(temp_dir, "ray"))
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={**head_node_args, "temp_dir": temp_dir})
        workers = [cluster.add_node(num_cpus=n, temp_dir=temp_dir) for n in worker_cpus]
        if workers:
            cluster.wait_for_nodes()
        ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
        if not cluster.address.startswith("127.0.0.1:"):
            raise RuntimeError(f"cluster is not on loopback: {cluster.address}")
        yield cluster, workers, temp_dir
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(temp_dir, ignore_errors=True)


def replace_between(text: str, region: str, begin: str, end: str) -> str:
    """``text`` with everything between the markers ``begin`` and ``end`` replaced by ``region``
    (the markers and region appended when absent): how a benchmark rewrites its own section of
    BENCHMARKS.md or a page under docs/benchmarks/ and keeps the rest of the file as it is."""
    block = f"{begin}\n{region.strip()}\n{end}"
    start, stop = text.find(begin), text.find(end)
    if start == -1 or stop == -1 or stop < start:
        return text.rstrip("\n") + ("\n\n" if text.strip() else "") + block + "\n"
    return text[:start] + block + text[stop + len(end) :]


def write_between(path: Path, region: str, begin: str, end: str) -> None:
    """:func:`replace_between` on the file at ``path`` (created when missing)."""
    text = path.read_text() if path.exists() else ""
    path.write_text(replace_between(text, region, begin, end))
