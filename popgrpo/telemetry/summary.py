"""Table-1 numbers from per-member, per-epoch metrics."""

from __future__ import annotations

import pandas as pd

__all__ = ["TABLE1_KEYS", "population_by_epoch", "summarise"]

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
    number. ``archive_coverage`` / ``archive_qd_score`` are the final values (mean over
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
