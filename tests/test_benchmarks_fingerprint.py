"""benchmarks.fingerprint: per-column digests tell an added column from a changed one."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.fingerprint import column_digests, compare, frame_digest


def _write(path: Path, frame: pd.DataFrame) -> Path:
    frame.to_parquet(path)
    return path


def _result(path: Path) -> dict:
    return {"metrics": frame_digest(path), "columns": {"metrics": column_digests(path)}}


def test_column_digests_skip_timing_columns_and_ignore_names(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.parquet", pd.DataFrame({"x": [1.0, 2.0], "wall_seconds": [3.0, 4.0]}))
    b = _write(tmp_path / "b.parquet", pd.DataFrame({"y": [1.0, 2.0]}))
    assert list(column_digests(a)) == ["x"]
    assert column_digests(a)["x"] == column_digests(b)["y"]


def test_an_added_column_passes_and_is_named(tmp_path: Path) -> None:
    base = pd.DataFrame({"x": [1.0, 2.0], "tags": [[1], [2, 3]]})
    before = _result(_write(tmp_path / "a.parquet", base))
    after = _result(_write(tmp_path / "b.parquet", base.assign(peaks=[0, 1])))
    assert before["metrics"] != after["metrics"]  # the whole-frame digest sees the new column
    differ, added = compare({"run": before}, {"run": after})
    assert differ == {}
    assert added == {"run": ["metrics.peaks"]}


def test_a_changed_or_removed_column_fails(tmp_path: Path) -> None:
    base = pd.DataFrame({"x": [1.0, 2.0], "y": [0, 1]})
    before = _result(_write(tmp_path / "a.parquet", base))
    changed = _result(_write(tmp_path / "b.parquet", base.assign(x=[1.0, 2.0000001])))
    removed = _result(_write(tmp_path / "c.parquet", base.drop(columns="y")))
    differ, _ = compare({"run": before}, {"run": changed, "other": changed})
    assert differ == {"run": ["metrics.x"], "other": ["(run missing from the baseline)"]}
    differ, _ = compare({"run": before}, {"run": removed})
    assert differ == {"run": ["metrics.y"]}


def test_a_whole_frame_baseline_compares_whole_frames(tmp_path: Path) -> None:
    base = pd.DataFrame({"x": [1.0, 2.0]})
    old = {"metrics": frame_digest(_write(tmp_path / "a.parquet", base))}
    same = _result(_write(tmp_path / "b.parquet", base))
    wider = _result(_write(tmp_path / "c.parquet", base.assign(z=[0, 0])))
    assert compare({"run": old}, {"run": same}) == ({}, {})
    assert compare({"run": old}, {"run": wider}) == ({"run": ["metrics"]}, {})
