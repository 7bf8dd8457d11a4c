"""``popgrpo report RUN_DIR`` for a code run (env.kind=code): pass@k curves per member and for the population.

Reads the run's metrics (every member's epoch rows, :data:`popgrpo.columns.CODE_COLUMNS`) and
writes into the run directory:

* ``code_pass_at_k.png``: pass@1 and pass@G over epochs, one thin line per member and a thick
  one for the population (its members' samples pooled per problem, :mod:`popgrpo.core.passk`),
  and problems solved per epoch by each member and by any member;
* ``code_report.md``: the same per epoch as a table, with distinct correct programs per problem
  solved, and ``eval_*.json`` tables of ``popgrpo eval`` when there are any.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from popgrpo.markdown import md_table
from popgrpo.telemetry.code_population import population_code_scalars

__all__ = ["is_code_run", "render_code"]


def is_code_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` is a run directory whose metrics carry code columns."""
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        return False
    from popgrpo.telemetry.run_dir import RunDirectory

    if not RunDirectory(path).has_metrics():
        return False
    import yaml

    try:
        return (yaml.safe_load((path / "config.yaml").read_text()) or {}).get("env", {}).get("kind") == "code"
    except (OSError, yaml.YAMLError):
        return False


def population_frame(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per epoch: the members' mean code columns and the population's pooled figures."""
    rows = []
    for epoch, group in metrics.groupby("epoch"):
        records = [{str(k): v for k, v in r.items()} for r in group.to_dict("records")]
        rows.append(
            {
                "epoch": int(epoch),  # pyright: ignore[reportArgumentType]
                "members": len(records),
                "member_pass_at_1": group["code_pass_at_1"].mean(),
                "member_pass_at_group": group["code_pass_at_group"].mean(),
                **population_code_scalars(records),
                "member_distinct_correct": group["code_distinct_correct"].mean(),
            }
        )
    return pd.DataFrame(rows)


def _figure(metrics: pd.DataFrame, population: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from popgrpo.telemetry.plots import save_figure

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharex=True)
    panels = (
        ("code_pass_at_1", "population_code_pass_at_1", "pass@1"),
        ("code_pass_at_group", "population_code_pass_at_group", "pass@G"),
        ("code_solved", "population_code_solved", "problems solved"),
    )
    for ax, (column, pooled, label) in zip(axes, panels, strict=True):
        for member, rows in metrics.groupby("member"):
            ax.plot(rows["epoch"], rows[column], lw=0.8, alpha=0.6, label=f"member {member}")
        if pooled in population:
            ax.plot(population["epoch"], population[pooled], lw=2.2, color="black", label="population")
        ax.set_title(label)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle("code problems: per member and for the population (pooled samples)")
    return save_figure(fig, path)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def render_code(run_dir: str | Path) -> list[Path]:
    """Write the figure and the table (see the module docstring); returns their paths."""
    from popgrpo.telemetry.run_dir import RunDirectory

    path = Path(run_dir)
    metrics = RunDirectory(path).read_metrics_table().to_pandas()
    population = population_frame(metrics)
    written = [_figure(metrics, population, path / "code_pass_at_k.png")]
    columns = list(population.columns)
    lines = [
        f"# Code run {path.name}",
        "",
        "Per epoch: the members' mean pass@1 / pass@G, the population's over its members' samples pooled "
        "per problem, the best member's, problems solved and distinct correct programs per problem solved.",
        "",
        md_table(columns, [[_fmt(row[c]) for c in columns] for row in population.to_dict("records")]),
    ]
    for table in sorted(path.glob("eval_*.json")):
        result = json.loads(table.read_text())
        from popgrpo.research.study.code_eval import markdown

        lines += [
            "",
            f"## popgrpo eval --split {result['split']} ({result['problems']} problems)",
            "",
            markdown(result),
        ]
    report = path / "code_report.md"
    report.write_text("\n".join(lines) + "\n")
    written.append(report)
    return written
