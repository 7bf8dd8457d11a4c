"""Which executor a run's members train on, as values (:class:`ExecutorSpec`), and the one
function that builds it (:func:`build_executor`), called by :func:`popgrpo.train.train`.

``popgrpo train --executor local|ray --address A`` is ``ExecutorSpec("local"|"ray", A)``; each
name has its builder in :data:`_BUILDERS`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from popgrpo.config import Config, ConfigError

if TYPE_CHECKING:
    from popgrpo.runtime.executor import Executor

__all__ = ["LOCAL", "RAY", "ExecutorSpec", "build_executor", "check_executor"]

Say = Callable[[str], None]  # prints one start-up line


@dataclass(frozen=True)
class ExecutorSpec:
    """``name``: ``local`` (every member in this process, no Ray) or ``ray`` (members on Ray
    actors). ``address``: with ``ray``, the cluster to attach to; None starts an embedded Ray
    on 127.0.0.1 unless ``RAY_ADDRESS`` names one."""

    name: Literal["local", "ray"] = "local"
    address: str | None = None


LOCAL = ExecutorSpec()  # every member in this process
RAY = ExecutorSpec("ray")  # popgrpo train's default: an embedded Ray, or the cluster RAY_ADDRESS names


def check_executor(config: Config, spec: ExecutorSpec) -> None:
    """What ``config`` asks of its executor that ``spec``'s cannot do: bad input (ConfigError)."""
    if config.archive.redis_url and not _BUILDERS[spec.name][1]:
        raise ConfigError(
            "archive.redis_url: Redis write-through is done by the Ray executor's archive actor; "
            "drop --executor local or unset archive.redis_url"
        )


def build_executor(
    spec: ExecutorSpec, config: Config, run_dir: Path, say: Say | None = None, count_epochs: bool = False
) -> Executor:
    """The executor ``spec`` names for ``config``'s members, writing into ``run_dir``.

    ``say``: told what starts, and, once it has started, where to watch the run (those lines
    on stderr, ``popgrpo: `` first); None for neither. ``count_epochs``: the Ray members count
    their epochs for a progress bar. A cluster that cannot run the config as asked
    (:class:`~popgrpo.runtime.cluster.SetupError`) is bad input: ConfigError.
    """
    if not isinstance(spec, ExecutorSpec):
        raise TypeError(
            f"the executor is an ExecutorSpec, not {type(spec).__name__} (a factory goes in executor_factory=)"
        )
    check_executor(config, spec)
    build = _BUILDERS[spec.name][0]
    return build(spec, config, run_dir, say, count_epochs)


def _local(spec: ExecutorSpec, config: Config, run_dir: Path, say: Say | None, count_epochs: bool) -> Executor:
    from popgrpo.runtime.executor import LocalExecutor
    from popgrpo.telemetry.watching import watch_lines

    if say is not None:
        say(f"building {config.population.size} member(s) in this process (--executor local: no Ray)")
    executor = LocalExecutor(config, run_dir)
    if say is not None:
        _print_lines(watch_lines(run_dir, config.run, ray_connected=False))
    return executor


def _ray(spec: ExecutorSpec, config: Config, run_dir: Path, say: Say | None, count_epochs: bool) -> Executor:
    import ray

    from popgrpo.runtime.cluster import SetupError, embeds_ray
    from popgrpo.runtime.ray_executor import RayExecutor
    from popgrpo.telemetry.watching import charts_hint, ray_session_dir, watch_lines

    embedded = embeds_ray(spec.address)
    if say is not None and not ray.is_initialized():  # the CLI may have started it already (start_ahead)
        say(
            "starting Ray (embedded, on 127.0.0.1 only; Ray's own lines follow)"
            if embedded
            else f"connecting to Ray at {spec.address or 'RAY_ADDRESS'}"
        )
    try:
        executor = RayExecutor(config, run_dir=run_dir, address=spec.address, say=say, count_epochs=count_epochs)
    except SetupError as exc:
        raise ConfigError(str(exc)) from None
    if say is not None:
        lines = watch_lines(run_dir, config.run, ray_connected=True)
        if embedded:  # a cluster's charts are its operator's business (docs/guides/grafana.md)
            lines.append(charts_hint(ray_session_dir()))
        _print_lines(lines)
    return executor


# Each executor's builder, and whether it serves archive.redis_url (the Ray executor's archive actor writes through).
_BUILDERS: dict[str, tuple[Callable[..., Executor], bool]] = {"local": (_local, False), "ray": (_ray, True)}


def _print_lines(lines: list[str]) -> None:
    """Where to watch the run, on stderr (stdout carries the summary JSON)."""
    for line in lines:
        print(f"popgrpo: {line}", file=sys.stderr, flush=True)
