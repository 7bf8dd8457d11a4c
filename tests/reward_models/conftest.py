import pytest

TINY_RM = (
    "seed=3",
    "data.reference_ideas=256",
    "data.train_pairs=200",
    "data.test_pairs=100",
    "featurizer.hidden=16",
    "featurizer.pretrain_steps=30",
    "featurizer.pretrain_ideas=256",
    "featurizer.checkpoints=2",
    "finetune.n_models=3",
    "finetune.epochs=2",
)


@pytest.fixture(scope="session")
def tiny_rm_dir(tmp_path_factory):
    """A small RM directory made in-process (the steps of `popgrpo rm train` without Tune)."""
    from popgrpo.reward_models.config import load_rm_config
    from popgrpo.reward_models.reference import load_base
    from popgrpo.reward_models.training import draw_hyperparameters, finalize, finetune_member, prepare

    rm_dir = tmp_path_factory.mktemp("rms")
    cfg = load_rm_config(None, [*TINY_RM, "data.corruption=0.25"])
    prepare(cfg, load_base(cfg), rm_dir)
    finalize(cfg, rm_dir, [finetune_member(cfg, rm_dir, h) for h in draw_hyperparameters(cfg)])
    return rm_dir
