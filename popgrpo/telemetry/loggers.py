"""Experiment trackers: what a run reports to TensorBoard, MLflow and Weights & Biases.

The run calls one small sink interface, :class:`RunLogger`, after every round with a
:class:`RoundReport` (the round's metrics rows, its lineage record, the archive heatmaps),
and :meth:`RunLogger.close` at the end. :func:`make_loggers` builds the ones
``run.loggers`` names (entries of :data:`popgrpo.registry.LOGGERS`: the three below, or a
plugin's) and returns them behind :class:`Loggers`, which fans out to each.

What each one receives:

=====================  ==================================  ====================  ==================
                       TensorBoard                         MLflow                W&B
=====================  ==================================  ====================  ==================
every metrics column   scalars per member and population   metrics, same keys    history, same keys
archive heatmap        image per round                     PNG artifact/round    image per round
complexity histogram   histogram per epoch                 (MLflow has none)     histogram per epoch
lineage record         text per round                      JSON artifact/round   table at the end
=====================  ==================================  ====================  ==================

TensorBoard writes one event directory per member (``<run dir>/tensorboard/member_<k>``)
and one for the population (``.../population``), all with the same tag names, so one chart
overlays the members' curves and the population mean; ``tensorboard --logdir runs/`` lists
every run (and every ``reproduce`` trial) that way. The step of every value is the epoch;
round-level values (heatmap, lineage) sit at the round's last epoch.

MLflow and W&B are optional clients (``pip install "popgrpo[trackers]"``):
:func:`check_available` turns a missing one into :class:`~popgrpo.config.ConfigError`
(the CLI exits 2) before anything starts.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from popgrpo.config import Config, ConfigError
from popgrpo.registry import LOGGERS

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = [
    "CLIENT_PACKAGES",
    "Loggers",
    "MlflowLogger",
    "RoundReport",
    "RunLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "archive_heatmaps",
    "check_available",
    "complexity_histogram",
    "heatmap_images",
    "make_loggers",
    "mlflow_logger",
    "population_scalars",
    "scalar_columns",
    "tensorboard_logger",
    "wandb_logger",
]

# logger name -> (module imported, package to install)
CLIENT_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "wandb": ("wandb", "wandb"),
}
# The complexity quantiles every member records per epoch (METRIC_COLUMNS complexity_p*):
# (column, fraction of the epoch's ideas at or below it).
_QUANTILES = (("complexity_p10", 0.10), ("complexity_p25", 0.25), ("complexity_p50", 0.50),
              ("complexity_p75", 0.75), ("complexity_p90", 0.90))  # fmt: skip


@dataclass(frozen=True)
class RoundReport:
    """What a logger receives after a round.

    ``rows``: the round's metrics rows (one per member per epoch, METRIC_COLUMNS keys).
    ``lineage``: the scheduler's record (None when nothing was merged, e.g. the last round).
    ``heatmaps``: archive name (``shared`` or ``member_<k>``) → ``[cells, cells]`` elite
    rewards, NaN where empty.
    ``logged_members``: members ``0 … N−1`` get series of their own (``run.logged_members``;
    None: all); the population's series use every row.
    """

    round: int
    epoch_end: int  # epochs finished once this round is done
    rows: list[dict]
    lineage: dict | None = None
    heatmaps: dict[str, np.ndarray] = field(default_factory=dict)
    logged_members: int | None = None

    def member_rows(self) -> list[dict]:
        """The rows of the members with series of their own."""
        if self.logged_members is None:
            return self.rows
        return [row for row in self.rows if int(row["member"]) < self.logged_members]


class RunLogger(Protocol):
    def log_round(self, report: RoundReport) -> None: ...

    def close(self, failed: bool = False) -> None: ...


# ---- pure helpers ---------------------------------------------------------------------------


def scalar_columns(row: dict) -> list[str]:
    """The numeric metrics columns of a row: every column but the ``epoch`` / ``member`` keys."""
    return [k for k, v in row.items() if k not in ("epoch", "member") and isinstance(v, int | float)]


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def population_scalars(rows: Sequence[dict]) -> dict[int, dict[str, float]]:
    """Per epoch: the mean over members of every numeric column (NaN values left out), plus
    ``population_max_reward`` (the best member's ``reward_max``) and, for a code run, the
    population's pooled pass@k and problems solved (:mod:`popgrpo.telemetry.code_population`)."""
    # Imported here: it imports popgrpo.core (torch), and `popgrpo train` imports this module to
    # check the trackers' clients before torch loads (its first line comes before torch).
    from popgrpo.telemetry.code_population import population_code_scalars

    by_epoch: dict[int, list[dict]] = {}
    for row in rows:
        by_epoch.setdefault(int(row["epoch"]), []).append(row)
    out: dict[int, dict[str, float]] = {}
    for epoch, members in sorted(by_epoch.items()):
        values: dict[str, float] = {}
        for col in scalar_columns(members[0]):
            finite = [float(r[col]) for r in members if _finite(r.get(col))]
            if finite:
                values[col] = sum(finite) / len(finite)
        best = [float(r["reward_max"]) for r in members if _finite(r.get("reward_max"))]
        if best:
            values["population_max_reward"] = max(best)
        values.update(population_code_scalars(members))  # a code run's pooled pass@k, problems solved
        out[epoch] = values
    return out


def complexity_histogram(rows: Sequence[dict], bins: int = 24) -> tuple[np.ndarray, np.ndarray] | None:
    """``(edges [bins+1], counts [bins])`` of the ideas' complexity between p10 and p90.

    Members report quantiles, not every idea, so each row stands for its ``ideas`` spread
    uniformly between consecutive quantiles (15 % of them between p10 and p25, and so on);
    the rows are summed on common bins. The 20 % outside [p10, p90] are left out: nothing
    says how far they reach. None when no row has finite quantiles.
    """
    fractions = np.diff([f for _, f in _QUANTILES])  # the share of a row's ideas in each interval
    quantiles, ideas = [], []
    for row in rows:
        q = [row.get(col) for col, _ in _QUANTILES]
        if not all(_finite(x) for x in q) or not _finite(row.get("ideas")) or row["ideas"] <= 0:
            continue
        quantiles.append([float(x) for x in q if x is not None])  # every x is finite: checked above
        ideas.append(float(row["ideas"]))
    if not quantiles:
        return None
    # One piece per (row, interval): ideas spread uniformly over [a, b].
    values = np.asarray(quantiles)
    a, b = values[:, :-1].ravel(), values[:, 1:].ravel()
    n = (np.asarray(ideas)[:, None] * fractions).ravel()
    lo, hi = float(a.min()), float(b.max())
    if hi <= lo:
        hi = lo + 1e-6
    edges = np.linspace(lo, hi, bins + 1)
    spread = b > a
    width = np.where(spread, b - a, 1.0)
    overlap = np.clip(np.minimum(edges[1:], b[:, None]) - np.maximum(edges[:-1], a[:, None]), 0, None)
    counts = (np.where(spread, n / width, 0.0) @ overlap).astype(float)
    # Every idea of a zero-width interval at one value: in that value's bin.
    at = np.minimum(np.searchsorted(edges, a[~spread], side="right") - 1, bins - 1)
    np.add.at(counts, at, n[~spread])
    return edges, counts


def archive_heatmaps(
    archive_states: Sequence[Mapping[str, Any]], shared: bool, members: int | None = None
) -> dict[str, np.ndarray]:
    """Heatmaps of the archives in a checkpoint snapshot (``LocalArchive.state_dict()``s): the
    shared one, or the first ``members`` members' own (None: all).

    Empty when the behaviour space is not 2-D (a heatmap needs two axes).
    """
    from popgrpo.core.archive import state_heatmap

    out = {}
    if not shared and members is not None:
        archive_states = archive_states[:members]
    for k, state in enumerate(archive_states):
        try:
            grid = state_heatmap(state["archive"])
        except ValueError:
            return {}
        out["shared" if shared else f"member_{k}"] = grid
    return out


def heatmap_images(heatmaps: dict[str, np.ndarray], cell_px: int = 16) -> dict[str, np.ndarray]:
    """``[cells·cell_px, cells·cell_px, 3]`` uint8 pictures of the archives: elite reward as
    viridis colour (dark: low, yellow: high) on one scale for all of them (the round's lowest
    to highest elite), empty cells grey, behaviour 0 along the rows, row 0 at the bottom.

    Coloured with numpy, not drawn as matplotlib figures: a figure costs about a second a
    round on a small machine, this a millisecond.
    """
    from matplotlib import colormaps

    finite = [g[np.isfinite(g)] for g in heatmaps.values()]
    values = np.concatenate(finite) if finite else np.zeros(0)
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    span = hi - lo if hi > lo else 1.0
    viridis = colormaps["viridis"]
    out = {}
    for name, grid in heatmaps.items():
        rgb = viridis(np.nan_to_num((grid - lo) / span, nan=0.0))[..., :3]
        rgb[~np.isfinite(grid)] = 0.85  # empty cell
        cells = (rgb[::-1] * 255).round().astype(np.uint8)
        out[name] = np.repeat(np.repeat(cells, cell_px, axis=0), cell_px, axis=1)
    return out


def _lineage_markdown(record: dict) -> str:
    # TensorBoard's text plugin renders Markdown: a code block keeps the JSON readable.
    return "```json\n" + json.dumps(record, indent=2) + "\n```"


def _by_member(rows: Sequence[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for row in rows:
        out.setdefault(int(row["member"]), []).append(row)
    return out


# ---- TensorBoard ------------------------------------------------------------------------------


class TensorBoardLogger:
    """Event files under ``<run dir>/tensorboard/{population,member_<k>}`` (torch's ``SummaryWriter``).

    ``purge_step``: a resumed run passes its first recomputed epoch, so the events the
    interrupted run wrote from there on are hidden rather than shown twice.
    """

    def __init__(self, run_dir: str | Path, config: Config | None = None, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer_cls = SummaryWriter
        self.root = Path(run_dir) / "tensorboard"
        self._purge_step = purge_step
        self._writers: dict[str, SummaryWriter] = {}
        if config is not None and purge_step is None:
            self._writer("population").add_text("config", "```yaml\n" + config.to_yaml() + "\n```", 0)

    def _writer(self, name: str) -> SummaryWriter:
        if name not in self._writers:
            self._writers[name] = self._writer_cls(str(self.root / name), purge_step=self._purge_step, flush_secs=10)
        return self._writers[name]

    def log_round(self, report: RoundReport) -> None:
        for member, rows in _by_member(report.member_rows()).items():
            writer = self._writer(f"member_{member}")
            for row in rows:
                values = {col: row[col] for col in scalar_columns(row) if _finite(row[col])}
                _write_epoch(writer, values, complexity_histogram([row]), int(row["epoch"]))
        population = self._writer("population")
        by_epoch = population_scalars(report.rows)
        for epoch, values in by_epoch.items():
            hist = complexity_histogram([r for r in report.rows if r["epoch"] == epoch])
            _write_epoch(population, {**values, "round": report.round}, hist, epoch)
        step = report.epoch_end - 1
        for name, image in heatmap_images(report.heatmaps).items():
            writer = population if name == "shared" else self._writer(name)
            _write_image(writer, "archive_heatmap", image, step)
        if report.lineage is not None:
            population.add_text("lineage", _lineage_markdown(report.lineage), step)
        for writer in self._writers.values():
            writer.flush()

    def close(self, failed: bool = False) -> None:
        for writer in self._writers.values():
            writer.close()


def _write_epoch(
    writer: SummaryWriter, values: dict[str, float], hist: tuple[np.ndarray, np.ndarray] | None, step: int
) -> None:
    """One epoch's scalars and complexity histogram as one event: a ``Summary`` with a
    ``simple_value`` per scalar tag and a ``histo`` for ``complexity_hist``, the values
    ``add_scalar`` and ``add_histogram_raw`` write one event each. A round logs an event per
    (member, epoch); one call per value made the driver wait on the event writer's queue."""
    # The generated protobuf module declares its classes at run time, unseen by the checker.
    from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary  # pyright: ignore[reportAttributeAccessIssue]

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
    if hist is not None:
        edges, counts = hist
        centres = (edges[:-1] + edges[1:]) / 2
        histo = HistogramProto(
            min=float(edges[0]),
            max=float(edges[-1]),
            num=float(counts.sum()),
            sum=float((counts * centres).sum()),
            sum_squares=float((counts * centres**2).sum()),
            bucket_limit=edges[1:].tolist(),
            bucket=counts.tolist(),
        )
        # not "complexity": TensorBoard keeps one kind of data per tag and run
        summary.value.append(Summary.Value(tag="complexity_hist", histo=histo))
    if summary.value:
        writer._get_file_writer().add_summary(summary, step)


def _write_image(writer: SummaryWriter, tag: str, image: np.ndarray, step: int) -> None:
    """An ``[H, W, 3]`` uint8 picture as one image event, PNG-encoded by Pillow at compression
    level 1: the heatmaps are flat colour blocks, so that costs a few hundred bytes more than
    ``add_image`` (level 6, after converting to float and back) and about a quarter of its CPU."""
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]

    buffer = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buffer, format="PNG", compress_level=1)
    height, width, channels = image.shape
    picture = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=buffer.getvalue())
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=picture)]), step)


