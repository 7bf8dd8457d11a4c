"""A learned proxy as a member's reward source: it trains on the proxy, logs the execution
reward as control, and a bad RM directory stops the run as bad input."""

import json
import math

import pandas as pd
import pytest
import torch

from popgrpo.columns import CONTROL_COLUMNS, METRIC_COLUMNS
from popgrpo.config import ConfigError, load_config


def _proxy_config(rm_dir, *extra):
    return load_config(
        None,
        [
            "run.epochs=2",
            "grpo.steps_per_epoch=2",
            "run.loggers=[]",
            "reward.source=proxy",
            f"reward.proxy.dir={rm_dir}",
            *extra,
        ],
    )


def test_a_proxy_run_logs_the_control_reward_beside_the_proxy_reward(tiny_rm_dir, tmp_path):
    from popgrpo.algorithms.archive_service import LocalArchive
    from popgrpo.algorithms.member import Member
    from popgrpo.reward_models.proxy import ProxyReward
    from popgrpo.train import train

    config = _proxy_config(tiny_rm_dir, "reward.proxy.combine=warm")
    member = Member(0, config, LocalArchive())
    assert isinstance(member.reward_source, ProxyReward)
    summary = train(config, tmp_path / "run", progress=False)
    assert math.isfinite(summary["mean_reward"])
    metrics = pd.read_parquet(tmp_path / "run" / "metrics.parquet")
    assert set(CONTROL_COLUMNS) <= set(metrics.columns) and list(metrics.columns)[: len(METRIC_COLUMNS)] == list(
        METRIC_COLUMNS
    )
    for column in CONTROL_COLUMNS:
        assert metrics[column].notna().all()
    # What the members trained on (the proxy's scores) is not the execution reward.
    assert not (metrics["reward_mean"] - metrics["control_reward_mean"]).abs().lt(1e-6).any()
    assert (metrics["control_expected_reward"] > 0).all()


def test_without_a_proxy_the_control_is_the_execution_reward_itself(tmp_path):
    from popgrpo.algorithms.archive_service import LocalArchive
    from popgrpo.algorithms.member import Member

    config = load_config(None, ["grpo.steps_per_epoch=2"])
    (row,) = Member(0, config, LocalArchive()).train_epochs(1)
    assert row["control_reward_mean"] == row["reward_mean"] and row["control_reward_max"] == row["reward_max"]
    assert row["control_share"] == 1.0
    assert 0 < row["control_expected_reward"] < 2.6  # E[R] = Q·p_exec: below the best peak's quality


def test_the_proxy_scores_are_the_combined_rms(tiny_rm_dir):
    from popgrpo.core.reward_model import ensemble_scores, weight_average
    from popgrpo.reward_models.proxy import ProxyReward, load_proxy_models
    from popgrpo.reward_models.store import build_model, load_manifest, load_states

    manifest = load_manifest(tiny_rm_dir)
    states = load_states(tiny_rm_dir, [m["file"] for m in manifest["models"]])
    x = torch.randn(20, 16)
    ens = ProxyReward(load_proxy_models(tiny_rm_dir, "ens", 2), None).scores(x)
    assert torch.allclose(ens, ensemble_scores([build_model(manifest, s)(x) for s in states[:2]]), atol=1e-6)
    warm = ProxyReward(load_proxy_models(tiny_rm_dir, "warm", None), None).scores(x)
    assert torch.allclose(warm, build_model(manifest, weight_average(states))(x), atol=1e-6)
    stored = torch.load(tiny_rm_dir / "warm.pt", weights_only=True)
    assert torch.allclose(warm, build_model(manifest, stored)(x), atol=1e-6)
    single = ProxyReward(load_proxy_models(tiny_rm_dir, "single", index=2), None).scores(x)
    assert torch.allclose(single, build_model(manifest, states[2])(x), atol=1e-6)


