"""Getting a Ray cluster to run on: an embedded loopback-only Ray, or an existing cluster, and
whether the population fits on it."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from typing import Any

import ray

from popgrpo.runtime.stopping import reinstall

__all__ = [
    "SLOW_START",
    "ClusterTooSmallError",
    "SetupError",
    "check_fits",
    "connect",
    "embedded_cpus",
    "embeds_ray",
    "force_loopback",
    "release_ahead",
    "start_ahead",
    "start_local_ray",
]

log = logging.getLogger(__name__)


class SetupError(RuntimeError):
    """The run cannot start as configured on this cluster (the CLI exits 2 with the message)."""


class ClusterTooSmallError(SetupError):
    """The population's resource request can never be met by the cluster."""


def force_loopback() -> None:
    """Make every Ray process this one starts bind to 127.0.0.1, nothing else.

    ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough on Linux: Ray rewrites a
    loopback node address to the machine's interface address so that other machines could
    join. Nodes started from this process (an embedded Ray, or a test's
    ``ray.cluster_utils.Cluster``) never have other machines, so we switch that rewrite off
    the way Ray does on macOS/Windows (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``): the
    environment variable reaches Ray's child processes, the module constant this process.
    Never used when attaching to a real cluster.
    """
    import ray._private.ray_constants as ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


# What Ray raises when the head's raylet has not registered with its GCS within a fixed 30 s
# (ray/_private/node.py; not configurable): on a machine whose cores are all busy, a start
# that would have succeeded given a little longer.
SLOW_START = "timed out during startup"


def start_local_ray(
    num_cpus: int | None = None,
    temp_dir: str | None = None,
    include_dashboard: bool = True,
    dashboard_port: int | None = None,
    attempts: int = 2,
    **kwargs: Any,
):
    """Start an embedded single-node Ray bound to 127.0.0.1 only (see :func:`force_loopback`).

    The dashboard (and with it the per-node metrics agent that serves ``popgrpo_*`` metrics
    to Prometheus) listens on 127.0.0.1 too. A start that times out waiting for its own raylet
    (:data:`SLOW_START`) stops the processes it started (:func:`_started_since`) and tries
    again, ``attempts`` times in all; any other failure is raised at once.
    """
    force_loopback()
    if include_dashboard:
        kwargs.update(dashboard_host="127.0.0.1")
        if dashboard_port is not None:
            kwargs.update(dashboard_port=dashboard_port)
    for attempt in range(1, attempts + 1):
        before = _children()
        try:
            return ray.init(
                num_cpus=num_cpus,
                include_dashboard=include_dashboard,
                _node_ip_address="127.0.0.1",
                _temp_dir=temp_dir,
                configure_logging=False,
                **kwargs,
            )
        except Exception as exc:  # Ray raises a bare Exception for a slow start
            if SLOW_START not in str(exc) or attempt == attempts:
                raise
            started = _started_since(before)
            log.warning(
                "Ray's head did not register within Ray's 30 s (a busy machine?); stopping its %d "
                "process(es) and starting again (attempt %d of %d)",
                len(started),
                attempt + 1,
                attempts,
            )
            _stop_processes(started)
    raise AssertionError("unreachable")  # the last attempt returns or raises


def _children() -> set:
    """This process's children (``psutil.Process``: equal only with the same pid and start time)."""
    import psutil

    return set(psutil.Process().children())


def _started_since(before: set) -> set:
    """The children of this process that are not in ``before``, with their descendants: what a
    start of Ray's head launched (its GCS, raylet, agents and their workers). Processes of
    children that were there before, such as another Ray's workers, are not among them."""
    import psutil

    started = set()
    for child in _children() - before:
        started.add(child)
        with contextlib.suppress(psutil.NoSuchProcess):
            started.update(child.children(recursive=True))
    return started


