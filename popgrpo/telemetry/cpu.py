"""Where a machine's cores went over a span of a run: every process's CPU seconds by role.

The one CPU sampler of the simulator's calibration (:mod:`popgrpo.research.sim.measure`: the sharing
costs), section 3 of the benchmarks (``benchmarks/round_overhead.py``), the simulator's probe
(``benchmarks/sim_probe.py``) and the Ray call benchmark. A :class:`CpuSample` holds, at one
moment, the CPU seconds (user + system, psutil) of every process on the machine with its role
(or of the driver and its descendants only), the driver's threads by kind, and the machine's
idle and busy seconds; :func:`split` turns two samples into core-seconds per role. Ray's
processes are the driver's descendants; what is not is "other processes".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass

import psutil

__all__ = ["BUSY", "DRIVER_THREADS", "ROLES", "CpuSample", "cpu_by_pid", "driver_threads", "role", "split"]

ROLES = ("member actors", "driver", "raylet", "gcs", "ray agents", "other ray workers", "other processes")
# The driver's threads: popgrpo's background writer, the main thread (the round loop), the
# other Python threads (TensorBoard's event writers, tqdm, …) and the threads that are not
# Python's (Ray's core worker: gRPC and its event loops).
DRIVER_THREADS = ("writer", "main", "other python", "ray (native)")


def role(proc: psutil.Process, me: int, actors: set[int]) -> str:
    """The role of one of the driver's descendants (or the driver itself)."""
    try:
        pid = proc.pid
        if pid == me:
            return "driver"
        if pid in actors:
            return "member actors"
        name = proc.name()
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    if "raylet" in name or "raylet" in cmd.split(" ")[0]:
        return "raylet"
    if "gcs_server" in name or "gcs_server" in cmd:
        return "gcs"
    # Ray retitles its agents' processes (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``): the
    # match ignores case, or they would pass for workers below.
    low = cmd.lower()
    if any(part in low for part in ("dashboard", "agent", "runtime_env", "log_monitor", "monitor.py")):
        return "ray agents"
    if "ray::" in cmd or "default_worker" in cmd or name.startswith("ray::"):
        return "other ray workers"
    return "other processes"


def cpu_by_pid(actors: set[int], descendants_only: bool = False) -> dict[int, tuple[float, str]]:
    """Every process's CPU seconds and its role (``descendants_only``: this process's and its
    descendants' only, without looking at the rest of the machine)."""
    me = psutil.Process()
    children = me.children(recursive=True)
    ours = {c.pid for c in children}
    out = {}
    for p in [me, *children] if descendants_only else psutil.process_iter():
        try:
            t = p.cpu_times()
            group = role(p, me.pid, actors) if p.pid in ours or p.pid == me.pid else "other processes"
            out[p.pid] = (t.user + t.system, group)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def driver_threads(writer_name: str = "popgrpo-writer") -> dict[int, tuple[str, float]]:
    """This process's threads: native id → (kind, :data:`DRIVER_THREADS`; CPU seconds)."""
    python = {t.native_id: t for t in threading.enumerate()}
    main = threading.main_thread().native_id
    out = {}
    for t in psutil.Process().threads():
        py = python.get(t.id)
        if t.id == main:
            kind = "main"
        elif py is None:
            kind = "ray (native)"
        else:
            kind = "writer" if py.name == writer_name else "other python"
        out[t.id] = (kind, t.user_time + t.system_time)
    return out


BUSY = ("user", "nice", "system", "irq", "softirq", "steal")  # psutil.cpu_times() fields of busy cores


@dataclass
class CpuSample:
    """At time ``t`` (``time.perf_counter``): :func:`cpu_by_pid`, :func:`driver_threads`, and the
    machine's idle (idle + iowait) and busy (:data:`BUSY`) CPU seconds over all cores."""

    t: float
    processes: dict[int, tuple[float, str]]
    threads: dict[int, tuple[str, float]]
    idle: float
    busy: float = 0.0

    @classmethod
    def take(cls, actors: set[int], descendants_only: bool = False) -> CpuSample:
        """A sample now; ``actors``: the member actors' pids (role ``member actors``)."""
        times = psutil.cpu_times()
        return cls(
            time.perf_counter(),
            cpu_by_pid(actors, descendants_only),
            driver_threads(),
            times.idle + getattr(times, "iowait", 0.0),
            sum(getattr(times, f) for f in BUSY if hasattr(times, f)),
        )

    def seconds(self, roles: Collection[str] | None = None) -> float:
        """CPU seconds of the processes in ``roles`` (None: every process sampled)."""
        return sum(s for s, role in self.processes.values() if roles is None or role in roles)


def split(a: CpuSample, b: CpuSample, epochs_cpu: float, cores: int) -> dict[str, float]:
    """Shares of ``cores × (b.t − a.t)`` core-seconds: the members' epochs (``epochs_cpu``, their
    threads' CPU inside epochs), the rest of the member actors' CPU, each other role, the driver's
    threads by kind, idle cores, and what no sample saw (threads and processes that ended
    between the samples; negative when a process started before ``a`` is counted that ``a`` missed)."""
    capacity = cores * (b.t - a.t)
    roles: dict[str, float] = dict.fromkeys(ROLES, 0.0)
    for pid, (seconds, group) in b.processes.items():
        if pid in a.processes and group in roles:
            roles[group] += seconds - a.processes[pid][0]
    out = {"members' epochs": epochs_cpu, "member actors, outside epochs": roles.pop("member actors") - epochs_cpu}
    driver = roles.pop("driver")
    threads: dict[str, float] = dict.fromkeys(DRIVER_THREADS, 0.0)
    for tid, (kind, seconds) in b.threads.items():  # a thread started in the span: all its time
        threads[kind] += seconds - (a.threads[tid][1] if tid in a.threads else 0.0)
    for kind, seconds in threads.items():
        out[f"driver: {kind}"] = seconds
    out["driver: threads that ended"] = driver - sum(threads.values())
    out.update(roles)
    out["idle cores"] = b.idle - a.idle
    out["unaccounted"] = capacity - sum(out.values())
    return {k: v / capacity for k, v in out.items()}
