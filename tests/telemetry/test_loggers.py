"""The run's experiment trackers, read back the way their users read them.

TensorBoard: a real ``tensorboard`` server on a loopback port against a real short run,
queried over its HTTP data API (what its web page fetches). MLflow and W&B: their own
clients read back what a run logged offline; with a client missing, a config that asks for
it stops with one line saying what to install.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from popgrpo.cli import main
from popgrpo.config import ConfigError, load_config
from popgrpo.telemetry import loggers as L
from tests.services import IN_CI, free_port, require_module, stop_process

SHORT = ["run.epochs=8", "grpo.steps_per_epoch=2", "scheduler.interval_epochs=2", "population.size=3"]


# ---- pure helpers -------------------------------------------------------------------------------


def _row(member, epoch, **kw):
    base = {"epoch": epoch, "member": member, "reward_mean": 1.0, "reward_max": 2.0, "ideas": 100}
    base.update({col: q for (col, _), q in zip(L._QUANTILES, (1.0, 2.0, 3.0, 4.0, 5.0), strict=True)})
    return base | kw


def test_population_scalars_average_members_skip_nan_and_keep_the_best_max():
    rows = [_row(0, 0, reward_mean=1.0, reward_max=3.0, pass_at_k=float("nan")), _row(1, 0, reward_mean=3.0)]
    pop = L.population_scalars(rows)
    assert pop[0]["reward_mean"] == 2.0
    assert pop[0]["population_max_reward"] == 3.0
    assert "pass_at_k" not in pop[0]  # NaN in every member: no point rather than a NaN point


def test_complexity_histogram_spreads_each_quantile_interval_over_its_share_of_ideas():
    edges, counts = L.complexity_histogram([_row(0, 0)], bins=4)
    assert edges[0] == 1.0 and edges[-1] == 5.0  # p10 .. p90
    # 100 ideas: 15 between p10 and p25, 25, 25, then 15 between p75 and p90.
    assert counts.tolist() == pytest.approx([15, 25, 25, 15])
    two = L.complexity_histogram([_row(0, 0), _row(1, 0, ideas=50)], bins=4)
    assert two[1].sum() == pytest.approx(0.8 * 150)
    assert L.complexity_histogram([_row(0, 0, complexity_p50=float("nan"))]) is None
    # Quantile intervals of zero width put their ideas in the bin of their value.
    flat = {col: 2.0 for col, _ in L._QUANTILES[:3]} | {"complexity_p75": 4.0, "complexity_p90": 4.0}
    edges, counts = L.complexity_histogram([_row(0, 0, **flat)], bins=4)
    assert (edges[0], edges[-1]) == (2.0, 4.0)
    assert counts.tolist() == pytest.approx([15 + 25 + 6.25, 6.25, 6.25, 6.25 + 15])  # 25 ideas over 2..4


def test_a_missing_client_is_one_line_naming_the_package(monkeypatch, tmp_path, capsys):
    real = L.importlib.util.find_spec
    monkeypatch.setattr(L.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    with pytest.raises(ConfigError, match="pip install mlflow-skinny"):
        L.check_available(["tensorboard", "mlflow"])
    code = main(
        [
            "train",
            "--executor",
            "local",
            "--quiet",
            "--out",
            str(tmp_path / "r"),
            "--set",
            "run.loggers=[tensorboard,mlflow]",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "mlflow-skinny" in err
    assert not (tmp_path / "r").exists()  # refused before the run directory was made


def test_a_logger_named_twice_is_a_config_error():
    with pytest.raises(ConfigError, match="twice"):
        load_config(None, ["run.loggers=[tensorboard,tensorboard]"])


# ---- a real short run, read back -------------------------------------------------------------------


def _available(name: str) -> bool:
    return L.importlib.util.find_spec(L.CLIENT_PACKAGES[name][0]) is not None


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short Pop-GRPO run (in-process members) logging to every tracker installed here,
    through the real command; ``stderr`` is what it printed there."""
    pytest.importorskip("tensorboard")
    names = ["tensorboard", *(n for n in ("mlflow", "wandb") if _available(n) or IN_CI)]
    root = tmp_path_factory.mktemp("runs")
    overrides = [arg for o in [*SHORT, f"run.loggers=[{','.join(names)}]"] for arg in ("--set", o)]
    old = os.environ.get("WANDB_SILENT")
    os.environ["WANDB_SILENT"] = "true"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(
                [
                    "train",
                    "--config",
                    "pop_grpo",
                    "--executor",
                    "local",
                    "--out",
                    str(root / "run"),
                    *overrides,
                ]
            )
    finally:
        os.environ.pop("WANDB_SILENT") if old is None else os.environ.update(WANDB_SILENT=old)
    assert code == 0, stderr.getvalue()
    return root / "run", pd.read_parquet(root / "run" / "metrics.parquet"), stderr.getvalue()


