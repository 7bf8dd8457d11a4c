"""Table-1 numbers from per-member, per-epoch metrics.

The reward words, the same in ``summary.json``, the progress bar, TensorBoard and the docs:

* ``max_reward``: a member's max reward of an epoch (its ``reward_max`` row: the best
  reward of each step, averaged over the epoch's steps), averaged over the members, then over
  the last ``run.summary_window`` epochs. Table 1's number: a population is compared with a
  single policy member for member.
* ``population_max_reward``: the best member's max reward of each epoch (the largest
  ``reward_max`` of the epoch's rows), averaged over the same epochs: the population's
  discovery number.

TensorBoard's population run draws both per epoch (``reward_max``, the mean over members, and
``population_max_reward``); the summary and the progress bar average them over the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

__all__ = ["TABLE1_KEYS", "RewardWindow", "population_by_epoch", "summarise"]

TABLE1_KEYS = {
    "mean_reward": "reward_mean",
    "max_reward": "reward_max",
    "diversity": "diversity",
    "complexity": "complexity",
}


def population_by_epoch(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per epoch, the mean over members of every metric, plus the population's best max reward."""
    grouped = metrics.groupby("epoch")
    out = grouped.mean(numeric_only=True).drop(columns=["member"])
    out["population_max_reward"] = grouped["reward_max"].max()
    return out


def summarise(metrics: pd.DataFrame, window: int = 10) -> dict:
    """Average the last ``window`` epochs (main paper §5: 10).

    Each Table-1 number is the mean over members of the member's metric, so a population
    is compared with a single policy member for member; ``population_max_reward`` is the
    best member's max reward (averaged over the same epochs), the population's discovery
    number (see the module docstring). ``archive_coverage`` / ``archive_qd_score`` are the final values (mean over
    members with private archives).
    """
    per_epoch = population_by_epoch(metrics)
    last = per_epoch.tail(window)
    final = per_epoch.iloc[-1]
    summary = {key: float(last[col].mean()) for key, col in TABLE1_KEYS.items()}
    summary.update(
        population_max_reward=float(last["population_max_reward"].mean()),
        entropy=float(last["entropy"].mean()),
        archive_coverage=float(final["archive_coverage"]),
        archive_qd_score=float(final["archive_qd_score"]),
        epochs=int(per_epoch.index.max()) + 1,
        members=int(metrics["member"].nunique()),
        window=int(min(window, len(per_epoch))),
        bad_rewards=int(metrics["bad_rewards"].sum()),
    )
    return summary


class RewardWindow:
    """``max_reward`` and ``population_max_reward`` as :func:`summarise` computes them, over the
    rows seen so far (the progress bar's numbers): once every row is in, they equal the
    summary's. NaN rewards are left out, as pandas leaves them out."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._by_epoch: dict[int, list[float]] = {}  # epoch → the finite reward_max of its rows

    def add(self, rows: Iterable[dict]) -> None:
        for row in rows:
            values = self._by_epoch.setdefault(int(row["epoch"]), [])
            value = float(row["reward_max"])
            if not math.isnan(value):
                values.append(value)

    def values(self) -> dict[str, float]:
        """``{"max_reward": …, "population_max_reward": …}`` over the last ``window`` epochs seen."""
        last = [self._by_epoch[e] for e in sorted(self._by_epoch)[-self.window :]]
        means = [sum(v) / len(v) for v in last if v]
        bests = [max(v) for v in last if v]
        nan = float("nan")
        return {
            "max_reward": sum(means) / len(means) if means else nan,
            "population_max_reward": sum(bests) / len(bests) if bests else nan,
        }
