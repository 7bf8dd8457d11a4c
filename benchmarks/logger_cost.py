"""``python -m benchmarks.logger_cost``: what TensorBoard logging adds to a round.

Times :meth:`popgrpo.telemetry.loggers.TensorBoardLogger.log_round` on rounds shaped like
the default preset's (``pop_grpo``: 5 members × 10 epochs per round, one 10×10 archive per
member, 12 rounds), with random metric values: scalars, histograms, heatmaps and the lineage
text are all written and flushed. Not part of the suite; run it where the figure is wanted.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

from popgrpo.columns import METRIC_COLUMNS
from popgrpo.config import load_config, preset_path
from popgrpo.telemetry.loggers import RoundReport, TensorBoardLogger


def round_report(r: int, members: int, epochs: int, cells: int, rng: np.random.Generator) -> RoundReport:
    rows = []
    for epoch in range(r * epochs, (r + 1) * epochs):
        for k in range(members):
            row = {c: float(rng.random()) for c in METRIC_COLUMNS}
            quantiles = np.sort(rng.random(5)) * 3
            row.update({f"complexity_p{p}": float(q) for p, q in zip((10, 25, 50, 75, 90), quantiles, strict=True)})
            rows.append(row | {"epoch": epoch, "member": k, "ideas": 512})
    heatmaps = {
        f"member_{k}": np.where(rng.random((cells, cells)) < 0.4, rng.random((cells, cells)), np.nan)
        for k in range(members)
    }
    lineage = {"round": r, "selected": [0, 1, 2], "scores": {str(k): float(rng.random()) for k in range(members)}}
    return RoundReport(r, (r + 1) * epochs, rows, lineage, heatmaps)


def main() -> None:
    config = load_config(preset_path("pop_grpo"))
    members, epochs = config.population.size, config.scheduler.interval_epochs
    rounds = config.run.epochs // epochs
    rng = np.random.default_rng(0)
    reports = [round_report(r, members, epochs, config.archive.cells_per_dim, rng) for r in range(rounds)]
    logger = TensorBoardLogger(tempfile.mkdtemp(prefix="pglog-"), config)
    seconds = []
    for report in reports:
        started = time.perf_counter()
        logger.log_round(report)
        seconds.append(time.perf_counter() - started)
    logger.close()
    print(
        f"TensorBoardLogger.log_round, {members} members x {epochs} epochs, {rounds} rounds: "
        f"median {np.median(seconds) * 1000:.0f} ms, max {max(seconds) * 1000:.0f} ms, total {sum(seconds):.2f} s"
    )


if __name__ == "__main__":
    main()
