"""The round loop: train T epochs, then (Pop-GRPO) select → soup → perturb, and log it.

The decision at the end of a round is a pure function, :func:`plan_round`, that returns
what to do *and* a JSON-able description of it (the lineage record), in the spirit of Ray
Tune's PBT helpers; :func:`run_rounds` carries the plan out through an executor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from popgrpo.config import Config
from popgrpo.core.merge import soup
from popgrpo.core.selection import pop_score, select_top_m
from popgrpo.runtime.executor import Executor

__all__ = ["RoundPlan", "plan_round", "round_lengths", "run_rounds"]


@dataclass(frozen=True)
class RoundPlan:
    selected: list[int]
    record: dict


def round_lengths(epochs: int, interval: int) -> list[int]:
    """Epochs per round: full rounds of ``interval``, the last one possibly shorter."""
    n_full, rest = divmod(epochs, interval)
    return [interval] * n_full + ([rest] if rest else [])


def plan_round(round_index: int, epoch_end: int, last_rows: list[dict], config: Config) -> RoundPlan:
    """Score members on their last epoch of the round and choose the top M.

    ``S_k = d_k · (1 + max R_k)`` with ``d_k`` the member's diversity and ``max R_k`` its
    max reward in that epoch (main paper §4.3).
    """
    sched = config.scheduler
    scores = [pop_score(r["diversity"], r["reward_max"]) for r in last_rows]
    selected = select_top_m(scores, sched.top_m)
    record = {
        "round": round_index,
        "epoch_end": epoch_end,
        "scores": {str(r["member"]): _json_float(s) for r, s in zip(last_rows, scores, strict=True)},
        "selected": selected,
        "merge": {"kind": "soup", "members": selected, "weights": [1.0 / len(selected)] * len(selected)},
        "perturb": {"kind": "gaussian", "sigma": sched.perturb_sigma, "members": list(range(len(last_rows)))},
    }
    return RoundPlan(selected, record)


def run_rounds(
    config: Config,
    executor: Executor,
    on_round: Callable[[int, int, list[list[dict]], dict | None], None],
    start_round: int = 0,
) -> None:
    """Train rounds ``start_round, …``; after each, ``on_round(round, epoch_end, rows_per_member, record)``.

    The lineage record is ``None`` when the scheduler is off or after the final round
    (nothing is merged once training is over). ``start_round > 0`` continues a resumed run
    whose members already hold the state at the end of round ``start_round − 1``.
    """
    lengths = round_lengths(config.run.epochs, config.scheduler.interval_epochs)
    epoch_end = sum(lengths[:start_round])
    for round_index in range(start_round, len(lengths)):
        n_epochs = lengths[round_index]
        rows = executor.train(n_epochs)
        epoch_end += n_epochs
        record = None
        is_last = round_index == len(lengths) - 1
        if config.scheduler.enabled and not is_last:
            plan = plan_round(round_index, epoch_end, [member_rows[-1] for member_rows in rows], config)
            weights = executor.get_weights(plan.selected)
            executor.reseed(soup(weights), config.scheduler.perturb_sigma, round_index + 1)
            record = plan.record
        on_round(round_index, epoch_end, rows, record)


def _json_float(x: float) -> float | None:
    return None if math.isnan(x) else float(x)