def test_train_prints_where_to_watch_on_stderr(short_run):
    run_dir, _, stderr = short_run
    # `tensorboard` as the shell finds it, or the script beside this Python (watching._command).
    program = "tensorboard" if shutil.which("tensorboard") else str(Path(sys.executable).parent / "tensorboard")
    assert f"popgrpo: TensorBoard: {program} --logdir {run_dir.parent}  (then http://localhost:6006)" in stderr
    assert "Ray dashboard" not in stderr  # no Ray, no dashboard
    if _available("mlflow"):
        assert f"--backend-store-uri {run_dir.parent / 'mlruns'}" in stderr


class TensorBoard:
    """``tensorboard`` on 127.0.0.1 and a free port; stopped by its own handle."""

    def __init__(self, logdir: Path) -> None:
        self.port = free_port()
        self.log = open(logdir.parent / "tensorboard.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
             "--port", str(self.port), "--reload_interval", "1"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def get(self, path: str, **params):
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}{query}", timeout=10) as resp:
            return json.load(resp)

    def get_bytes(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
            return resp.read()

    def wait_for(self, path: str, ready, timeout: float = 90.0):
        """Poll ``path`` until ``ready(answer)``; the last answer (or error) on timeout."""
        deadline, answer = time.time() + timeout, None
        while time.time() < deadline:
            assert self.proc.poll() is None, "tensorboard exited"
            with contextlib.suppress(OSError):
                answer = self.get(path)
                if ready(answer):
                    return answer
            time.sleep(0.5)
        raise AssertionError(f"tensorboard: {path} not ready in {timeout} s; last answer {answer}")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def test_tensorboard_serves_the_runs_curves_heatmaps_histograms_and_lineage(short_run):
    run_dir, metrics, _ = short_run
    # As a user would: the runs/ folder above the run, not the event directory itself.
    board = TensorBoard(run_dir.parent)
    try:
        prefix = f"{run_dir.name}/tensorboard"
        runs = [f"{prefix}/population", *(f"{prefix}/member_{k}" for k in range(3))]
        tags = board.wait_for("/data/plugin/scalars/tags", lambda a: all("reward_mean" in a.get(r, {}) for r in runs))
        for col in ("reward_mean", "reward_max", "diversity", "complexity", "entropy", "archive_coverage"):
            assert all(col in tags[r] for r in runs), col
        assert "population_max_reward" in tags[f"{prefix}/population"]

        # Every member's curve is its metrics.parquet column, epoch by epoch.
        for k in range(3):
            points = board.get("/data/plugin/scalars/scalars", run=f"{prefix}/member_{k}", tag="diversity")
            expected = metrics[metrics["member"] == k].sort_values("epoch")
            assert [p[1] for p in points] == expected["epoch"].tolist()
            assert [p[2] for p in points] == pytest.approx(expected["diversity"].tolist(), rel=1e-6)
        population = board.get("/data/plugin/scalars/scalars", run=f"{prefix}/population", tag="reward_max")
        assert [p[2] for p in population] == pytest.approx(
            metrics.groupby("epoch")["reward_max"].mean().tolist(), rel=1e-6
        )

        images = board.wait_for("/data/plugin/images/tags", lambda a: f"{prefix}/member_0" in a)
        assert "archive_heatmap" in images[f"{prefix}/member_0"]  # private archives: one per member
        shots = board.get("/data/plugin/images/images", run=f"{prefix}/member_0", tag="archive_heatmap", sample=0)
        assert [s["step"] for s in shots] == [1, 3, 5, 7]  # each round's last epoch
        # The picture TensorBoard serves is the heatmap's: cells of 16 px, three channels.
        picture = np.asarray(
            Image.open(io.BytesIO(board.get_bytes(f"/data/plugin/images/individualImage?{shots[-1]['query']}")))
        )
        cells = picture.shape[0] // 16
        assert picture.shape == (cells * 16, cells * 16, 3) and cells > 1
        assert (picture[::16, ::16] == picture[15::16, 15::16]).all()  # flat colour per cell
        assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 1
        histograms = board.get("/data/plugin/histograms/tags")
        assert "complexity_hist" in histograms[f"{prefix}/population"]
        hist = board.get("/data/plugin/histograms/histograms", run=f"{prefix}/population", tag="complexity_hist")
        assert [h[1] for h in hist] == list(range(8))
        text = board.get("/data/plugin/text/tags")
        assert "lineage/text_summary" in text[f"{prefix}/population"]  # torch's name for add_text("lineage")
        lineage = board.get("/data/plugin/text/text", run=f"{prefix}/population", tag="lineage/text_summary")
        assert "selected" in lineage[0]["text"]
    finally:
        board.stop()


def test_mlflow_file_store_holds_the_run(short_run):
    require_module("mlflow")
    from mlflow.tracking import MlflowClient

    run_dir, metrics, _ = short_run
    client = MlflowClient(tracking_uri=(run_dir.parent / "mlruns").as_uri())
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    history = client.get_metric_history(run_id, "member_1/reward_mean")
    expected = metrics[metrics["member"] == 1].sort_values("epoch")["reward_mean"].tolist()
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(expected)
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "lineage", "archive_heatmap"} <= artifacts
    assert [a.path for a in client.list_artifacts(run_id, "lineage")] == [
        f"lineage/round_{r:04d}.json" for r in range(3)
    ]


