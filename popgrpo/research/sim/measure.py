"""Measure the simulator's costs (:class:`~popgrpo.research.sim.costs.CostModel`) with the real components.

Each cost is timed by calling the code a run calls, on this machine, for the config given:

* ``epoch_s``, ``weight_bytes``: one member's epoch in this process (``run.torch_threads``
  threads), the median CPU time over several epochs after a warm-up one; the size of its
  state dict.
* ``merge_s(M)``: :func:`~popgrpo.runtime.scheduler.merge_selected` on ``M`` = 2 and 8 copies of
  the member's weights; the line through the two medians (CPU time).
* ``driver_s(K)``: the driver's per-round work outside executor calls and the merge (selection,
  metrics, lineage, checkpoint, loggers), from short in-process runs of the config at
  ``K`` = 2 and 8 members (rounds after the first and before the last; the driver thread's
  CPU time outside executor calls and its background writer's); the line through them, with
  ``run.logged_members=0`` (the loggers' population series only). ``logged_member_s``: the
  same runs with every member's own series logged, the difference of the two lines' slopes
  (the loggers' work per member with series of its own); ``logged_members`` is the config's
  cap on those members. ``checkpoint_s``, ``checkpoint_member_s``: the same runs without a
  checkpoint in the rounds measured (``run.checkpoint_every`` past the run), the difference of
  the two lines' intercepts and slopes (:func:`checkpoint_part`). ``checkpoint_link_s``: a
  checkpoint's work for a member whose state is the one saved last (its file linked from the
  round before, as for the members of an asynchronous merge that did not report): the slope of
  the CPU time of saving 2 and 8 such members (:func:`checkpoint_link_cost`).
* On Ray (an embedded one unless ``address`` is given): ``call_s``, a member actor's round trip
  with no payload; ``fetch_s``, the extra time of fetching one member's weights
  (``get_weights``) per byte; ``adopt_s``, the extra time of an ``adopt`` call (the merge put
  once in the object store, fetched, mutated, the states sent back) per byte; ``start_s``, a
  member actor's start-up to its first answer.

* Sharing a node (:class:`Sharing`, :func:`_sharing`): ``n`` = 3 and 18 member actors, each
  holding the config's ``population.members_per_actor`` members, train at once on this
  machine's cores (1.5 and 9 actors per core on 2 cores: the validation's sizes, 2.5, 8 and 4
  per core, lie between them), ten rounds of back-to-back ``train``
  calls after a warm-up one (fewer with several members per actor: ``max(3, 10 // members per
  actor)``; with three, an epoch's CPU time at 3 actors of one member varies by about ±15% from
  one calibration to the next), with the CPU time of every process read
  (psutil) before and after; then the same actors' population trains as many real rounds
  after a first one (:func:`popgrpo.train.train`: merges, adopts, the background writer's
  files and loggers). ``contention(x)``, an epoch's CPU time inside an actor over ``epoch_s``
  in those real rounds (an actor's members take turns, so their epochs share its caches too;
  between real rounds the members adopt new weights and the driver writes: one probe at 16
  actors measured an epoch there at about 20% more CPU than in back-to-back calls a minute
  apart, while the calibrations of 2026-11-27 found the two within noise at 18 actors);
  ``actor_call_cpu_s``, the actors' CPU outside their epochs per call (its members' live
  metrics and rows included);
  ``ray_share(x)``, the CPU of Ray's own processes and the driver over the cores' time;
  ``background_share(x)``, the machine's other busy CPU over the cores' time; each the line
  through the two sizes in ``x`` = actors per core.

The costs held on a core (``epoch_s``, ``merge_s``, ``driver_s``) are CPU time, not wall
time: on a machine that others share, waiting for a core is the sharing terms' part.

None of these sizes is one the validation uses (K = 5, 16 and 64 as 8 actors: 2.5, 8 and 4
actors per core on 2 cores), so the validation (``benchmarks/sim_validation.py``) checks a
prediction, not a fit: no cost is fitted to a validation run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from popgrpo.config import Config
from popgrpo.research.sim.costs import CostModel, Linear
from popgrpo.runtime.round_timer import RoundTimer
from popgrpo.telemetry.cpu import CpuSample

__all__ = [
    "Sharing",
    "calibrate",
    "checkpoint_link_cost",
    "checkpoint_part",
    "driver_line",
    "sharing_costs",
]

TIMED_CALLS = ("train", "get_weights", "adopt", "snapshot", "load_member_states", "load_archive_states")


def run_timed(config: Config, factory: Callable[[Config, Path], Any]) -> RoundTimer:
    """Train ``config`` to the end through a :class:`~popgrpo.runtime.round_timer.RoundTimer` of
    :data:`TIMED_CALLS` (the background writer's CPU per round recorded too); its run directory
    is temporary."""
    from unittest import mock

    import popgrpo.train as train_module

    holder: dict[str, RoundTimer] = {}

    def make(cfg: Config, run_dir: Path) -> Any:
        holder["timer"] = RoundTimer(factory(cfg, run_dir), timed=TIMED_CALLS)
        return holder["timer"]

    def timed_writes(*args: Any, **kwargs: Any) -> Any:  # a round is written once the executor is made
        cpu = time.thread_time()
        try:
            return write_round(*args, **kwargs)
        finally:
            holder["timer"].writer_cpu.append(time.thread_time() - cpu)

    write_round = train_module._write_round  # pyright: ignore[reportPrivateUsage]
    with (
        tempfile.TemporaryDirectory(prefix="pgsim-") as tmp,
        mock.patch.object(train_module, "_write_round", timed_writes),
    ):
        train_module.train(config, Path(tmp) / "run", executor_factory=make, progress=False)
    return holder["timer"]


def _median_time(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def _with(config: Config, **sections: dict[str, Any]) -> Config:
    data = config.model_dump()
    for section, values in sections.items():
        data[section] = {**data[section], **values}
    return Config.model_validate(data)


def calibrate(
    config: Config,
    address: str | None = None,
    epochs: int = 12,
    progress: Callable[[str], None] = print,
    sharing_at: tuple[int, int] | None = None,
    sharing_rounds: int | None = None,
) -> CostModel:
    """Measure every cost of :class:`CostModel` for ``config``; see the module docstring."""
    from popgrpo.runtime.executor import LocalExecutor
    from popgrpo.runtime.scheduler import merge_selected

    one = _with(config, population={"size": 1, "members_per_actor": 1}, scheduler={"top_m": 1})
    local = LocalExecutor(one)
    local.train(1)  # warm-up
    epoch_s = _median_time(lambda: local.train(1), epochs, time.process_time)
    weights = local.get_weights([0])[0]
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    progress(f"epoch {epoch_s * 1e3:.1f} ms, weights {weight_bytes:,} bytes")

    merge_at = {
        m: _median_time(
            lambda m=m: merge_selected(
                list(range(m)), [weights] * m, [1.0] * m, 0, one, round0=partial(local.round0_weights, list(range(m)))
            ),
            7,
            time.process_time,
        )
        for m in (2, 8)
    }
    merge_s = Linear.through(2, merge_at[2], 8, merge_at[8])
    progress(f"merge {merge_s}")

    driver_s = driver_line(config, merge_s, 0)
    logged_member_s = max(0.0, driver_line(config, merge_s, 8).b - driver_s.b)
    progress(f"driver {driver_s}, each member's own logger series {logged_member_s * 1e3:.2f} ms")
    checkpoint_s, checkpoint_member_s = checkpoint_part(driver_s, driver_line(config, merge_s, 0, NO_CHECKPOINTS))
    progress(f"of it the checkpoint: {checkpoint_s * 1e3:.2f} ms + {checkpoint_member_s * 1e3:.2f} ms per member")
    checkpoint_link_s = checkpoint_link_cost(config)
    progress(f"a member's state unchanged since the last checkpoint: {checkpoint_link_s * 1e3:.3f} ms")

    call_s, fetch_s, adopt_s, start_s = _ray_costs(one, weights, weight_bytes, address)
    progress(f"call {call_s * 1e3:.2f} ms, fetch {fetch_s}, adopt {adopt_s}, start {start_s:.2f} s")
    sharing = sharing_costs(config, epoch_s, address, progress, sharing_at or SHARING_AT, sharing_rounds)
    import platform

    return CostModel(
        epoch_s=epoch_s,
        weight_bytes=weight_bytes,
        call_s=call_s,
        fetch_s=fetch_s,
        adopt_s=adopt_s,
        merge_s=merge_s,
        driver_s=driver_s,
        logged_member_s=logged_member_s,
        logged_members=config.run.logged_members,
        checkpoint_s=checkpoint_s,
        checkpoint_member_s=checkpoint_member_s,
        checkpoint_link_s=checkpoint_link_s,
        start_s=start_s,
        **sharing,
        machine=f"{platform.node()} {platform.processor() or platform.machine()}, config {config.run.name}",
    )


NO_CHECKPOINTS = 10**6  # run.checkpoint_every past any run: a checkpoint after the last round only


def driver_line(config: Config, merge_s: Linear, logged_members: int, checkpoint_every: int = 1) -> Linear:
    """The driver's CPU per round (its thread outside executor calls and the merge, plus its
    background writer's) as a line in K through in-process runs at K = 2 and 8, with
    ``run.logged_members`` and ``run.checkpoint_every`` as given."""
    from popgrpo.runtime.executor import LocalExecutor

    driver_at = {}
    for k in (2, 8):
        cfg = _with(
            config,
            population={"size": k, "members_per_actor": 1},
            scheduler={"top_m": min(config.scheduler.top_m, k)},
            run={
                "epochs": 4 * config.scheduler.interval_epochs,
                "logged_members": logged_members,
                "checkpoint_every": checkpoint_every,
            },
        )
        timer = run_timed(cfg, lambda c, _d: LocalExecutor(c))
        top = min(cfg.scheduler.top_m, k)
        driver = timer.driver_cpu_seconds()[1:-1]  # rounds with a merge, after the first
        driver_at[k] = max(0.0, statistics.median(driver) - merge_s(top))
    return Linear.through(2, driver_at[2], 8, driver_at[8])


def checkpoint_link_cost(config: Config, repeats: int = 9) -> float:
    """CPU seconds a checkpoint spends on a member whose state object it saved last time (a
    link, not a new file): the slope of saving 2 and 8 such members, each saved once first. The
    archives' file is written whole every time; with private archives its part per member is in
    the slope too."""
    from popgrpo.runtime.executor import LocalExecutor
    from popgrpo.telemetry.checkpoint import Checkpointer

    cfg = _with(config, population={"size": 8, "members_per_actor": 1}, scheduler={"top_m": 1})
    local = LocalExecutor(cfg)
    local.train(1)
    members, archives = local.snapshot()
    cost = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in (2, 8):
            checkpointer = Checkpointer(Path(tmp) / f"k{k}", keep=2)
            rounds = iter(range(repeats + 1))
            own = archives[:k] if len(archives) == len(members) else archives  # private archives: one a member
            checkpointer.save(next(rounds), 1, members[:k], own)
            cost[k] = _median_time(
                lambda c=checkpointer, k=k, r=rounds, a=own: c.save(next(r), 1, members[:k], a),
                repeats,
                time.process_time,
            )
    return Linear.through(2, cost[2], 8, cost[8]).b


def checkpoint_part(with_checkpoints: Linear, without: Linear) -> tuple[float, float]:
    """``(checkpoint_s, checkpoint_member_s)``: the driver's per-round line with a checkpoint every
    round less the line without any (``run.checkpoint_every`` past the run), intercept and slope,
    each at least 0 (noise cannot make a checkpoint save time)."""
    return max(0.0, with_checkpoints.a - without.a), max(0.0, with_checkpoints.b - without.b)


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
            executor.worker_pids()  # one member actor: a round trip with no payload
            call_s = _median_time(executor.worker_pids, 50)
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


def sharing_costs(
    config: Config,
    epoch_s: float,
    address: str | None = None,
    progress: Callable[[str], None] = print,
    at: tuple[int, int] | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    """The sharing terms of :class:`CostModel` (``contention``, ``actor_call_cpu_s``, ``ray_share``,
    ``background_share``) from :func:`_sharing` at two sizes (default :data:`SHARING_AT`), each over
    ``rounds`` rounds (default: :func:`_sharing`'s); see the module docstring."""
    a, b = (_sharing(config, n, address, rounds) for n in (at or SHARING_AT))
    for m in (a, b):
        progress(
            f"{m.actors} actors on {m.cores} cores: epoch CPU {m.epoch_cpu_s / m.epochs * 1e3:.1f} ms "
            f"({m.round_epoch_cpu_s / max(m.round_epochs, 1) * 1e3:.1f} ms in real rounds), "
            f"call CPU {m.call_cpu_s() * 1e3:.1f} ms, Ray {m.ray_share():.1%}, others {m.background_share():.1%} "
            f"of the cores, load {m.load:.1f}"
        )
    x0, x1 = a.actors / a.cores, b.actors / b.cores
    return {
        "contention": Linear.through(x0, a.contention(epoch_s), x1, b.contention(epoch_s)),
        "actor_call_cpu_s": statistics.fmean([a.call_cpu_s(), b.call_cpu_s()]),
        "ray_share": Linear.through(x0, a.ray_share(), x1, b.ray_share(), rising=False),
        "background_share": Linear.through(x0, a.background_share(), x1, b.background_share(), rising=False),
    }


SHARING_AT = (3, 18)  # member actors training at once; the validation's are 5, 16 and 8


@dataclass(frozen=True)
class Sharing:
    """CPU accounting of ``actors`` member actors training at once on one node's ``cores``,
    over ``wall`` seconds of back-to-back ``train`` calls (``calls`` of them, ``epochs``
    member-epochs in all): their CPU in epochs (thread time), their processes' whole CPU,
    that of Ray's own processes and the driver, and the machine's busy CPU (all processes);
    and the CPU of ``round_epochs`` member-epochs of the same actors in a real run's rounds
    (:func:`_round_epochs`), which :meth:`contention` uses when there are any."""

    actors: int
    cores: int
    calls: int
    epochs: int
    wall: float
    epoch_cpu_s: float
    actor_cpu_s: float
    ray_cpu_s: float
    busy_cpu_s: float
    load: float = 0.0  # the 1-minute load average at the end
    round_epoch_cpu_s: float = 0.0  # the same actors' epochs in real rounds (merges, adopts, writes)
    round_epochs: int = 0

    def contention(self, epoch_s: float) -> float:
        """An epoch's CPU time here over ``epoch_s`` (its CPU time alone): in the real rounds
        when they were run, else in the back-to-back calls."""
        if self.round_epochs:
            return self.round_epoch_cpu_s / self.round_epochs / epoch_s
        return self.epoch_cpu_s / self.epochs / epoch_s

    def call_cpu_s(self) -> float:
        """An actor's CPU per ``train`` call outside its epochs."""
        return max(0.0, self.actor_cpu_s - self.epoch_cpu_s) / self.calls

    def ray_share(self) -> float:
        return self.ray_cpu_s / (self.cores * self.wall)

    def background_share(self) -> float:
        """What the rest of the machine took: busy CPU that was neither the actors' nor Ray's."""
        return max(0.0, self.busy_cpu_s - self.actor_cpu_s - self.ray_cpu_s) / (self.cores * self.wall)


def _cpu_now(actor_pids: set[int]) -> tuple[float, float, float]:
    """(member actors' CPU, Ray's other processes' and the driver's CPU, the machine's busy CPU), in seconds.

    Ray's processes are this driver's descendants (an embedded Ray: raylet, GCS, agents, workers):
    :class:`~popgrpo.telemetry.cpu.CpuSample` of them."""
    sample = CpuSample.take(actor_pids, descendants_only=True)
    actors = sample.seconds(("member actors",))
    return actors, sample.seconds() - actors, sample.busy


def _sharing(config: Config, n: int, address: str | None, rounds: int | None = None) -> Sharing:
    """``n`` member actors of the config's ``population.members_per_actor`` members each train
    ``rounds`` rounds at once on Ray (default ``max(3, 10 // members per actor)``); see :class:`Sharing`."""
    import os

    import ray

    from popgrpo.runtime.cluster import connect, start_local_ray
    from popgrpo.runtime.ray_executor import RayExecutor

    per_actor = config.population.members_per_actor
    rounds = rounds if rounds is not None else max(3, 10 // per_actor)
    cfg = _with(
        config,
        population={"size": n * per_actor, "members_per_actor": per_actor},
        scheduler={"top_m": min(config.scheduler.top_m, n * per_actor)},
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    interval = cfg.scheduler.interval_epochs
    started = not ray.is_initialized() and address is None
    if started:  # as the validation runs: an embedded Ray without the dashboard
        start_local_ray(num_cpus=max(cores, n), include_dashboard=False)
    else:
        connect(address)
    with tempfile.TemporaryDirectory(prefix="pgsim-") as tmp:
        executor = RayExecutor(cfg, run_dir=Path(tmp) / "run", address=address)
        try:
            pids = set(executor.worker_pids())
            executor.train(interval)  # warm-up
            begin, cpu0 = time.perf_counter(), _cpu_now(pids)
            for _ in range(rounds):
                executor.train(interval)
            wall, cpu1 = time.perf_counter() - begin, _cpu_now(pids)
            epoch_cpu = sum(sum(per_call[1:]) for per_call in executor.epoch_cpu_seconds())
        finally:
            executor.close()
        try:
            round_cpu, round_epochs = _round_epochs(cfg, rounds, address)
        finally:
            if started:
                ray.shutdown()
    return Sharing(
        actors=n,
        cores=cores,
        calls=n * rounds,
        epochs=n * per_actor * rounds * interval,
        wall=wall,
        epoch_cpu_s=epoch_cpu,
        actor_cpu_s=cpu1[0] - cpu0[0],
        ray_cpu_s=cpu1[1] - cpu0[1],
        busy_cpu_s=cpu1[2] - cpu0[2],
        load=os.getloadavg()[0],
        round_epoch_cpu_s=round_cpu,
        round_epochs=round_epochs,
    )


def _round_epochs(cfg: Config, rounds: int, address: str | None) -> tuple[float, int]:
    """``cfg`` trained for ``rounds`` + 1 real rounds on the connected Ray (:func:`popgrpo.train.train`:
    selection, merge, adopts, the background writer), in a temporary run directory: the CPU seconds
    of its members' epochs after the first round, and how many epochs that is."""
    from popgrpo.runtime.ray_executor import RayExecutor

    interval = cfg.scheduler.interval_epochs
    run = _with(cfg, run={"epochs": (rounds + 1) * interval, "checkpoint_every": 1})
    per_actor = run_timed(run, lambda c, d: RayExecutor(c, run_dir=d, address=address)).epoch_cpu
    cpu = sum(sum(calls[1:]) for calls in per_actor)
    epochs = sum(len(calls[1:]) for calls in per_actor) * cfg.population.members_per_actor * interval
    return cpu, epochs
