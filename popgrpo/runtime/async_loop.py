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

__all__ = ["AsyncExecutor", "AsyncState", "AsyncStateError", "parse_async_state", "run_async"]


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


def run_async(
    config: Config,
    executor: AsyncExecutor,
    on_merge: Callable[[int, int, list[list[dict]], dict | None, dict | None], None],
    state: AsyncState | None = None,
    decided: Callable[[dict], None] | None = None,
    replay: Mapping[int, Sequence[int]] | None = None,
    rounds: PopulationRounds | None = None,
) -> None:
    """Train every member ``run.epochs`` epochs in asynchronous rounds.

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
    sched = config.scheduler
    lengths = round_lengths(config.run.epochs, sched.interval_epochs)
    last_round = len(lengths) - 1
    groups = executor.groups
    buffer_size = sched.buffer or config.population.size
    logical = sched.order == "logical"
    replay = dict(replay or {})
    if state is not None:
        state.check(len(groups), len(lengths))
    for merge, actors in (replay or {}).items():
        if not set(actors) <= set(range(len(groups))) - set(state.finished if state else ()):
            raise AsyncStateError(
                f"merges.jsonl: merge {merge} names actors {sorted(actors)}, not all of them training"
            )
    version = state.merges if state else 0
    round_of = list(state.round_of) if state else [0] * len(groups)  # the round each actor trains
    base_of = list(state.base_of) if state else [0] * len(groups)  # the merge it trains from
    finished: set[int] = set(state.finished) if state else set()
    clock = state.clock if state else 0.0  # logical time of the last report taken
    calls = state.calls if state else 0  # train calls made: ties of logical order
    executor.restore_points()  # taken now, while no actor is busy
    training = set(range(len(groups))) - finished
    # Submitted in the order the interrupted run had them in flight: in-process, that order is
    # the order of the reports, so a resumed run merges as the uninterrupted one would.
    order = list(state.in_flight) if state else sorted(training)
    keys: dict[int, tuple[float, int]] = {}  # actor not yet merged → (logical finish, call number)
    if state is not None and state.keys is not None:
        keys = dict(zip(order, state.keys, strict=True))
    handles: list[Any] = []

    def submit(g: int) -> None:
        nonlocal calls
        if g not in keys:
            delays = {k: _delay(config, k, round_of[g]) for k in groups[g]}
            keys[g] = (logical_finish(clock, groups[g], delays), calls)
            calls += 1
        handles.append(executor.submit_train(g, lengths[round_of[g]]))

    for g in order:
        submit(g)
    buffer: list[int] = []
    pending: dict[int, list[dict]] = {k: [] for k in range(executor.n_members)}  # rows not yet written
    reported: dict[int, list[dict]] = {}  # rows of the reports in the buffer, which their merge reads
    rounds = PopulationRounds(config, executor) if rounds is None else rounds

    def flush(merge: int, epoch_end: int, record: dict | None) -> None:
        rows = [pending[k] for k in range(executor.n_members)]
        if record is None and not any(rows):
            return  # a resumed run that had already finished every round
        for k in pending:
            pending[k] = []
        # Reports a replayed merge left in the buffer count as in flight: a resumed run redoes them.
        in_flight = [*buffer, *(h[0] for h in handles)]
        where = {
            "merges": version,
            "round_of": round_of,
            "base_of": base_of,
            "finished": sorted(finished),
            "in_flight": in_flight,
            "keys": [list(keys[g]) for g in in_flight],
            "clock": clock,
            "calls": calls,
        }
        on_merge(merge, epoch_end, rows, record, where)

    while training or buffer:
        if version in replay:
            merging = sorted(replay[version])
            due = set(merging) <= set(buffer)
        else:
            may_still_report = sum(len(groups[g]) for g in training if round_of[g] < last_round)
            buffered = sum(len(groups[g]) for g in buffer)
            bases = [base_of[g] for g in training]
            merging = sorted(buffer)
            due = merge_due(buffered, buffer_size, may_still_report, version, bases, sched.max_staleness)
        if due:
            members = merge_members(groups[g] for g in merging)
            if decided is not None:
                decided({"merge": version, "actors": merging, "members": members})
            rows = [reported.pop(k) for k in members]  # each reporter's rows of the round it reported
            epoch_end = max(int(r[-1]["epoch"]) for r in rows) + 1
            # Each merging actor's next round is sent right behind its adopt call (submit() below
            # takes those calls over): it trains on as soon as it has adopted.
            executor.train_after_adopt({g: lengths[round_of[g] + 1] for g in merging})
            record = rounds.end_round(version, epoch_end, members, rows)
            record["async"] = {
                "merge": version,
                "members": members,
                "bases": {str(k): base_of[g] for g in merging for k in groups[g]},
                "rounds": {str(k): round_of[g] for g in merging for k in groups[g]},
                "still_training": {str(k): base_of[g] for g in sorted(training) for k in groups[g]},
            }
            version += 1
            buffer = [g for g in buffer if g not in merging]
            for g in merging:
                base_of[g], round_of[g] = version, round_of[g] + 1
                del keys[g]
                submit(g)
                training.add(g)
            flush(version - 1, epoch_end, record)
            continue
        if logical:  # wait for the report due next, whoever else has finished
            first = next_logical({h[0]: keys[h[0]] for h in handles})
            mine = [h for h in handles if h[0] == first]
            handle, rows = executor.wait_train(mine)
            handles = [h for h in handles if h[0] != first]
        else:
            handle, rows = executor.wait_train(handles)
            handles.remove(handle)
        g = handle[0]
        clock = max(clock, keys[g][0])
        training.discard(g)
        for k, member_rows in rows.items():
            pending[k].extend(member_rows)
            reported[k] = member_rows
        if round_of[g] < last_round:
            buffer.append(g)
        else:
            finished.add(g)
            del keys[g]
    flush(version, config.run.epochs, None)


def _delay(config: Config, member: int, round_index: int) -> float:
    """Member ``member``'s seeded straggler delay in round ``round_index`` (0 when off)."""
    straggler = config.population.straggler
    return straggler_delay(config.run.seed, member, round_index, straggler.scale_s, straggler.sigma)
