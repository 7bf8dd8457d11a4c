"""What a member does with its adoption: repulsion in its returns, own-weight and reset-only adoptions."""

import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from popgrpo.core.repulsion import repulsion_penalty
from tests.configs import defaults

SHORT_EPOCHS = ("grpo.steps_per_epoch=2",)


def _twins(cfg, epochs=1):
    a, b = Member(0, cfg, LocalArchive()), Member(0, cfg, LocalArchive())
    a.train_epochs(epochs)
    b.train_epochs(epochs)
    return a, b


def test_repulsion_lowers_the_advantages_of_ideas_near_the_fitter_behaviours():
    cfg = defaults(*SHORT_EPOCHS, "scheduler.repulsion_strength=1.0", "scheduler.repulsion_bandwidth=0.1")
    plain, repelled = _twins(cfg)
    centres = plain.behaviour_descriptors()
    assert len(centres) == cfg.policy.n_prompts and all(len(c) == 2 for c in centres)
    repelled.adopt(None, None, 1, reset_optimizer=False, repel=centres)
    samples = plain.rollouts.sample(plain.generator)
    same = repelled.rollouts.sample(repelled.generator)
    assert torch.equal(samples.ideas, same.ideas)  # twins: the same draws
    base = plain.score_end(plain.score_begin(samples))
    shaped = repelled.score_end(repelled.score_begin(same))
    kernel = repulsion_penalty(plain.rollouts.behaviour(base.scores.features), torch.tensor(centres), 1.0, 0.1).reshape(
        base.advantages.shape
    )
    assert torch.equal(base.scores.rewards, shaped.scores.rewards)  # the reward itself (archive, metrics) is raw
    change = (shaped.advantages - base.advantages).flatten()
    # Within each group, the nearer an idea is to a fitter behaviour, the more its advantage falls.
    centred = kernel - kernel.mean(dim=1, keepdim=True)
    corr = torch.corrcoef(torch.stack([change, centred.flatten()]))[0, 1]
    assert corr < -0.5, corr


def test_repelled_training_moves_ideas_away_from_the_fitter_behaviours():
    cfg = defaults(
        *SHORT_EPOCHS, "grpo.steps_per_epoch=4", "scheduler.repulsion_strength=1.0", "scheduler.repulsion_bandwidth=0.1"
    )
    plain, repelled = _twins(cfg, epochs=2)
    centres = plain.behaviour_descriptors()
    repelled.adopt(None, None, 1, reset_optimizer=False, repel=centres)
    gaps = []
    for _ in range(3):
        near = []
        for member in (plain, repelled):
            member.train_epochs(1)
            features = torch.cat([f for f, _ in member._last_epoch])
            kernel = repulsion_penalty(member.rollouts.behaviour(features), torch.tensor(centres), 1.0, 0.1)
            near.append(float(kernel.mean()))
        gaps.append(near[0] - near[1])
    assert all(g > 0 for g in gaps) and gaps[-1] > gaps[0], gaps  # fewer ideas near them, more so each epoch


def test_own_base_without_mutation_or_reset_changes_nothing():
    a, b = _twins(defaults(*SHORT_EPOCHS))
    weights, adam = a.get_weights(), a.optimizer.state_dict()
    assert a.adopt(None, None, 1, reset_optimizer=False) == {}
    assert all(torch.equal(weights[k], v) for k, v in a.get_weights().items())
    after = a.optimizer.state_dict()["state"]
    assert after and all(torch.equal(after[i]["exp_avg"], adam["state"][i]["exp_avg"]) for i in after)
    assert a.train_epochs(1) == b.train_epochs(1)  # as if nothing happened


def test_reset_only_keeps_the_weights_and_starts_adam_afresh():
    a, _ = _twins(defaults(*SHORT_EPOCHS))
    weights = a.get_weights()
    a.adopt(None, None, 1, reset_optimizer=True)
    assert all(torch.equal(weights[k], v) for k, v in a.get_weights().items())
    assert a.optimizer.state_dict()["state"] == {}


def test_merged_base_without_reset_keeps_adams_moments():
    a, _ = _twins(defaults(*SHORT_EPOCHS))
    step = a.optimizer.state_dict()["state"][0]["step"].clone()
    base = {k: torch.zeros_like(v) for k, v in a.get_weights().items()}
    a.adopt(base, None, 1, reset_optimizer=False)
    assert all(torch.equal(v, base[k]) for k, v in a.get_weights().items())
    assert torch.equal(a.optimizer.state_dict()["state"][0]["step"], step)


def test_repulsion_targets_survive_a_checkpoint():
    a, _ = _twins(defaults(*SHORT_EPOCHS))
    a.adopt(None, None, 1, reset_optimizer=False, repel=[[0.1, 0.2], [0.3, 0.4]])
    b = Member(0, defaults(*SHORT_EPOCHS), LocalArchive())
    b.load_state_dict(a.state_dict())
    assert b.repel is not None and torch.equal(b.repel, a.repel)
    a.adopt(None, None, 2, reset_optimizer=False)  # the next adoption without targets clears them
    assert a.repel is None and "repel" not in a.state_dict()


def test_repel_keep_adds_to_the_members_own_history_and_survives_a_checkpoint():
    a, _ = _twins(defaults(*SHORT_EPOCHS))
    a.adopt(None, None, 1, reset_optimizer=False, repel=[[0.1, 0.2]], repel_keep=True)
    a.adopt(None, None, 2, reset_optimizer=False, repel=[[0.3, 0.4], [0.5, 0.6]], repel_keep=True)
    a.adopt(None, None, 3, reset_optimizer=False, repel=[], repel_keep=True)  # nothing usable: history kept
    history = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], dtype=torch.float64)
    assert a.repel is not None and torch.equal(a.repel, history)
    b = Member(0, defaults(*SHORT_EPOCHS), LocalArchive())
    b.load_state_dict(a.state_dict())
    b.adopt(None, None, 4, reset_optimizer=False, repel=[[0.7, 0.8]], repel_keep=True)
    assert b.repel is not None and torch.equal(
        b.repel, torch.cat([history, torch.tensor([[0.7, 0.8]], dtype=torch.float64)])
    )
    a.adopt(None, None, 4, reset_optimizer=False, repel=[[0.9, 0.9]])  # without keep: replaced
    assert a.repel is not None and a.repel.tolist() == [[0.9, 0.9]]
