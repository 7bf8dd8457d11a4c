"""The decisions of asynchronous rounds (``scheduler.mode: async``), as pure functions.

A member (or a packed group of members, which reports as one) trains T epochs from a *base*,
the merge version it adopted last (0: its initial weights), and reports. The driver keeps the
reports that wait for a merge in a buffer. :func:`merge_due` says when to merge:

* once ``buffer`` = B members have reported, or as many as can still report this round
  (members in their last round do not wait for a merge; when fewer than B are left, the
  merge takes those);
* and only if publishing the merge leaves no member that is still training with a base more
  than ``max_staleness`` = S merges old (:func:`held_back`; stale-synchronous parallel, Ho et
  al. 2013). A held merge waits for the slow members' reports, which join it.

So S = 0 merges only when nobody is training: every member's report, the sync schedule,
whatever B. A merge is computed from the reports in the buffer, ordered by member id, never
by arrival (:func:`merge_members`), so the same reports give the same merge.

Which reports are in the buffer when a merge is due depends on the order they are taken in.
``scheduler.order: logical`` takes them by :func:`logical_finish` (the logical time a call
started plus its seeded straggler delay, :func:`straggler_delay`), so that order, and with it
the whole run, is a function of the seed alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from popgrpo.core.seeding import STREAM_STRAGGLER, derive_seed

__all__ = ["held_back", "logical_finish", "merge_due", "merge_members", "next_logical", "straggler_delay"]


def held_back(version: int, training_bases: Iterable[int], max_staleness: int) -> bool:
    """Would merge ``version + 1`` leave a member that is training from a base more than S merges old?

    ``training_bases``: the base version of every member still training (any round).
    """
    oldest = min(training_bases, default=version + 1)
    return version + 1 - oldest > max_staleness


def merge_due(
    buffered: int,
    buffer: int,
    may_still_report: int,
    version: int,
    training_bases: Iterable[int],
    max_staleness: int,
) -> bool:
    """Merge now? ``buffered``: members whose reports wait for a merge; ``may_still_report``:
    members training a round that is not their last (their reports would join the buffer)."""
    if buffered == 0:
        return False
    if buffered < min(buffer, buffered + may_still_report):
        return False
    return not held_back(version, training_bases, max_staleness)


def merge_members(buffered_groups: Iterable[Sequence[int]]) -> list[int]:
    """The members a merge is computed from: those of the buffered reports, by member id."""
    return sorted(k for group in buffered_groups for k in group)


def straggler_delay(seed: int, member: int, round_index: int, scale_s: float, sigma: float) -> float:
    """Member ``member``'s seeded extra seconds in round ``round_index`` (``population.straggler``).

    ``scale_s · exp(sigma · z)`` with ``z ~ N(0, 1)`` from the stream
    ``(seed, STREAM_STRAGGLER, member, round_index)``: log-normal with median ``scale_s``.
    0 without a draw when ``scale_s`` is 0 (off).
    """
    if scale_s == 0:
        return 0.0
    z = float(np.random.default_rng(derive_seed(seed, STREAM_STRAGGLER, member, round_index)).standard_normal())
    return scale_s * math.exp(sigma * z)


def logical_finish(start: float, members: Iterable[int], delays: Mapping[int, float]) -> float:
    """When a call started at logical time ``start`` finishes: its members train one after
    another in their actor, so it takes the sum of their delays (``delays``: member → seconds).

    Every call of a round trains the same T epochs, so their training time is left out: it
    would shift every call alike and change no order.
    """
    return start + sum(delays[k] for k in members)


def next_logical(keys: Mapping[int, tuple[float, int]]) -> int:
    """The actor whose report comes next in logical order: the least ``(finish, call number)``
    among ``keys`` (actor → its call's logical finish and the order the call was made)."""
    return min(keys, key=lambda g: keys[g])