# ---- MLflow -----------------------------------------------------------------------------------


class MlflowLogger:
    """One MLflow run per popgrpo run, through ``MlflowClient`` (no global "active run").

    Default store: ``mlruns/`` beside the run directory, a local file store that works
    offline (MLflow 3 calls it "maintenance mode" and wants ``MLFLOW_ALLOW_FILE_STORE=true``,
    which is set for it). A resumed run continues the MLflow run whose id ``trackers.json`` recorded.
    """

    def __init__(self, run_dir: str | Path, config: Config) -> None:
        from mlflow.tracking import MlflowClient

        self.run_dir = Path(run_dir)
        uri = config.run.mlflow_tracking_uri or (self.run_dir.resolve().parent / "mlruns").as_uri()
        self.tracking_uri = uri
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3.x keeps the file store working but refuses it unless asked: this default
            # is chosen because it needs no server and no database library.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        ids = _tracker_ids(self.run_dir)
        if "mlflow" in ids:
            self.run_id = ids["mlflow"]
            return
        experiment = self.client.get_experiment_by_name(config.run.name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(config.run.name)
        run = self.client.create_run(
            experiment_id, run_name=self.run_dir.name, tags={"popgrpo.run_dir": str(self.run_dir.resolve())}
        )
        self.run_id = run.info.run_id
        _save_tracker_id(self.run_dir, "mlflow", self.run_id)
        self.client.log_text(self.run_id, config.to_yaml(), "config.yaml")
        for key in ("seed", "epochs"):
            self.client.log_param(self.run_id, f"run.{key}", getattr(config.run, key))
        self.client.log_param(self.run_id, "population.size", config.population.size)

    def log_round(self, report: RoundReport) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(f"member_{row['member']}/{col}", float(row[col]), now, int(row["epoch"]))
            for row in report.member_rows()
            for col in scalar_columns(row)
            if _finite(row[col])
        ]
        for epoch, values in population_scalars(report.rows).items():
            metrics += [Metric(f"population/{col}", v, now, epoch) for col, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        for name, image in heatmap_images(report.heatmaps).items():
            self.client.log_image(self.run_id, image, f"archive_heatmap/{name}/round_{report.round:04d}.png")
        if report.lineage is not None:
            self.client.log_dict(self.run_id, report.lineage, f"lineage/round_{report.round:04d}.json")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


# ---- Weights & Biases ---------------------------------------------------------------------------


class WandbLogger:
    """A W&B run, offline by default: written under ``<run dir>/wandb/``, uploaded later with
    ``wandb sync``. A resumed run continues the W&B run whose id ``trackers.json`` recorded."""

    def __init__(self, run_dir: str | Path, config: Config) -> None:
        import wandb

        self._wandb = wandb
        self.run_dir = Path(run_dir)
        ids = _tracker_ids(self.run_dir)
        run_id = ids.get("wandb") or secrets.token_hex(4)  # W&B ids: lowercase letters and digits
        self.run = wandb.init(
            project=config.run.wandb_project,
            name=self.run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            mode=config.run.wandb_mode,
            config=config.model_dump(mode="json"),
            reinit="create_new",  # several popgrpo runs (reproduce trials) may share a process
        )
        _save_tracker_id(self.run_dir, "wandb", run_id)
        self._lineage: list[dict] = []

    def log_round(self, report: RoundReport) -> None:
        wandb = self._wandb
        population = population_scalars(report.rows)
        member_rows = report.member_rows()
        last = report.epoch_end - 1
        for epoch in sorted(population):
            data: dict[str, Any] = {f"population/{col}": v for col, v in population[epoch].items()}
            rows = [r for r in report.rows if r["epoch"] == epoch]
            for row in (r for r in member_rows if r["epoch"] == epoch):
                data.update(
                    {f"member_{row['member']}/{c}": float(row[c]) for c in scalar_columns(row) if _finite(row[c])}
                )
            hist = complexity_histogram(rows)
            if hist is not None:
                data["population/complexity_hist"] = wandb.Histogram(np_histogram=(hist[1], hist[0]))
            if epoch == last:
                for name, image in heatmap_images(report.heatmaps).items():
                    data[f"archive_heatmap/{name}"] = wandb.Image(image, caption=f"round {report.round}")
            self.run.log(data, step=epoch)
        if report.lineage is not None:
            self._lineage.append(report.lineage)

    def close(self, failed: bool = False) -> None:
        if self._lineage:
            table = self._wandb.Table(columns=["round", "record"])
            for record in self._lineage:
                table.add_data(record["round"], json.dumps(record))
            self.run.log({"lineage": table})
        self.run.finish(exit_code=1 if failed else 0)


def _tracker_ids(run_dir: Path) -> dict[str, str]:
    path = run_dir / "trackers.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_tracker_id(run_dir: Path, name: str, run_id: str) -> None:
    ids = _tracker_ids(run_dir) | {name: run_id}
    (run_dir / "trackers.json").write_text(json.dumps(ids, indent=2) + "\n")


# ---- the run's entry point ------------------------------------------------------------------------


class Loggers:
    """Every configured logger behind one :class:`RunLogger`."""

    def __init__(self, loggers: Sequence[RunLogger]) -> None:
        self.loggers = list(loggers)

    def log_round(self, report: RoundReport) -> None:
        for logger in self.loggers:
            logger.log_round(report)

    def close(self, failed: bool = False) -> None:
        for logger in self.loggers:
            logger.close(failed)


def check_available(names: Sequence[str]) -> None:
    """Raise :class:`ConfigError` (one line: what to install) when a logger's client is missing."""
    for name in names:
        if name not in CLIENT_PACKAGES:  # a plugin's logger: its own package says what it needs
            continue
        module, package = CLIENT_PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"run.loggers: {name} needs its client, which is not installed: pip install {package} "
                f'(or pip install "popgrpo[trackers]"), or remove {name} from run.loggers'
            )


