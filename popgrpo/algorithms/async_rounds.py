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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["held_back", "merge_due", "merge_members"]


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
