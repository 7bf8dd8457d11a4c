"""`popgrpo rm train` end to end on an embedded Ray: M = 2 RMs as Tune trials, their WARM and ENS."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from tests.reward_models.conftest import TINY_RM
from tests.services import ray_subprocess_env

# M = 2 RMs as Tune trials on an embedded Ray: make test-slow (docs/reference/tests.md).
pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow]


def test_rm_train_fine_tunes_m_rms_as_tune_trials_and_writes_warm_and_ens(tmp_path):
    out = tmp_path / "rms"
    env = ray_subprocess_env("pgrm-")
    sets = [s for item in TINY_RM if not item.startswith("finetune.n_models") for s in ("--set", item)]
    cmd = [sys.executable, "-m", "popgrpo", "rm", "train", "--out", str(out), "--num-cpus", "2"]
    cmd += [*sets, "--set", "finetune.n_models=2", "--set", "data.shift_epochs=1", "--set", "data.shifted_pairs=50"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rm train: 100%" in done.stderr and "2/2" in done.stderr  # the progress bar
    manifest = json.loads((out / "rms.json").read_text())
    models = manifest["models"]
    assert [m["rm_index"] for m in models] == [0, 1] and (out / "tune").is_dir()
    # Each trial drew its own hyper-parameters from the configured ranges (the diversity).
    ft = manifest["config"]["finetune"]
    assert all(ft["lr_min"] <= m["lr"] <= ft["lr_max"] for m in models) and models[0]["lr"] != models[1]["lr"]
    assert all(ft["dropout_min"] <= m["dropout"] <= ft["dropout_max"] for m in models)
    assert models[0]["data_seed"] != models[1]["data_seed"]
    states = [torch.load(out / m["file"], weights_only=True) for m in models]
    warm = torch.load(out / "warm.pt", weights_only=True)
    for key, value in warm.items():
        assert torch.allclose(value, (states[0][key] + states[1][key]) / 2, atol=1e-6)
    assert manifest["ens"]["members"] == ["rm_0.pt", "rm_1.pt"]
    for block in (*(m["accuracy"] for m in models), manifest["warm"]["accuracy"], manifest["ens"]["accuracy"]):
        assert set(block) == {"train_clean", "train_corrupt", "test", "shifted"}
        assert 0.0 <= block["test"] <= 1.0 and 0.0 <= block["shifted"] <= 1.0
    start = done.stdout.index('{\n  "rm_0"')  # after Tune's own start-up lines
    printed = json.loads(done.stdout[start : done.stdout.rindex("}") + 1])
    assert printed["warm"] == manifest["warm"]["accuracy"]
