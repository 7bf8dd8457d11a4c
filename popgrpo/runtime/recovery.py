"""Fault recovery of member actors: where a rebuilt actor restarts from, and what it replays.

A member's results depend only on its state and its own random stream, so an actor lost in
the middle of a round (process killed, node gone) is rebuilt exactly: it loads the last
restore point (the round's snapshot, taken at each checkpoint) and replays, in order, the
state-changing calls made since (``train``, ``adopt``). :class:`RecoveryLog` keeps both; the
executor sets the restore point, records calls, and asks the log to replay them into a new
actor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from popgrpo.algorithms.archive_service import LocalArchiveState
from popgrpo.runtime.deadlines import CONSTRUCTION
from popgrpo.runtime.transport import pack

__all__ = ["RecoveryLog"]

ArgsFor = Callable[[int], tuple[Any, ...]]  # actor index → the call's arguments for that actor
# (object ref, method, epochs) → the answer, waited for within the call's deadline
Wait = Callable[[Any, str, int], Any]


class RecoveryLog:
    """The restore point of every member and archive, and the calls made since.

    Args:
        initial_archives: every archive's state before anything was inserted (the restore
            point of a private archive until the first snapshot).
    """

    def __init__(self, initial_archives: Sequence[LocalArchiveState]) -> None:
        # None (all, or one member's entry): a new actor's own initial state.
        self.members: list[dict[str, Any] | None] | None = None
        self.archives: list[LocalArchiveState] = list(initial_archives)
        self.calls: list[tuple[str, ArgsFor]] = []

    def set_restore_point(
        self,
        members: Sequence[dict[str, Any]] | None = None,
        archives: Sequence[LocalArchiveState] | None = None,
    ) -> None:
        """A new restore point (members, archives, or both); the recorded calls are forgotten."""
        if members is not None:
            self.members = list(members)
        if archives is not None:
            self.archives = list(archives)
        self.calls = []

    def set_member_points(
        self,
        n_members: int,
        members: Mapping[int, dict[str, Any]],
        archives: Mapping[int, LocalArchiveState | None],
    ) -> None:
        """New restore points for some members only (asynchronous rounds: the states their
        actor sent back with ``adopt``); the others keep theirs. Records no call: in
        asynchronous rounds the call to redo after a rebuild is the one in flight."""
        points: list[dict[str, Any] | None] = [None] * n_members if self.members is None else self.members
        for k, state in members.items():
            points[k] = state
        self.members = points
        for k, archive in archives.items():
            if archive is not None:
                self.archives[k] = archive

    def record(self, method: str, args_for: ArgsFor) -> None:
        """A state-changing call made on every actor since the restore point, to replay."""
        self.calls.append((method, args_for))

    def replay_into(self, actor: Any, index: int, members: Sequence[int], archive_home: Any, wait: Wait) -> None:
        """Bring a new ``actor`` (actor ``index``, holding ``members``) to where the lost one was.

        ``archive_home`` says where its members' private archives are rolled back: ``"actor"``
        (they live in the member actor), an archive-actor handle, or None (a shared archive,
        which is not rolled back). ``wait(ref, method, n_epochs)`` waits for each call's answer
        within that call's deadline (:class:`~popgrpo.runtime.deadlines.CallDeadlines`): the
        first waits for the actor's construction. It raises what ``wait`` raises: Ray's actor
        errors if the new actor dies too, a :class:`~popgrpo.runtime.deadlines.CallTimeout`
        if it stops answering. The handles are ``Any``: Ray types an actor method's
        ``.remote`` as the method itself.
        """
        wait(actor.pid.remote(), CONSTRUCTION, 1)  # up: its constructor has returned
        saved = {} if self.members is None else {k: self.members[k] for k in members if self.members[k] is not None}
        if saved:  # members without a restore point start from the new actor's own initial state
            wait(actor.load_states.remote(pack(saved)), "load_states", 1)
        if archive_home is not None:  # private archives (a shared one has a single entry, not rolled back)
            own_archives = {k: self.archives[k] for k in members}
            if archive_home == "actor":
                wait(actor.load_archive_states.remote(pack(own_archives)), "load_archive_states", 1)
            else:
                wait(archive_home.load_states.remote(own_archives), "archive.load_states", 1)
        for method, args_for in self.calls:
            args = args_for(index)
            wait(getattr(actor, method).remote(*args), method, int(args[0]) if method == "train" else 1)