def test_wandb_offline_run_holds_history_heatmaps_and_lineage(short_run):
    """What ``wandb sync`` would upload. W&B has no public reader for an offline run, so the
    files are checked: the run record names every logged key, the media are there."""
    require_module("wandb")
    run_dir, _, _ = short_run
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    [offline] = list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    record = (offline / f"run-{run_id}.wandb").read_bytes()
    for key in ("population/reward_mean", "population/population_max_reward", "member_2/diversity"):
        assert key.encode() in record, key
    heatmaps = sorted((offline / "files" / "media" / "images" / "archive_heatmap").glob("*.png"))
    assert len(heatmaps) == 3 * 4  # private archives: one per member, each of the four rounds
    [table] = list((offline / "files" / "media" / "table").glob("lineage_*.table.json"))
    rows = json.loads(table.read_text())["data"]
    assert [r[0] for r in rows] == [0, 1, 2] and json.loads(rows[0][1])["selected"]


@pytest.mark.requires("chromium")
def test_tensorboard_scalars_page_in_a_real_browser(short_run, tmp_path):
    """Headless Chromium opens TensorBoard's scalars page and sees the run's charts.

    ``POPGRPO_SCREENSHOT_DIR=docs/img`` keeps the screenshot (docs/guides/watch.md's picture)."""
    from tests.browser import Chromium

    run_dir, _, _ = short_run
    out = Path(os.environ.get("POPGRPO_SCREENSHOT_DIR") or tmp_path)
    board = TensorBoard(run_dir.parent)
    browser = None
    try:
        board.wait_for("/data/plugin/scalars/tags", lambda a: f"{run_dir.name}/tensorboard/population" in a)
        browser = Chromium(width=1280, height=860)
        # The Time Series page TensorBoard opens on, filtered to three charts, no smoothing.
        url = f"http://127.0.0.1:{board.port}/?tagFilter=reward_m%7Cdiversity&smoothing=0#timeseries"
        png = out / "tensorboard_scalars.png"
        text = browser.capture(url, expect=["reward_mean", "reward_max", "diversity"], png=png)
        for k in range(3):  # every member is a run to tick, and so is the population
            assert f"{run_dir.name}/tensorboard/member_{k}" in text
        assert f"{run_dir.name}/tensorboard/population" in text
        assert png.read_bytes()[:4] == b"\x89PNG"
    finally:
        if browser is not None:
            browser.stop()
        board.stop()


def test_logged_members_caps_the_per_member_series_not_the_populations(tmp_path):
    """With ``run.logged_members`` = 2 of 4 members: TensorBoard runs and archive heatmaps for
    members 0 and 1 only; the population's curve still averages all four members."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from popgrpo.algorithms.archive_service import LocalArchive

    assert load_config(None).run.logged_members == 32
    rows = [_row(k, e, reward_mean=float(10 * k + e)) for k in range(4) for e in range(2)]
    states = [LocalArchive(cells_per_dim=4).state_dict() for _ in range(4)]
    heatmaps = L.archive_heatmaps(states, shared=False, members=2)
    assert sorted(heatmaps) == ["member_0", "member_1"]
    assert sorted(L.archive_heatmaps(states, shared=False)) == [f"member_{k}" for k in range(4)]
    assert sorted(L.archive_heatmaps(states[:1], shared=True, members=0)) == ["shared"]
    report = L.RoundReport(0, 2, rows, None, heatmaps, logged_members=2)
    assert {r["member"] for r in report.member_rows()} == {0, 1}
    assert L.RoundReport(0, 2, rows).member_rows() == rows  # no cap: every member

    logger = L.TensorBoardLogger(tmp_path)
    logger.log_round(report)
    logger.close()
    assert sorted(p.name for p in (tmp_path / "tensorboard").iterdir()) == ["member_0", "member_1", "population"]
    population = EventAccumulator(str(tmp_path / "tensorboard" / "population"))
    population.Reload()
    means = [e.value for e in population.Scalars("reward_mean")]
    assert means == pytest.approx([15.0, 16.0])  # epochs 0 and 1 over members 0-3
    member = EventAccumulator(str(tmp_path / "tensorboard" / "member_1"))
    member.Reload()
    assert [e.value for e in member.Scalars("reward_mean")] == pytest.approx([10.0, 11.0])
    assert member.Tags()["images"] == ["archive_heatmap"]
