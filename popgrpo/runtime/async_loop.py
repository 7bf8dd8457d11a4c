"""Asynchronous rounds (``scheduler.mode: async``): the driver as an event loop over reports.

Every member actor (a group of ``population.members_per_actor`` members, which report
together) trains its rounds of T epochs on its own; the driver waits for whichever finishes
first (``ray.wait(num_returns=1)`` in :meth:`RayExecutor.wait_train`), or, with
``scheduler.order: logical``, for the call due next by its logical finish time (the logical
time it started plus its members' seeded straggler delays,
:func:`~popgrpo.algorithms.async_rounds.logical_finish`), so the order is the seed's, not
the machine's. A report in a
member's last round is final; any other waits in the buffer for a merge. When
:func:`~popgrpo.algorithms.async_rounds.merge_due` says so, the round's end is carried out
for the buffered members only, by the same code as a sync round's
(:meth:`~popgrpo.runtime.scheduler.PopulationRounds.end_round`: ``scheduler.population``'s
decision over that subset, ordered by member id, never by arrival); they adopt what it gives
them and start their next round; members still training are not touched. The merge's number
keys the cyclic objective, the merge stream and the mutations (a member adopts a given merge
at most once), so with ``max_staleness`` 0 (every merge waits for everyone) the run is the
sync run, bit for bit.

Each merge's decision (which actors' reports it takes) goes to the event log
(``decided``, ``merges.jsonl``) before it is carried out; a resumed run replays the logged
decisions its checkpoint does not hold (``replay``), whatever order the reports then come in.
Each merge is written as it happens (``on_merge``: metrics of every report since the last
write, the lineage record with an ``async`` part: the merge's number, the members whose
reports it used with their bases and rounds, and the members still training with their
bases; loggers; a checkpoint of every member's restore point and of where each actor is,
from which ``popgrpo train --resume`` continues). A member actor that is lost is rebuilt
from its members' restore points (the states their last ``adopt`` sent back) and redoes its
round; the others go on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from popgrpo.algorithms.archive_service import LocalArchiveState
from popgrpo.algorithms.async_rounds import logical_finish, merge_due, merge_members, next_logical, straggler_delay
from popgrpo.config import Config
from popgrpo.runtime.executor import Executor
from popgrpo.runtime.scheduler import PopulationRounds, round_lengths

__all__ = ["AsyncExecutor", "AsyncRounds", "AsyncState", "AsyncStateError", "parse_async_state"]


class AsyncStateError(ValueError):
    """A checkpoint's asynchronous-rounds state (``extra.async`` of its manifest) is malformed
    or does not fit the run (one line, naming the field)."""


class AsyncState(BaseModel):
    """Where every member actor is at a merge: ``extra.async`` of the checkpoint's manifest.

    Per actor (``executor.groups`` order): the round it trains and the merge it trains from.
    ``finished``: actors done with their last round; ``in_flight``: the others, in the order
    their calls were made (their reports are redone on resume); ``keys``: each in-flight
    call's logical finish time and call number (``scheduler.order=logical``), ``clock`` the
    logical time of the last report taken, ``calls`` the calls made; ``rows``: metrics rows
    written up to this merge.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    merges: int = Field(ge=0)
    round_of: list[Annotated[int, Field(ge=0)]]
    base_of: list[Annotated[int, Field(ge=0)]]
    finished: list[Annotated[int, Field(ge=0)]]
    in_flight: list[Annotated[int, Field(ge=0)]]
    keys: list[tuple[float, Annotated[int, Field(ge=0)]]] | None = None
    clock: float = Field(default=0.0, ge=0)
    calls: int = Field(default=0, ge=0)
    rows: int = Field(ge=0)

    def check(self, n_actors: int, n_rounds: int) -> None:
        """Raise :class:`AsyncStateError` unless the state fits ``n_actors`` actors training ``n_rounds`` rounds."""
        for name in ("round_of", "base_of"):
            if len(getattr(self, name)) != n_actors:
                raise AsyncStateError(
                    f"extra.async.{name}: {len(getattr(self, name))} entries for {n_actors} member actors"
                )
        if max(self.round_of, default=0) >= n_rounds:
            raise AsyncStateError(f"extra.async.round_of: a round past the run's last ({n_rounds - 1})")
        if max(self.base_of, default=0) > self.merges:
            raise AsyncStateError(f"extra.async.base_of: a base past the last merge ({self.merges})")
        actors = [*self.finished, *self.in_flight]
        if sorted(actors) != list(range(n_actors)):
            raise AsyncStateError(
                f"extra.async: finished and in_flight must hold each of the {n_actors} member actors once"
            )
        if self.keys is not None and len(self.keys) != len(self.in_flight):
            raise AsyncStateError("extra.async.keys: one (finish, call) pair per in_flight actor")


