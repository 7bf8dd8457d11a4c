"""Training-dynamics figure (main paper Figure 1 layout): four panels over epochs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["plot_training_dynamics", "save_figure"]

PANELS = (
    ("reward_mean", "mean reward"),
    ("reward_max", "max reward"),
    ("diversity", "diversity"),
    ("complexity", "complexity"),
)


def plot_training_dynamics(metrics: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Each member as a thin line, the population mean as a thick one."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    members = sorted(metrics["member"].unique())
    mean = metrics.groupby("epoch").mean(numeric_only=True)
    for ax, (col, label) in zip(axes.flat, PANELS, strict=True):
        if len(members) > 1:
            for k in members:
                m = metrics[metrics["member"] == k]
                ax.plot(m["epoch"], m[col], lw=0.6, alpha=0.45)
        ax.plot(mean.index, mean[col], lw=2.0, color="black", label="population mean" if len(members) > 1 else "member")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("epoch")
    axes[0, 0].legend(loc="best", fontsize=8)
    fig.suptitle(title or "training dynamics")
    return save_figure(fig, path)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (110 dpi, the project's figures) and close it."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
