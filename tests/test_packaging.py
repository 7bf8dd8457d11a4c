"""The wheel: every package is listed in pyproject, and preset names resolve in a non-editable install."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "popgrpo").rglob("__init__.py")}
    assert found | {"popgrpo.presets", "popgrpo.dashboards"} == listed


@pytest.mark.integration
def test_a_built_wheel_carries_the_presets_and_resolves_them(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("popgrpo-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    presets = {p.name for p in (ROOT / "jobs" / "configs").glob("*.yaml")}
    assert {f"popgrpo/presets/{name}" for name in presets} | {"popgrpo/dashboards/popgrpo.json"} <= names
    # Imported from the unpacked wheel (as site-packages would), outside the source tree.
    code = (
        "from popgrpo.config import PRESET_DIR, load_config, preset_path; print(PRESET_DIR); "
        "load_config(preset_path('pop_grpo')); from popgrpo.ops.dashboards import DASHBOARD_PATH; print(DASHBOARD_PATH)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    site = tmp_path / "site" / "popgrpo"
    assert out.stdout.split() == [str(site / "presets"), str(site / "dashboards" / "popgrpo.json")]
