"""Asynchronous rounds (``scheduler.mode: async``): the driver as an event loop over reports.

Every member actor (a group of ``population.members_per_actor`` members, which report
together) trains its rounds of T epochs on its own; the driver waits for whichever finishes
first (``ray.wait(num_returns=1)`` in :meth:`RayExecutor.wait_train`). A report in a
member's last round is final; any other waits in the buffer for a merge. When
:func:`~popgrpo.algorithms.async_rounds.merge_due` says so, the round's end is carried out
for the buffered members only, by the same code as a sync round's
(:meth:`~popgrpo.runtime.scheduler.PopulationRounds.end_round`: ``scheduler.population``'s
decision over that subset, ordered by member id, never by arrival); they adopt what it gives
them and start their next round; members still training are not touched. The merge's number
keys the cyclic objective, the merge stream and the mutations (a member adopts a given merge
at most once), so with ``max_staleness`` 0 (every merge waits for everyone) the run is the
sync run, bit for bit.

Each merge is written as it happens (``on_merge``: metrics of every report since the last
write, the lineage record with an ``async`` part: the merge's number, the members whose
reports it used with their bases and rounds, and the members still training with their
bases; loggers; a checkpoint of every member's restore point and of where each actor is,
from which ``popgrpo train --resume`` continues). A member actor that is lost is rebuilt
from its members' restore points (the states their last ``adopt`` sent back) and redoes its
round; the others go on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from popgrpo.algorithms.archive_service import LocalArchiveState
from popgrpo.algorithms.async_rounds import merge_due, merge_members
from popgrpo.config import Config
from popgrpo.runtime.executor import Executor
from popgrpo.runtime.scheduler import PopulationRounds, round_lengths

__all__ = ["AsyncExecutor", "run_async"]


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
    state: Mapping[str, Any] | None = None,
    rounds: PopulationRounds | None = None,
) -> None:
    """Train every member ``run.epochs`` epochs in asynchronous rounds.

    ``on_merge(merge, epoch_end, rows_per_member, record, state)`` follows each merge
    (``record`` its lineage) and the end of the run (``record`` None); ``rows_per_member``
    holds the rows reported since the previous call (empty lists for the members that did not
    report), ``state`` where every actor is (JSON-able: the number of merges, each actor's
    round and base, the actors that have finished), for the checkpoint. A resumed run passes
    the checkpoint's ``state`` back, with its members already at their restore points: every
    actor that had not finished redoes its round from there. ``rounds`` carries out each
    merge (default: a new :class:`PopulationRounds`; a caller that checkpoints passes its own,
    as for :func:`~popgrpo.runtime.scheduler.run_rounds`, to save and restore the frontier store).
    """
    sched = config.scheduler
    lengths = round_lengths(config.run.epochs, sched.interval_epochs)
    last_round = len(lengths) - 1
    groups = executor.groups
    buffer_size = sched.buffer or config.population.size
    version = int(state["merges"]) if state else 0
    round_of = list(state["round_of"]) if state else [0] * len(groups)  # the round each actor trains
    base_of = list(state["base_of"]) if state else [0] * len(groups)  # the merge it trains from
    finished: set[int] = set(state["finished"]) if state else set()
    executor.restore_points()  # taken now, while no actor is busy
    training = set(range(len(groups))) - finished
    # Submitted in the order the interrupted run had them in flight: in-process, that order is
    # the order of the reports, so a resumed run merges as the uninterrupted one would.
    order = list(state["in_flight"]) if state else sorted(training)
    handles = [executor.submit_train(g, lengths[round_of[g]]) for g in order]
    buffer: list[int] = []
    pending: dict[int, list[dict]] = {k: [] for k in range(executor.n_members)}
    rounds = PopulationRounds(config, executor) if rounds is None else rounds

    def flush(merge: int, epoch_end: int, record: dict | None) -> None:
        rows = [pending[k] for k in range(executor.n_members)]
        if record is None and not any(rows):
            return  # a resumed run that had already finished every round
        for k in pending:
            pending[k] = []
        where = {
            "merges": version,
            "round_of": round_of,
            "base_of": base_of,
            "finished": sorted(finished),
            "in_flight": [h[0] for h in handles],
        }
        on_merge(merge, epoch_end, rows, record, where)

    while training or buffer:
        may_still_report = sum(len(groups[g]) for g in training if round_of[g] < last_round)
        buffered = sum(len(groups[g]) for g in buffer)
        bases = [base_of[g] for g in training]
        if merge_due(buffered, buffer_size, may_still_report, version, bases, sched.max_staleness):
            merging = sorted(buffer)
            members = merge_members(groups[g] for g in merging)
            rows = [pending[k] for k in members]  # each reporter's rows of the round it reported
            epoch_end = max(int(r[-1]["epoch"]) for r in rows) + 1
            record = rounds.end_round(version, epoch_end, members, rows)
            record["async"] = {
                "merge": version,
                "members": members,
                "bases": {str(k): base_of[g] for g in merging for k in groups[g]},
                "rounds": {str(k): round_of[g] for g in merging for k in groups[g]},
                "still_training": {str(k): base_of[g] for g in sorted(training) for k in groups[g]},
            }
            version += 1
            buffer = []
            for g in merging:
                base_of[g], round_of[g] = version, round_of[g] + 1
                handles.append(executor.submit_train(g, lengths[round_of[g]]))
                training.add(g)
            flush(version - 1, epoch_end, record)
            continue
        handle, rows = executor.wait_train(handles)
        handles.remove(handle)
        g = handle[0]
        training.discard(g)
        for k, member_rows in rows.items():
            pending[k].extend(member_rows)
        if round_of[g] < last_round:
            buffer.append(g)
        else:
            finished.add(g)
    flush(version, config.run.epochs, None)