def _stop_processes(processes: set, grace_s: float = 5.0) -> None:
    """SIGTERM ``processes``, then SIGKILL those still alive after ``grace_s``; wait for all."""
    import psutil

    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(list(processes), timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def connect(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Attach to Ray; return True when this call started an embedded local instance, or took
    over the one :func:`start_ahead` started (its caller then owns it and shuts it down).

    ``address=None`` inside a Ray job (or with ``RAY_ADDRESS`` set) attaches to that
    cluster; otherwise it starts an embedded loopback-only Ray (:func:`start_local_ray`)
    with ``num_cpus`` logical CPUs (members then share the physical cores), its dashboard on
    ``$POPGRPO_RAY_DASHBOARD_PORT`` (default 8265).
    """
    if ray.is_initialized():
        return _take_ahead()
    if embeds_ray(address):
        _start_embedded(num_cpus)
        return True
    ray.init(address=address, configure_logging=False)
    reinstall()
    return False


def _start_embedded(num_cpus: int | None) -> None:
    port = os.environ.get("POPGRPO_RAY_DASHBOARD_PORT")
    start_local_ray(num_cpus, dashboard_port=int(port) if port else None)
    reinstall()  # ray.init took SIGTERM over: a run's stop handler gets it back


def embedded_cpus(n_actors: int, cpus_each: float) -> int:
    """The logical CPUs of an embedded Ray for ``n_actors`` member actors of ``cpus_each``: the
    machine's cores, or as many as the actors reserve when that is more (they then share the
    physical cores)."""
    return max(os.cpu_count() or 1, math.ceil(n_actors * cpus_each))


# The embedded Ray :func:`start_ahead` started, by its node id, until a connect() takes it over.
_ahead: str | None = None


def start_ahead(num_cpus: int | None) -> None:
    """Start the embedded Ray now, before the executor that runs on it is built, so that Ray's
    start overlaps the driver's own set-up (its imports, the run directory, the loggers): the
    CLI calls it before it imports the trainer. The first :func:`connect` in this process
    takes it over as if it had started it; :func:`release_ahead` shuts it down if none did."""
    global _ahead
    _start_embedded(num_cpus)
    _ahead = ray.get_runtime_context().get_node_id()


def _take_ahead() -> bool:
    global _ahead
    ahead, _ahead = _ahead, None
    return ahead is not None and ahead == ray.get_runtime_context().get_node_id()


def release_ahead() -> None:
    """Shut down the Ray :func:`start_ahead` started if no :func:`connect` took it over (the run
    stopped before its executor was built)."""
    if _ahead is not None and ray.is_initialized() and _take_ahead():
        ray.shutdown()


def embeds_ray(address: str | None) -> bool:
    """Whether :func:`connect` (with Ray not yet connected) starts an embedded Ray for ``address``."""
    return address is None and not os.environ.get("RAY_ADDRESS")


def check_fits(n_actors: int, cpus_each: float, gpus_each: float, wait_s: float = 0.0) -> None:
    """Fail fast instead of leaving actors pending forever on a cluster that is too small.

    On an autoscaling cluster the nodes may not exist yet: with ``wait_s > 0`` the
    population's bundles are requested from the autoscaler (``request_resources``) and the
    check is repeated until they fit or ``wait_s`` has passed.
    """
    need = {"CPU": n_actors * cpus_each, "GPU": n_actors * gpus_each}

    def shortfall() -> str | None:
        total = ray.cluster_resources()
        for name, amount in need.items():
            if amount > total.get(name, 0.0) + 1e-9:
                return (
                    f"the population needs {amount:g} {name}s (actors × population.resources.num_{name.lower()}s) "
                    f"but the Ray cluster has {total.get(name, 0.0):g}"
                )
        return None

    missing = shortfall()
    if missing and wait_s > 0:
        from ray.autoscaler.sdk import request_resources

        bundle = {k: v for k, v in (("CPU", cpus_each), ("GPU", gpus_each)) if v > 0}
        if bundle:
            request_resources(bundles=[bundle] * n_actors)
        log.warning("%s; waiting up to %gs for the cluster to grow", missing, wait_s)
        deadline = time.monotonic() + wait_s
        while missing and time.monotonic() < deadline:
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            missing = shortfall()
    if missing:
        waited = f" after waiting {wait_s:g}s" if wait_s > 0 else ""
        raise ClusterTooSmallError(
            f"{missing}{waited}: raise population.members_per_actor, lower population.resources.num_cpus/num_gpus, "
            "or on an autoscaling cluster set population.resources.wait_for_cluster_s"
        )
