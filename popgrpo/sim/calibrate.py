"""Measure the simulator's costs (:class:`~popgrpo.sim.costs.CostModel`) with the real components.

Each cost is timed by calling the code a run calls, on this machine, for the config given:

* ``epoch_s``, ``weight_bytes``: one member's epoch in this process (``run.torch_threads``
  threads), the median over several epochs after a warm-up one; the size of its state dict.
* ``merge_s(M)``: :func:`~popgrpo.runtime.scheduler.merge_selected` on ``M`` = 2 and 8 copies of
  the member's weights; the line through the two medians.
* ``driver_s(K)``: the driver's per-round work outside executor calls and the merge (selection,
  metrics, lineage, checkpoint, loggers), from short in-process runs of the config at
  ``K`` = 2 and 8 members (rounds after the first and before the last); the line through them.
* On Ray (an embedded one unless ``address`` is given): ``call_s``, a member actor's round trip
  with no payload; ``fetch_s``, the extra time of fetching one member's weights
  (``get_weights``) per byte; ``adopt_s``, the extra time of an ``adopt`` call (the merge put
  once in the object store, fetched, mutated, the states sent back) per byte; ``start_s``, a
  member actor's start-up to its first answer.

None of these sizes is one the validation uses (K = 5, 16, 64), so the validation
(``benchmarks/sim_validation.py``) checks a prediction, not a fit.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from popgrpo.config import Config
from popgrpo.sim.costs import CostModel, Linear

__all__ = ["RoundTimer", "calibrate"]

TIMED_CALLS = ("train", "get_weights", "adopt", "snapshot", "load_member_states", "load_archive_states")


class RoundTimer:
    """Wraps an executor: when each round's ``train`` call starts, and the seconds spent inside
    executor calls in each round, so that a round's driver work is the rest."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.starts: list[float] = []
        self.inside: list[float] = []
        self.train_s: list[float] = []
        self.adopt_s: list[float] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in TIMED_CALLS:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            if name == "train":
                self.starts.append(time.perf_counter())
                self.inside.append(0.0)
                self.train_s.append(0.0)
                self.adopt_s.append(0.0)
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                if self.inside:
                    self.inside[-1] += seconds
                    if name == "train":
                        self.train_s[-1] += seconds
                    elif name == "adopt":
                        self.adopt_s[-1] += seconds

        return timed

    def close(self) -> None:
        self.starts.append(time.perf_counter())
        self.inner.close()

    def round_seconds(self) -> list[float]:
        """Wall time of each round, from its ``train`` call to the next (the last: to ``close``)."""
        return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]

    def driver_seconds(self) -> list[float]:
        """Per round: its wall time less the time inside executor calls."""
        return [r - i for r, i in zip(self.round_seconds(), self.inside, strict=False)]


def run_timed(config: Config, factory: Callable[[Config, Path], Any]) -> RoundTimer:
    """Train ``config`` to the end through a :class:`RoundTimer`; its run directory is temporary."""
    from popgrpo.train import train

    holder: dict[str, RoundTimer] = {}

    def make(cfg: Config, run_dir: Path) -> Any:
        holder["timer"] = RoundTimer(factory(cfg, run_dir))
        return holder["timer"]

    with tempfile.TemporaryDirectory(prefix="pgsim-") as tmp:
        train(config, Path(tmp) / "run", executor_factory=make, progress=False)
    return holder["timer"]


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _with(config: Config, **sections: dict[str, Any]) -> Config:
    data = config.model_dump()
    for section, values in sections.items():
        data[section] = {**data[section], **values}
    return Config.model_validate(data)


def calibrate(
    config: Config, address: str | None = None, epochs: int = 12, progress: Callable[[str], None] = print
) -> CostModel:
    """Measure every cost of :class:`CostModel` for ``config``; see the module docstring."""
    from popgrpo.runtime.executor import LocalExecutor
    from popgrpo.runtime.scheduler import merge_selected

    one = _with(config, population={"size": 1, "members_per_actor": 1}, scheduler={"top_m": 1})
    local = LocalExecutor(one)
    local.train(1)  # warm-up
    epoch_s = _median_time(lambda: local.train(1), epochs)
    weights = local.get_weights([0])[0]
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    progress(f"epoch {epoch_s * 1e3:.1f} ms, weights {weight_bytes:,} bytes")

    merge_at = {
        m: _median_time(lambda m=m: merge_selected(list(range(m)), [weights] * m, [1.0] * m, 0, one), 7) for m in (2, 8)
    }
    merge_s = Linear.through(2, merge_at[2], 8, merge_at[8])
    progress(f"merge {merge_s}")

    driver_at = {}
    interval = config.scheduler.interval_epochs
    for k in (2, 8):
        cfg = _with(
            config,
            population={"size": k, "members_per_actor": 1},
            scheduler={"top_m": min(config.scheduler.top_m, k)},
            run={"epochs": 4 * interval},
        )
        timer = run_timed(cfg, lambda c, _d: LocalExecutor(c))
        top = min(cfg.scheduler.top_m, k)
        driver = timer.driver_seconds()[1:-1]  # rounds with a merge, after the first
        driver_at[k] = max(0.0, statistics.median(driver) - merge_s(top))
    driver_s = Linear.through(2, driver_at[2], 8, driver_at[8])
    progress(f"driver {driver_s}")

    call_s, fetch_s, adopt_s, start_s = _ray_costs(one, weights, weight_bytes, address)
    progress(f"call {call_s * 1e3:.2f} ms, fetch {fetch_s}, adopt {adopt_s}, start {start_s:.2f} s")
    import platform

    return CostModel(
        epoch_s=epoch_s,
        weight_bytes=weight_bytes,
        call_s=call_s,
        fetch_s=fetch_s,
        adopt_s=adopt_s,
        merge_s=merge_s,
        driver_s=driver_s,
        start_s=start_s,
        machine=f"{platform.node()} {platform.processor() or platform.machine()}, config {config.run.name}",
    )


def _ray_costs(
    config: Config, weights: Any, weight_bytes: int, address: str | None
) -> tuple[float, Linear, Linear, float]:
    """``call_s``, ``fetch_s``, ``adopt_s`` and ``start_s`` from one real member actor."""
    import ray

    from popgrpo.algorithms.merges import MUTATIONS
    from popgrpo.algorithms.population import MERGED, Adoption
    from popgrpo.runtime.cluster import connect
    from popgrpo.runtime.ray_executor import RayExecutor

    started = connect(address)  # before the clock: a member actor's start-up is what is timed
    mutation, _ = MUTATIONS.get(config.scheduler.mutate)(config.scheduler)
    adoption = {0: Adoption(MERGED, mutation, config.scheduler.reset_optimizer)}
    with tempfile.TemporaryDirectory(prefix="pgsim-") as tmp:
        begin = time.perf_counter()
        executor = RayExecutor(config, run_dir=Path(tmp) / "run", address=address)
        start_s = time.perf_counter() - begin
        try:
            actor = executor._actors[0]  # pyright: ignore[reportPrivateUsage]
            ray.get(actor.pid.remote())
            call_s = _median_time(lambda: ray.get(actor.pid.remote()), 50)
            fetch = _median_time(lambda: executor.get_weights([0]), 15)
            adopt = _median_time(lambda: executor.adopt({MERGED: weights}, adoption, 1), 15)
        finally:
            executor.close()
            if started:
                ray.shutdown()
    per_byte = 1.0 / max(1, weight_bytes)
    return (
        call_s,
        Linear(0.0, max(0.0, fetch - call_s) * per_byte),
        Linear(0.0, max(0.0, adopt - call_s) * per_byte),
        start_s,
    )
