"""How long the driver waits for an actor's answer before it takes the actor as hung.

A stopped process (SIGSTOP, a frozen VM, a node swapping to a halt) does not die, so Ray
never reports it lost and a driver that waits for it waits forever. Every call the driver
waits for therefore has a deadline, derived from the measured time of the calls of its kind
answered so far (:class:`CallDeadlines`):

* a ``train`` call of ``n`` epochs: ``factor × median seconds per epoch × n``;
* an actor's construction (measured up to the answer of its first call, ``placement``):
  ``construction_factor ×`` the median of the constructions answered (3 by default: actors
  built together import and load the same things and finish close together, and a stop during
  a start-up must not cost ten start-ups);
* any other call (``adopt``, ``get_weights``, ``snapshot``, the calls that replay a round into
  a rebuilt actor…): ``factor ×`` the median of that kind's answers;
* a short call of a kind not answered yet (the ``load_states`` of a rebuild): what a whole
  round of training is allowed (``factor × median seconds per epoch × round_epochs``), a
  state transfer being cheaper than the training that produced it;

never less than ``min_s``. A kind with nothing measured to go by (the run's first
construction and first round, when model loading and compilation happen) waits
``first_call_s`` instead.

A false positive (a healthy call taken as hung) costs one rebuild of that actor from its
restore point; the numbers of a deterministic run do not change. Raise
``population.hang_deadline_factor`` or ``population.hang_deadline_min_s`` to widen the margin
(docs/guides/resume.md).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

__all__ = [
    "ARCHIVE_CONSTRUCTION",
    "CONSTRUCTION",
    "EVALUATOR_BUILD",
    "EVALUATOR_CONSTRUCTION",
    "CallDeadlines",
    "CallTimeout",
]

# The kind a construction is measured as: the time from creating an actor to the answer of
# its first call (which waits for the constructor).
CONSTRUCTION = "placement"
# The archive actor's (its first pid call waits for it; so does the one after a restart).
ARCHIVE_CONSTRUCTION = "archive.placement"
# The evaluator actor's start (its first call, counted from its creation), and the build of its
# scratch policy and environment (at its first evaluation): constructions both.
EVALUATOR_CONSTRUCTION = "evaluator.placement"
EVALUATOR_BUILD = "evaluator.build.placement"


class CallTimeout(TimeoutError):
    """An actor did not answer a call within its deadline (one line: which call, how long)."""


class CallDeadlines:
    """Deadlines of the driver's calls from the measured times of those answered (module docstring).

    Args:
        factor: multiple of the measured median that a call may take.
        min_s: the floor of every deadline, in seconds.
        first_call_s: the deadline of a call of a kind that has nothing measured to go by.
        round_epochs: epochs of a round (``scheduler.interval_epochs``), for the deadline of
            a short call of a kind not answered yet.
        construction_factor: multiple of the median construction that a construction may take.
    """

    def __init__(
        self,
        factor: float,
        min_s: float,
        first_call_s: float = 600.0,
        round_epochs: int = 1,
        construction_factor: float = 3.0,
    ) -> None:
        self.factor = factor
        self.construction_factor = construction_factor
        self.min_s = min_s
        self.first_call_s = first_call_s
        self.round_epochs = max(1, round_epochs)
        self.seconds: defaultdict[str, list[float]] = defaultdict(list)  # kind → seconds per unit

    @property
    def per_epoch(self) -> list[float]:
        """Seconds per epoch of the ``train`` calls answered so far."""
        return self.seconds["train"]

    def answered(self, method: str, seconds: float, n_epochs: int = 1) -> None:
        """A call answered after ``seconds``; a ``train`` call's time counts per epoch."""
        if method == "train":
            if n_epochs > 0:
                self.seconds["train"].append(seconds / n_epochs)
        else:
            self.seconds[method].append(seconds)

    def limit(self, method: str, n_epochs: int = 1) -> float:
        """Seconds after which a call of ``method`` (``n_epochs`` epochs for ``train``) is hung."""
        measured = self.seconds.get(method)
        if measured:
            units = n_epochs if method == "train" else 1
            factor = self.construction_factor if method.endswith(CONSTRUCTION) else self.factor
            return max(self.min_s, factor * statistics.median(measured) * units)
        per_epoch = self.seconds.get("train")
        if method != "train" and not method.endswith(CONSTRUCTION) and per_epoch:
            return max(self.min_s, self.factor * statistics.median(per_epoch) * self.round_epochs)
        return max(self.min_s, self.first_call_s)

    def describe(self) -> str:
        """One line: what each kind's deadline is now (logged with a replacement)."""
        kinds = sorted(set(self.seconds) | {"train", CONSTRUCTION})
        return ", ".join(
            f"{k} {self.limit(k, self.round_epochs):.0f} s" + ("" if self.seconds.get(k) else " (unmeasured)")
            for k in kinds
        )
