"""A discrete-event model of the Pop-GRPO scheduler on a cluster (SimPy): sync and async rounds.

What is modelled, and how it maps onto the real run (popgrpo.runtime):

* **Actors and cores.** Members are packed ``members_per_actor`` to an actor, as
  ``population.members_per_actor`` does; an actor trains its members one after another, so
  an actor's epoch costs ``members_per_actor × epoch_s``. Actors are placed round-robin on the
  nodes; each node has ``cores_per_node`` cores (a :class:`simpy.Resource`), and an actor
  holds one core for each epoch it trains, so actors that outnumber a node's cores queue for
  them epoch by epoch (what time-slicing on an over-committed node amounts to at that grain).
  Every ``train`` call costs one Ray round trip (``call_s``) and, after its epochs,
  ``actor_call_cpu_s`` of the actor's core (Ray's worker threads, live metrics).
* **Sharing a node.** With ``x`` actors per core on a node, an epoch there costs
  ``contention(x) × epoch_s`` of core time (time-slicing and caches make each epoch's CPU
  time grow with the actors that share the cores), and every piece of work held on the
  node's cores takes ``1 / core_speed(x)`` times as long: Ray's own processes and the rest
  of the machine take ``ray_share(x) + background_share(x)`` of the cores
  (:meth:`~popgrpo.research.sim.costs.CostModel.core_speed`). ``x`` follows the actors as they move
  after a node loss.
* **Stragglers.** Each actor's epochs in one round take ``m ×`` their cost, with ``m`` drawn
  log-normal with mean 1 (``straggler_sigma``; σ = 1 gives a heavy tail: 1 round in 20 is
  slower than 3.3× the mean). Draws are keyed by (seed, actor, that actor's round number), so
  sync and async see the same draws.
* **Sync** (``scheduler.mode: sync``): every actor trains T epochs, the driver waits for all
  of them, then fetches the top-M members' weights and merges them; each actor adopts the
  merge (object-store fetch, mutation, its states back for the checkpoint) and trains its
  next round right after (the real driver queues the next train call behind the adopt). The
  driver's per-round work (selection, checkpoint, metrics, loggers) runs beside that, as the
  background writer does (it still takes a core of the driver's node); after the last round,
  which has no merge, the run ends when it is done.
* **Async** (``scheduler.mode: async``): an actor that finishes its T epochs reports and
  waits; once ``buffer`` = B reports are in, the driver merges from them (fetch, merge) and
  sends the merge to the actors that reported, which adopt it and go on; its per-round work
  for them runs in the background (it still takes a core of the driver's node). Staleness
  is bounded as in stale-synchronous-parallel training (Ho et al., 2013): a merge raises
  the version, and the driver holds a merge back while publishing it would leave an actor
  still training from a base more than ``max_staleness`` = S merges old; the reports that
  come in meanwhile join the merge. So no epoch is ever trained from a base more than S
  merges old and no work is thrown away; S = 0 (whatever B) is the sync schedule.
* **Faults.** Nodes are lost at exponential intervals (``node_mtbf_s`` for the whole
  cluster) and come back after ``node_return_s``; the actors on a lost node lose their
  current round, are rebuilt (``start_s``) on the live node with the fewest actors and redo
  the round from their restore point. A member that stops answering (``hang_probability``
  per actor-round) is replaced after a deadline of ``deadline_factor ×`` the median actor
  round time seen so far (the round's expected time before any is seen), then redoes its
  round. The driver's work holds a core of node 0 (where the driver runs).

The run ends when the population has trained ``epochs`` epochs per member on average
(K·N member-epochs that reached a merge or the end); :class:`SimResult` gives its wall time,
the cores' utilisation by useful member epochs, and the work lost.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import simpy

from popgrpo.config.schema import Config, checkpoint_due
from popgrpo.research.sim.costs import CostModel

__all__ = ["ClusterShape", "Mode", "Scheduling", "SimResult", "Workload", "simulate"]

Mode = Literal["sync", "async"]


@dataclass(frozen=True)
class ClusterShape:
    nodes: int = 1
    cores_per_node: int = 2


@dataclass(frozen=True)
class Workload:
    members: int
    epochs: int  # N: epochs per member, on average over the population
    interval: int  # T: epochs per round
    top_m: int = 2
    members_per_actor: int = 1
    straggler_sigma: float = 0.0
    node_mtbf_s: float | None = None
    node_return_s: float = 60.0
    hang_probability: float = 0.0
    deadline_factor: float = 3.0
    checkpoint_every: int = 1  # run.checkpoint_every: rounds (merges) between checkpoints

    @classmethod
    def of(cls, config: Config, **faults: Any) -> Workload:
        """The workload a run of ``config`` trains: its population, epochs, round length (the
        whole run when the scheduler is off), top M, members per actor and checkpoint interval;
        ``faults``: the other fields (stragglers, node failures, hangs)."""
        pop = config.population
        return cls(
            members=pop.size,
            epochs=config.run.epochs,
            interval=config.scheduler.interval_epochs if config.scheduler.enabled else config.run.epochs,
            top_m=config.scheduler.top_m,
            members_per_actor=pop.members_per_actor,
            checkpoint_every=config.run.checkpoint_every,
            **faults,
        )

    def checkpoint_due(self, index: int, last: bool = False) -> bool:
        """Whether round (merge) ``index`` writes a checkpoint, as a run decides it (:func:`checkpoint_due`)."""
        return checkpoint_due(index, self.checkpoint_every, last)

    @property
    def actors(self) -> int:
        return math.ceil(self.members / self.members_per_actor)


@dataclass(frozen=True)
class Scheduling:
    mode: Mode = "sync"
    buffer: int | None = None  # B, in actors' reports; None: every actor (K / members_per_actor)
    max_staleness: int = 0  # S

    def buffer_for(self, actors: int) -> int:
        return actors if self.mode == "sync" or self.buffer is None else max(1, min(self.buffer, actors))


@dataclass
class SimResult:
    wall_s: float
    useful_epochs: int  # member-epochs that reached a merge or the end
    wasted_epochs: int  # member-epochs dropped: lost with a node, a hung member, or too stale
    merges: int
    utilisation: float  # useful member-epoch core-seconds / (cores × wall)
    restarts: int
    held_s: float  # async: time merges were held back for staleness
    max_staleness_seen: int  # the oldest base (in merges) any epoch was trained from
    round_s: list[float] = field(default_factory=list)  # sync: each round's wall time
    # sync: from each round's last report to the next round's (round 1 on: merge, adopts, epochs)
    report_s: list[float] = field(default_factory=list)
    finished: bool = True  # False: the time limit came first (a hung sync run without a deadline)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("round_s", "report_s")} | {
            "mean_round_s": statistics.fmean(self.round_s) if self.round_s else None
        }


class _Actor:
    def __init__(self, index: int, node: int) -> None:
        self.index = index
        self.node = node
        self.base = 0  # the merge version it trains from
        self.rounds = 0  # rounds started, for the straggler draws
        self.progress = 0  # epochs done in the current round
        self.training = False  # inside robust_round: a lost node interrupts it
        self.rebuild = False  # lost while not training: rebuilt before its next call
        self.process: Any = None


class _Sim:
    def __init__(
        self, costs: CostModel, work: Workload, cluster: ClusterShape, sched: Scheduling, seed: int, limit_s: float
    ) -> None:
        if work.members < 1 or work.epochs < 1 or work.interval < 1:
            raise ValueError("members, epochs and interval must be at least 1")
        if cluster.nodes < 1 or cluster.cores_per_node < 1:
            raise ValueError("nodes and cores_per_node must be at least 1")
        self.env = simpy.Environment()
        self.costs, self.work, self.cluster, self.sched = costs, work, cluster, sched
        self.seed, self.limit_s = seed, limit_s
        self.cores = [simpy.Resource(self.env, capacity=cluster.cores_per_node) for _ in range(cluster.nodes)]
        self.live = [True] * cluster.nodes
        self.writer = simpy.Resource(self.env, capacity=1)  # the driver's background writer thread
        self.actors = [_Actor(i, i % cluster.nodes) for i in range(work.actors)]
        self.load = [0] * cluster.nodes  # actors placed on each node
        for a in self.actors:
            self.load[a.node] += 1
        self.sizes = [
            len(range(i * work.members_per_actor, min(work.members, (i + 1) * work.members_per_actor)))
            for i in range(work.actors)
        ]
        self.target = work.members * work.epochs
        self.useful = self.wasted = self.merges = self.restarts = 0
        self.held_s = 0.0
        self.reported = self.env.event()  # fires at each report: a held merge looks again
        self.busy_s = 0.0  # core-seconds of useful epochs
        self.round_times: list[float] = []  # actor rounds, for the hang deadline
        self.sync_rounds: list[float] = []
        self.sync_reports: list[float] = []  # when each sync round's last report came in
        self.version = 0
        self.staleness_seen = 0
        self.done = self.env.event()
        self.finishing = False
        self.buffer: list[_Actor] = []
        self.renewed: set[int] | None = None  # actors whose restore points changed since the last checkpoint; None: all
        self.waiting: dict[int, simpy.Event] = {}
        self.merge_wanted = self.env.event()

    # ---- costs -------------------------------------------------------------------------
    def multiplier(self, actor: _Actor) -> float:
        sigma = self.work.straggler_sigma
        if sigma <= 0:
            return 1.0
        rng = np.random.default_rng((self.seed, 1, actor.index, actor.rounds))
        return float(np.exp(sigma * rng.standard_normal() - sigma * sigma / 2))

    def hangs(self, actor: _Actor) -> bool:
        if self.work.hang_probability <= 0:
            return False
        rng = np.random.default_rng((self.seed, 2, actor.index, actor.rounds))
        return bool(rng.random() < self.work.hang_probability)

    def deadline(self, n_epochs: int) -> float:
        expected = self.costs.call_s + n_epochs * self.work.members_per_actor * self.costs.epoch_s
        seen = statistics.median(self.round_times) if self.round_times else expected
        return self.work.deadline_factor * seen

    def per_core(self, node: int) -> float:
        """Actors per core on ``node``: the ``x`` of the sharing costs."""
        return self.load[node] / self.cluster.cores_per_node

    def epoch_cost(self, actor: _Actor) -> float:
        """Core-seconds of one epoch of one member of ``actor``, among the actors on its node."""
        return self.costs.epoch_s * self.costs.contention(self.per_core(actor.node))

    def on_core(self, node: int, seconds: float) -> Generator[Any, Any, None]:
        """Hold a core of ``node`` for ``seconds`` of work, slowed by what else takes the node's cores."""
        speed = self.costs.core_speed(self.per_core(node))
        with self.cores[node].request() as req:
            yield req
            yield self.env.timeout(seconds / speed)

    def credit(self, actor: _Actor, n_epochs: int, core_s: float) -> None:
        self.useful += n_epochs * self.sizes[actor.index]
        self.busy_s += core_s
        if self.sched.mode == "async" and self.useful >= self.target and not self.finishing:
            self.finishing = True
            self.env.process(self.finish())

    def finish(self) -> Generator[Any, Any, None]:
        """The driver's last writes, as after a sync run's last round."""
        yield from self.driver_writes(self.work.members, checkpoint=True)
        self.done.succeed()

    # ---- one actor round -----------------------------------------------------------------
    def train_round(self, actor: _Actor, n_epochs: int) -> Generator[Any, Any, tuple[int, float]]:
        """T epochs of one actor; returns (epochs done, core-seconds). Raises Interrupt on a loss."""
        m = self.multiplier(actor)
        hung = self.hangs(actor)
        actor.rounds += 1
        actor.progress = 0
        start = self.env.now
        yield from self.rebuilt(actor)
        yield self.env.timeout(self.costs.call_s)
        if hung:  # stops answering: nothing more happens until the deadline replaces it
            yield self.env.timeout(self.deadline(n_epochs))
            self.restarts += 1
            yield self.env.timeout(self.costs.start_s)
            if self.sched.mode == "async":  # the replacement starts from the current merge
                actor.base = self.version
            return (yield from self.train_round(actor, n_epochs))
        core_s = 0.0
        for e in range(n_epochs):
            self.staleness_seen = max(self.staleness_seen, self.version - actor.base)
            seconds = m * self.sizes[actor.index] * self.epoch_cost(actor)
            yield from self.on_core(actor.node, seconds)
            core_s += seconds
            actor.progress = e + 1
        if self.costs.actor_call_cpu_s > 0:
            yield from self.on_core(actor.node, self.costs.actor_call_cpu_s)
        self.round_times.append(self.env.now - start)
        return n_epochs, core_s

    def robust_round(self, actor: _Actor, n_epochs: int) -> Generator[Any, Any, tuple[int, float]]:
        """:meth:`train_round`, redone from the restore point after the actor's node is lost."""
        actor.training = True
        lost = False
        try:
            while True:
                try:  # a node lost during the rebuild interrupts it too
                    if lost:
                        yield self.env.timeout(self.costs.start_s)
                    return (yield from self.train_round(actor, n_epochs))
                except simpy.Interrupt:
                    lost = True
                    self.restarts += 1
                    self.wasted += actor.progress * self.sizes[actor.index]
                    actor.progress = 0
        finally:
            actor.training = False

    def rebuilt(self, actor: _Actor) -> Generator[Any, Any, None]:
        """An actor lost while idle (waiting for a merge, adopting) is rebuilt before its next call."""
        if actor.rebuild:
            actor.rebuild = False
            self.restarts += 1
            yield self.env.timeout(self.costs.start_s)

    def least_loaded_node(self) -> int:
        return min((n for n in range(self.cluster.nodes) if self.live[n]), key=lambda n: self.load[n], default=0)

    def adopt(self, actor: _Actor, version: int) -> Generator[Any, Any, None]:
        actor.base = version  # it trains from this merge once adopted
        yield from self.rebuilt(actor)
        yield self.env.timeout(self.costs.call_s)
        yield from self.on_core(actor.node, self.costs.adopt_s(self.costs.weight_bytes) * self.sizes[actor.index])
        actor.base = version

    def driver_merge(self) -> Generator[Any, Any, None]:
        """Fetch the top-M members' weights and merge them, on the driver."""
        c = self.costs
        m = min(self.work.top_m, self.work.members)
        yield from self.on_core(0, c.call_s + m * c.fetch_s(c.weight_bytes) + c.merge_s(m))

    def driver_writes(self, members: int, checkpoint: bool, written: int | None = None) -> Generator[Any, Any, None]:
        """The driver's per-round work for ``members`` members' rows: selection, metrics, loggers
        and, when ``checkpoint``, the checkpoint, which holds every member's state: ``written``
        of them serialised (default: all), the others' files linked from the checkpoint before
        (:class:`~popgrpo.telemetry.checkpoint.Checkpointer`); one writer thread does them, a
        round at a time, in order."""
        total = self.work.members
        written = total if written is None else min(written, total)
        with self.writer.request() as turn:
            yield turn
            cost = self.costs.driver_cost(members, checkpoint, checkpointed=written, linked=total - written)
            yield from self.on_core(0, cost)

    # ---- schedules -----------------------------------------------------------------------
    def adopt_then_train(
        self, actor: _Actor, version: int | None, n_epochs: int
    ) -> Generator[Any, Any, tuple[int, float]]:
        """An actor's sync round: the merge ``version`` adopted first (none in round 0), then
        its epochs right behind, as the real actor runs the train call queued behind its adopt."""
        if version is not None:
            yield from self.adopt(actor, version)
        return (yield from self.robust_round(actor, n_epochs))

    def sync(self) -> Generator[Any, Any, None]:
        lengths = [self.work.interval] * (self.work.epochs // self.work.interval)
        if self.work.epochs % self.work.interval:
            lengths.append(self.work.epochs % self.work.interval)
        adopting: int | None = None  # the merge the actors adopt before their next round
        last = len(lengths) - 1
        for r, n_epochs in enumerate(lengths):
            start = self.env.now
            procs = {a.index: self.env.process(self.adopt_then_train(a, adopting, n_epochs)) for a in self.actors}
            for a in self.actors:
                a.process = procs[a.index]
            # The round's robust_round processes set ``training`` when they start; a node lost
            # before that (while adopting, say) moves the actor and has it rebuilt (:meth:`rebuilt`).
            yield self.env.all_of(list(procs.values()))
            self.sync_reports.append(self.env.now)
            for a in self.actors:
                n_epochs, core_s = cast(tuple[int, float], procs[a.index].value)
                self.credit(a, n_epochs, core_s)
            if r < last:
                yield from self.driver_merge()
                self.version += 1
                self.merges += 1
                adopting = self.version
                # The background writer records the round while the members adopt and train on.
                self.env.process(self.driver_writes(self.work.members, self.work.checkpoint_due(r)))
            else:  # the run ends once the writer has written the last round
                yield from self.driver_writes(self.work.members, checkpoint=True)
            self.sync_rounds.append(self.env.now - start)

    def async_actor(self, actor: _Actor) -> Generator[Any, Any, None]:
        while not self.finishing:
            actor.process = self.env.process(self.robust_round(actor, self.work.interval))
            n_epochs, core_s = yield actor.process
            if self.finishing:
                return
            self.credit(actor, n_epochs, core_s)
            if self.finishing:
                return
            event = self.env.event()
            self.waiting[actor.index] = event
            self.buffer.append(actor)
            self.staleness_seen = max(self.staleness_seen, self.version - actor.base)
            self.reported.succeed()
            self.reported = self.env.event()
            if len(self.buffer) >= self.sched.buffer_for(len(self.actors)) and not self.merge_wanted.triggered:
                self.merge_wanted.succeed()
            version = yield event
            yield from self.adopt(actor, version)

    def may_merge(self) -> bool:
        """A merge now leaves no actor still training from a base more than S merges old."""
        waiting = {a.index for a in self.buffer}
        oldest = min((a.base for a in self.actors if a.index not in waiting), default=self.version + 1)
        return self.version + 1 - oldest <= self.sched.max_staleness

    def async_driver(self) -> Generator[Any, Any, None]:
        while True:
            yield self.merge_wanted
            held = self.env.now
            while not self.may_merge():
                yield self.reported
            self.held_s += self.env.now - held
            self.merge_wanted = self.env.event()
            reporters, self.buffer = self.buffer, []
            yield from self.driver_merge()
            self.version += 1
            self.merges += 1
            for a in reporters:
                self.waiting.pop(a.index).succeed(self.version)
            # Off the critical path: a background writer records the merge while members train;
            # its checkpoint (when due) holds every member's restore point, of which only those
            # renewed since the last checkpoint (the reporters' since) are serialised again.
            if self.renewed is not None:
                self.renewed.update(a.index for a in reporters)
            due = self.work.checkpoint_due(self.merges - 1)
            written = None if self.renewed is None else len(self.renewed) * self.work.members_per_actor
            if due:
                self.renewed = set()
            self.env.process(self.driver_writes(len(reporters) * self.work.members_per_actor, due, written))
            if len(self.buffer) >= self.sched.buffer_for(len(self.actors)) and not self.merge_wanted.triggered:
                self.merge_wanted.succeed()

    def node_faults(self) -> Generator[Any, Any, None]:
        mtbf = self.work.node_mtbf_s
        if mtbf is None or self.cluster.nodes < 2:
            return
        rng = np.random.default_rng((self.seed, 3))
        while True:
            yield self.env.timeout(float(rng.exponential(mtbf)))
            live = [n for n in range(self.cluster.nodes) if self.live[n]]
            if len(live) < 2:
                continue
            node = int(rng.choice(live))
            self.live[node] = False
            for a in self.actors:
                if a.node != node:
                    continue
                self.load[a.node] -= 1
                a.node = self.least_loaded_node()
                self.load[a.node] += 1
                if a.training and a.process is not None and a.process.is_alive:
                    a.process.interrupt("node lost")
                else:
                    a.rebuild = True
            self.env.process(self.node_returns(node))

    def node_returns(self, node: int) -> Generator[Any, Any, None]:
        yield self.env.timeout(self.work.node_return_s)
        self.live[node] = True

    def run(self) -> SimResult:
        if self.sched.mode == "sync":
            main = self.env.process(self.sync())
            self.env.process(self._end_with(main))
        else:
            for a in self.actors:
                self.env.process(self.async_actor(a))
            self.env.process(self.async_driver())
        self.env.process(self.node_faults())
        self.env.run(until=self.env.any_of([self.done, self.env.timeout(self.limit_s)]))
        finished = self.done.triggered
        wall = self.env.now
        cores = self.cluster.nodes * self.cluster.cores_per_node
        return SimResult(
            wall_s=wall,
            useful_epochs=self.useful,
            wasted_epochs=self.wasted,
            merges=self.merges,
            utilisation=self.busy_s / (cores * wall) if wall > 0 else 0.0,
            restarts=self.restarts,
            held_s=self.held_s,
            max_staleness_seen=self.staleness_seen,
            round_s=self.sync_rounds,
            report_s=[b - a for a, b in zip(self.sync_reports, self.sync_reports[1:], strict=False)],
            finished=finished,
        )

    def _end_with(self, process: Any) -> Generator[Any, Any, None]:
        yield process
        if not self.done.triggered:
            self.done.succeed()


def simulate(
    costs: CostModel,
    workload: Workload,
    cluster: ClusterShape | None = None,
    scheduling: Scheduling | None = None,
    seed: int = 0,
    limit_s: float = 1e9,
) -> SimResult:
    """Simulate one run; see the module docstring for the model. Deterministic given ``seed``."""
    return _Sim(costs, workload, cluster or ClusterShape(), scheduling or Scheduling(), seed, limit_s).run()
