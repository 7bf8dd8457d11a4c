"""Run one training job end to end: executor → rounds → run directory."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from popgrpo.config import Config
from popgrpo.runtime.executor import Executor, LocalExecutor
from popgrpo.runtime.scheduler import run_rounds
from popgrpo.telemetry.plots import plot_training_dynamics
from popgrpo.telemetry.run_dir import RunDirectory
from popgrpo.telemetry.summary import summarise

__all__ = ["default_run_dir", "train"]


def default_run_dir(config: Config, root: str | Path = "runs") -> Path:
    return Path(root) / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(
    config: Config,
    run_dir: str | Path,
    executor_factory: Callable[[Config], Executor] = LocalExecutor,
    progress: bool = True,
) -> dict:
    """Train ``config`` and write its run directory; return the summary.

    Metrics and lineage are written after every round, so an interrupted run keeps what it
    finished. Raises whatever the members raise (e.g. BadRewardError) after saving.
    """
    out = RunDirectory(run_dir).create()
    out.write_config(config)
    rows: list[dict] = []
    bar = tqdm(total=config.run.epochs, desc=config.run.name, unit="epoch", disable=not progress, mininterval=0.5)
    best_max = float("-inf")

    def on_round(round_index: int, member_rows: list[list[dict]], record: dict | None) -> None:
        nonlocal best_max
        new = [row for per_member in member_rows for row in per_member]
        rows.extend(new)
        out.write_metrics(rows)
        if record is not None:
            out.append_lineage(record)
        best_max = max([best_max, *(r["reward_max"] for r in new)])
        last_epoch = max(r["epoch"] for r in new)
        last = [r for r in new if r["epoch"] == last_epoch]
        diversity = sum(r["diversity"] for r in last) / len(last)
        bar.update(len(member_rows[0]))
        bar.set_postfix(round=round_index, best_max_reward=f"{best_max:.3f}", diversity=f"{diversity:.3f}")

    executor = executor_factory(config)
    try:
        run_rounds(config, executor, on_round)
    finally:
        bar.close()
        executor.close()
    metrics = out.read_metrics()
    summary = summarise(metrics, config.run.summary_window)
    out.write_summary(summary)
    plot_training_dynamics(metrics, out.path / "training_dynamics.png", title=config.run.name)
    return summary