def make_loggers(config: Config, run_dir: str | Path, resume_epoch: int | None = None) -> Loggers:
    """The loggers ``run.loggers`` names, writing for the run in ``run_dir``.

    ``resume_epoch``: the first epoch a resumed run recomputes (TensorBoard hides what the
    interrupted run wrote from there on).
    """
    check_available(config.run.loggers)
    built: list[RunLogger] = []
    try:
        for name in config.run.loggers:
            built.append(LOGGERS.get(name)(Path(run_dir), config, resume_epoch))
    except BaseException:
        Loggers(built).close(failed=True)
        raise
    return Loggers(built)


def tensorboard_logger(run_dir: Path, config: Config, resume_epoch: int | None = None) -> RunLogger:
    """``run.loggers: [tensorboard]``; a resumed run hides what was written from ``resume_epoch`` on."""
    return TensorBoardLogger(run_dir, config, purge_step=resume_epoch)


def mlflow_logger(run_dir: Path, config: Config, resume_epoch: int | None = None) -> RunLogger:
    """``run.loggers: [mlflow]`` (a resumed run continues the MLflow run it recorded)."""
    del resume_epoch
    return MlflowLogger(run_dir, config)


def wandb_logger(run_dir: Path, config: Config, resume_epoch: int | None = None) -> RunLogger:
    """``run.loggers: [wandb]`` (a resumed run continues the W&B run it recorded)."""
    del resume_epoch
    return WandbLogger(run_dir, config)
