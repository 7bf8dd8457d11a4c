"""Calibration: its loss against hand-computed values, a point's overrides, and presets that load and run."""

import math

import pytest
import yaml

from popgrpo.config import load_config
from popgrpo.research.study.calibrate import (
    PAPER_LANDSCAPE_PRESETS,
    START_POINTS,
    TARGET,
    calibration_loss,
    landscape_overrides,
    measure_point,
    within_tolerance,
    write_presets,
)

POINT = {
    "steps_per_epoch": 2,
    "radius_min": 4.5,
    "radius_max": 13.0,
    "exec_lambda": 0.5,
    "log_std_init": -0.1,
    "peak_numbering": 1,
}


def test_loss_is_the_tolerance_scaled_worst_error_plus_a_tenth_of_the_mean():
    target = {"mean_reward": 0.1, "max_reward": 1.0, "diversity": 0.9, "complexity": 4.0}
    measured = {"mean_reward": 0.12, "max_reward": 0.5, "diversity": 0.8, "complexity": 4.0}
    loss, errors = calibration_loss(measured, target)
    # 1 − diversity is 0.2 against 0.1: a factor of 2, log2 ratio 1.
    assert errors == pytest.approx({"mean_reward": 0.2, "max_reward": 0.5, "diversity": 1.0, "complexity": 0.0})
    scaled = (0.2 / 0.2, 0.5 / 0.2, 1.0 / 1.0, 0.0)
    assert loss == pytest.approx(2.5 + 0.1 * sum(scaled) / 4)
    assert not within_tolerance(errors)
    # Every number inside its tolerance: loss ≤ 1.1 and the criterion holds; one outside: loss > 1.
    inside = {"mean_reward": 0.085, "max_reward": 1.15, "diversity": 0.85, "complexity": 3.3}
    loss_in, errors_in = calibration_loss(inside, target)
    assert within_tolerance(errors_in) and loss_in <= 1.1
    loss_out, errors_out = calibration_loss({**inside, "diversity": 0.75}, target)  # 1 − d = 0.25: ×2.5
    assert not within_tolerance(errors_out) and loss_out > 1
    assert calibration_loss(dict(TARGET))[0] == 0.0
    assert calibration_loss({**measured, "max_reward": math.nan}, target)[0] == math.inf
    assert calibration_loss({**measured, "diversity": 1.0}, target)[0] == math.inf  # 1 − d = 0


def test_the_search_starts_from_the_hand_probed_points_inside_the_search_space():
    assert len(START_POINTS) == 4
    for point in START_POINTS:
        assert point["steps_per_epoch"] in (1, 2, 3, 4, 8) and point["peak_numbering"] in (0, 1)
        assert 3 <= point["radius_min"] <= 6 and 10 <= point["radius_max"] <= 16
        assert 0.3 <= point["exec_lambda"] <= 1.5 and -0.2 <= point["log_std_init"] <= 0.1
        load_config(None, landscape_overrides(point))  # a valid config


def test_a_point_becomes_config_overrides_with_peaks_numbered_from_one():
    config = load_config(None, landscape_overrides(POINT))
    assert config.grpo.steps_per_epoch == 2 and config.env.exec_lambda == 0.5
    assert (config.env.radius_min, config.env.radius_max, config.policy.log_std_init) == (4.5, 13.0, -0.1)
    assert (config.env.quality_base, config.env.width_base) == (0.8, 2.5)  # peak 1's quality and width first
    zero = load_config(None, landscape_overrides({**POINT, "peak_numbering": 0}))
    assert (zero.env.quality_base, zero.env.width_base) == (0.5, 2.0)


def test_written_presets_carry_the_point_and_train(tmp_path):
    measured = measure_point(POINT, seeds=(42,), epochs=2)
    assert set(measured) == set(TARGET) and all(math.isfinite(v) for v in measured.values())
    loss, _ = calibration_loss(measured)
    fit = {
        "overrides": landscape_overrides(POINT),
        "loss": loss,
        "measured": measured,
        "search": {"seeds": [42]},
    }
    written = write_presets(fit, tmp_path)
    assert sorted(p.stem for p in written) == sorted(PAPER_LANDSCAPE_PRESETS.values())
    pop = load_config(tmp_path / "paper_pop_grpo.yaml")
    assert pop.scheduler.enabled and pop.population.size == 5 and pop.run.name == "paper_pop_grpo"
    assert pop.env.radius_max == 13.0 and pop.grpo.steps_per_epoch == 2
    grpo = load_config(tmp_path / "paper_grpo.yaml", ["run.epochs=2"])
    assert yaml.safe_load((tmp_path / "paper_grpo.yaml").read_text())["env"]["exec_lambda"] == 0.5
    from popgrpo.runtime.executor_spec import LOCAL
    from popgrpo.train import train

    summary = train(grpo, tmp_path / "run", LOCAL, progress=False)
    assert summary["epochs"] == 2


def test_the_paper_landscape_plan_uses_the_calibrated_presets_or_says_how_to_get_them(tmp_path, monkeypatch):
    import popgrpo.research.study.plan as plan
    from popgrpo.config import preset_path

    def shipped_only(name: str):  # as in a tree where calibrate never ran
        return tmp_path / "absent" / f"{name}.yaml" if name.startswith("paper_") else preset_path(name)

    monkeypatch.setattr(plan, "preset_path", shipped_only)
    with pytest.raises(ValueError, match="run `popgrpo calibrate` first"):
        plan.build_plan(quick=True, landscape="paper")
    fit = {"overrides": landscape_overrides(POINT), "loss": 0.1, "measured": dict(TARGET), "search": {"seeds": [42]}}
    write_presets(fit, tmp_path)

    def calibrated_or_shipped(name: str):
        return tmp_path / f"{name}.yaml" if name.startswith("paper_") else preset_path(name)

    monkeypatch.setattr(plan, "preset_path", calibrated_or_shipped)
    trials = plan.build_plan(quick=True, landscape="paper")
    assert {t.preset for t in trials} == set(PAPER_LANDSCAPE_PRESETS.values())
    assert all(t.config().env.radius_max == 13.0 for t in trials)
    assert len(trials) == len(plan.build_plan(quick=True))  # the same cells on either landscape


def test_the_holdout_check_remeasures_the_fit_on_unseen_seeds(tmp_path):
    import json
    from pathlib import Path

    from popgrpo.research.study.calibrate import calibration_loss, holdout_check, measure_point

    fit = json.loads(Path("docs/results/calibration/fit.json").read_text())
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit))
    with pytest.raises(ValueError, match="used by the fit"):
        holdout_check(path, seeds=(42, 7))
    check = holdout_check(path, seeds=(7, 8), epochs=3)
    assert check["fitted"] == fit["measured"] and check["seeds"] == [7, 8]
    assert check["per_seed"][1] == {"seed": 8, **measure_point(fit["point"], (8,), 3)}
    mean = {k: (check["per_seed"][0][k] + check["per_seed"][1][k]) / 2 for k in check["measured"]}
    assert check["measured"] == pytest.approx(mean)
    assert check["loss"] == pytest.approx(calibration_loss(mean)[0])


def test_calibrate_holdout_without_a_fit_exits_2(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "popgrpo", "calibrate", "--holdout", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "no such fit.json" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