def test_bad_or_missing_rm_directories_exit_2_with_one_line(tiny_rm_dir, tmp_path, capsys):
    from popgrpo.cli import main

    def run(*args):
        code = main(list(args))
        return code, capsys.readouterr().err

    (tmp_path / "empty").mkdir()
    cases = [
        (["train", "--executor", "local", "--set", "reward.source=proxy"], "reward.proxy.dir"),
        (
            [
                "train",
                "--executor",
                "local",
                "--set",
                "reward.source=proxy",
                "--set",
                f"reward.proxy.dir={tmp_path / 'nope'}",
            ],
            "not found",
        ),
        (
            [
                "train",
                "--executor",
                "local",
                "--set",
                "reward.source=proxy",
                "--set",
                f"reward.proxy.dir={tmp_path / 'empty'}",
            ],
            "no rms.json",
        ),
        (
            [
                "train",
                "--executor",
                "local",
                "--set",
                "reward.source=proxy",
                "--set",
                f"reward.proxy.dir={tiny_rm_dir}",
                "--set",
                "reward.proxy.combine=single",
                "--set",
                "reward.proxy.index=7",
            ],
            "holds 3 RMs",
        ),
        (
            [
                "train",
                "--executor",
                "local",
                "--set",
                "reward.source=proxy",
                "--set",
                f"reward.proxy.dir={tiny_rm_dir}",
                "--set",
                "reward.proxy.n_models=4",
            ],
            "holds 3 RMs",
        ),
        (["rm", "bon", str(tmp_path / "empty")], "no rms.json"),
        (
            ["rm", "train", "--out", str(tmp_path / "x"), "--set", "finetune.lr_min=1", "--set", "finetune.lr_max=0.1"],
            "lr_min must be <= lr_max",
        ),
        (["rm", "train", "--out", str(tiny_rm_dir)], "already holds RMs"),
    ]
    for args, message in cases:
        code, stderr = run(*args, "--out", str(tmp_path / "run")) if args[0] == "train" else run(*args)
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], (args, stderr[-2000:])
    assert not (tmp_path / "run" / "metrics.parquet").exists()


def test_a_corrupt_manifest_is_refused(tmp_path):
    from popgrpo.reward_models.store import RMDirError, load_manifest

    (tmp_path / "rms.json").write_text("{not json")
    with pytest.raises(RMDirError, match="unreadable"):
        load_manifest(tmp_path)
    (tmp_path / "rms.json").write_text(json.dumps({"format": 1, "models": [{"file": "rm_0.pt"}]}))
    with pytest.raises(RMDirError, match=r"rm_0\.pt is missing"):
        load_manifest(tmp_path)


def test_config_refuses_a_proxy_without_a_directory():
    with pytest.raises(ConfigError, match=r"reward\.proxy\.dir"):
        load_config(None, ["reward.source=proxy"])
    with pytest.raises(ConfigError, match=r"reward\.proxy\.combine"):
        load_config(None, ["reward.proxy.combine=median"])


def test_docs_warm_carries_the_current_rm_config_reference():
    from pathlib import Path

    from popgrpo.reward_models.config import rm_config_markdown

    doc = (Path(__file__).resolve().parents[2] / "docs" / "WARM.md").read_text()
    assert rm_config_markdown() in doc, "docs/WARM.md is stale: regenerate with `popgrpo rm train --markdown`"


def _count_executions(member):
    """Wrap the member's environment's execution (the real one) to count the ideas it executes."""
    env = member.rollouts.env
    real, executed = env.execute, []

    def counting(ideas, generator):
        executed.append(ideas.shape[0])
        return real(ideas, generator)

    env.execute = counting
    return executed


def test_control_fraction_executes_only_a_seeded_share_of_the_ideas(tiny_rm_dir):
    from popgrpo.algorithms.archive_service import LocalArchive
    from popgrpo.algorithms.member import Member

    rows, executions = {}, {}
    for fraction in (1.0, 0.25, 0.25):
        config = _proxy_config(tiny_rm_dir, f"reward.proxy.control_fraction={fraction}")
        member = Member(0, config, LocalArchive())
        executed = _count_executions(member)
        rows.setdefault(fraction, []).append(member.train_epochs(1)[0])
        executions.setdefault(fraction, []).append(executed)
    n = config.policy.n_prompts * config.grpo.group_size  # ideas per step; 2 steps
    assert executions[1.0][0] == [n, n]
    k = round(0.25 * n)
    assert executions[0.25] == [[k, k], [k, k]]
    full, (part, again) = rows[1.0][0], rows[0.25]
    assert full["control_share"] == 1.0 and part["control_share"] == pytest.approx(k / n)
    # Seeded: the same seed executes the same subset, so the estimate is reproduced exactly.
    assert part["control_reward_mean"] == again["control_reward_mean"]
    assert math.isfinite(part["control_reward_mean"])
    # What the member trained on is the proxy over every idea, and the noise-free expectation
    # (no execution) still covers every idea: both the same whatever the fraction.
    assert part["ideas"] == full["ideas"] == 2 * n
    assert math.isfinite(part["control_expected_reward"])


def test_control_fraction_outside_0_1_is_refused():
    for bad in ("0", "1.5", "-0.1"):
        with pytest.raises(ConfigError, match="control_fraction"):
            load_config(None, [f"reward.proxy.control_fraction={bad}"])