def parse_async_state(raw: object) -> AsyncState:
    """``extra.async`` of a checkpoint manifest, validated; :class:`AsyncStateError` (one line) if malformed."""
    try:
        return AsyncState.model_validate_json(json.dumps(raw))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise AsyncStateError(f"extra.async{'.' + where if where else ''}: {error['msg']}") from None


class AsyncExecutor(Executor, Protocol):
    """What asynchronous rounds need of an executor beyond :class:`Executor` (both have it)."""

    @property
    def groups(self) -> list[list[int]]: ...

    def submit_train(self, g: int, n_epochs: int) -> Any: ...

    def wait_train(self, handles: list[Any]) -> tuple[Any, dict[int, list[dict]]]: ...

    def restore_points(self) -> tuple[list[dict], list[LocalArchiveState]]:
        """Every member's state when it last adopted a merge (or its initial state), and the
        archives' states that go with them; the first call must come while no actor is busy."""
        ...


class AsyncRounds:
    """The asynchronous round loop: ``AsyncRounds(config, executor, on_merge, ...).run()`` trains
    every member ``run.epochs`` epochs in asynchronous rounds. While an actor trains, the others
    report into a buffer, and a merge is carried out as soon as one is due. :meth:`run` reads
    like the synchronous loop: wait for a report, merge when due, tell the caller.

    ``on_merge(merge, epoch_end, rows_per_member, record, state)`` follows each merge
    (``record`` its lineage) and the end of the run (``record`` None); ``rows_per_member``
    holds the rows reported since the previous call (empty lists for the members that did not
    report), ``state`` where every actor is (:class:`AsyncState`'s fields, JSON-able), for the
    checkpoint. A resumed run passes the checkpoint's ``state`` back, with its members already
    at their restore points: every actor that had not finished redoes its round from there.

    ``decided(entry)`` is called with each merge's decision (``merge``, ``actors``,
    ``members``) before the merge is carried out: the event log. ``replay`` (merge number →
    actors) holds decisions an interrupted run logged but did not checkpoint: such a merge
    waits for exactly those actors' reports and merges them, whatever else has reported.

    ``rounds`` carries out each merge (default: a new :class:`PopulationRounds`; a caller that
    checkpoints passes its own, as for :func:`~popgrpo.runtime.scheduler.run_rounds`, to save
    and restore the frontier store).
    """

    def __init__(
        self,
        config: Config,
        executor: AsyncExecutor,
        on_merge: Callable[[int, int, list[list[dict]], dict | None, dict | None], None],
        state: AsyncState | None = None,
        decided: Callable[[dict], None] | None = None,
        replay: Mapping[int, Sequence[int]] | None = None,
        rounds: PopulationRounds | None = None,
    ) -> None:
        self.config, self.executor, self.on_merge, self.decided = config, executor, on_merge, decided
        self.lengths = round_lengths(config.run.epochs, config.scheduler.interval_epochs)
        self.last_round = len(self.lengths) - 1
        self.groups = executor.groups
        self.buffer_size = config.scheduler.buffer or config.population.size
        self.logical = config.scheduler.order == "logical"
        self.replay = dict(replay or {})
        if state is not None:
            state.check(len(self.groups), len(self.lengths))
        for merge, actors in self.replay.items():
            if not set(actors) <= set(range(len(self.groups))) - set(state.finished if state else ()):
                raise AsyncStateError(
                    f"merges.jsonl: merge {merge} names actors {sorted(actors)}, not all of them training"
                )
        n_groups = len(self.groups)
        self.version = state.merges if state else 0
        self.round_of = list(state.round_of) if state else [0] * n_groups  # the round each actor trains
        self.base_of = list(state.base_of) if state else [0] * n_groups  # the merge it trains from
        self.finished: set[int] = set(state.finished) if state else set()
        self.clock = state.clock if state else 0.0  # logical time of the last report taken
        self.calls = state.calls if state else 0  # train calls made: ties of logical order
        executor.restore_points()  # taken now, while no actor is busy
        self.training = set(range(n_groups)) - self.finished
        # Submitted in the order the interrupted run had them in flight: in-process, that order is
        # the order of the reports, so a resumed run merges as the uninterrupted one would.
        self.order = list(state.in_flight) if state else sorted(self.training)
        self.keys: dict[int, tuple[float, int]] = {}  # actor not yet merged → (logical finish, call number)
        if state is not None and state.keys is not None:
            self.keys = dict(zip(self.order, state.keys, strict=True))
        self.handles: list[Any] = []
        self.buffer: list[int] = []
        self.pending: dict[int, list[dict]] = {k: [] for k in range(executor.n_members)}  # rows not yet written
        self.reported: dict[int, list[dict]] = {}  # rows of the reports in the buffer, which their merge reads
        self.rounds = PopulationRounds(config, executor) if rounds is None else rounds

    def run(self) -> None:
        for g in self.order:
            self.submit(g)
        while self.training or self.buffer:
            merging = self.due()
            if merging is not None:
                epoch_end, record = self.merge(merging)
                self.flush(self.version - 1, epoch_end, record)
            else:
                self.take_report()
        self.flush(self.version, self.config.run.epochs, None)

    def submit(self, g: int) -> None:
        """Send actor ``g`` its round (a call sent ahead behind its adopt call is taken over)."""
        if g not in self.keys:
            delays = {k: _delay(self.config, k, self.round_of[g]) for k in self.groups[g]}
            self.keys[g] = (logical_finish(self.clock, self.groups[g], delays), self.calls)
            self.calls += 1
        self.handles.append(self.executor.submit_train(g, self.lengths[self.round_of[g]]))

    def due(self) -> list[int] | None:
        """The actors a merge would take now, if one is due (a replayed merge waits for its actors)."""
        if self.version in self.replay:
            merging = sorted(self.replay[self.version])
            return merging if set(merging) <= set(self.buffer) else None
        groups, training = self.groups, self.training
        may_still_report = sum(len(groups[g]) for g in training if self.round_of[g] < self.last_round)
        buffered = sum(len(groups[g]) for g in self.buffer)
        bases = [self.base_of[g] for g in training]
        sched = self.config.scheduler
        if merge_due(buffered, self.buffer_size, may_still_report, self.version, bases, sched.max_staleness):
            return sorted(self.buffer)
        return None

    def merge(self, merging: list[int]) -> tuple[int, dict]:
        """Merge the reports of ``merging``; each of them adopts and starts its next round.
        Returns the merge's last epoch and its lineage record."""
        groups = self.groups
        members = merge_members(groups[g] for g in merging)
        if self.decided is not None:
            self.decided({"merge": self.version, "actors": merging, "members": members})
        rows = [self.reported.pop(k) for k in members]  # each reporter's rows of the round it reported
        epoch_end = max(int(r[-1]["epoch"]) for r in rows) + 1
        # Each merging actor's next round is sent right behind its adopt call (submit() below
        # takes those calls over): it trains on as soon as it has adopted.
        self.executor.train_after_adopt({g: self.lengths[self.round_of[g] + 1] for g in merging})
        record = self.rounds.end_round(self.version, epoch_end, members, rows)
        record["async"] = {
            "merge": self.version,
            "members": members,
            "bases": {str(k): self.base_of[g] for g in merging for k in groups[g]},
            "rounds": {str(k): self.round_of[g] for g in merging for k in groups[g]},
            "still_training": {str(k): self.base_of[g] for g in sorted(self.training) for k in groups[g]},
        }
        self.version += 1
        self.buffer = [g for g in self.buffer if g not in merging]
        for g in merging:
            self.base_of[g], self.round_of[g] = self.version, self.round_of[g] + 1
            del self.keys[g]
            self.submit(g)
            self.training.add(g)
        return epoch_end, record

    def take_report(self) -> None:
        """Wait for the next report (logical order: the one due next, whoever else has finished)."""
        if self.logical:
            first = next_logical({h[0]: self.keys[h[0]] for h in self.handles})
            mine = [h for h in self.handles if h[0] == first]
            handle, rows = self.executor.wait_train(mine)
            self.handles = [h for h in self.handles if h[0] != first]
        else:
            handle, rows = self.executor.wait_train(self.handles)
            self.handles.remove(handle)
        g = handle[0]
        self.clock = max(self.clock, self.keys[g][0])
        self.training.discard(g)
        for k, member_rows in rows.items():
            self.pending[k].extend(member_rows)
            self.reported[k] = member_rows
        if self.round_of[g] < self.last_round:
            self.buffer.append(g)
        else:
            self.finished.add(g)
            del self.keys[g]

    def flush(self, merge: int, epoch_end: int, record: dict | None) -> None:
        """Hand the rows reported since the last call, the record and where every actor is to ``on_merge``."""
        rows = [self.pending[k] for k in range(self.executor.n_members)]
        if record is None and not any(rows):
            return  # a resumed run that had already finished every round
        for k in self.pending:
            self.pending[k] = []
        # Reports a replayed merge left in the buffer count as in flight: a resumed run redoes them.
        in_flight = [*self.buffer, *(h[0] for h in self.handles)]
        where = {
            "merges": self.version,
            "round_of": self.round_of,
            "base_of": self.base_of,
            "finished": sorted(self.finished),
            "in_flight": in_flight,
            "keys": [list(self.keys[g]) for g in in_flight],
            "clock": self.clock,
            "calls": self.calls,
        }
        self.on_merge(merge, epoch_end, rows, record, where)


def _delay(config: Config, member: int, round_index: int) -> float:
    """Member ``member``'s seeded straggler delay in round ``round_index`` (0 when off)."""
    straggler = config.population.straggler
    return straggler_delay(config.run.seed, member, round_index, straggler.scale_s, straggler.sigma)
