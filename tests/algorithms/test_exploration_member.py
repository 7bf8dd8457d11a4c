"""The explore section in a member's step: each mechanism reaches the advantages or the loss
as its formula says, and a two-epoch run with it trains and differs from plain GRPO."""

import numpy as np
import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from popgrpo.config import ConfigError, load_config
from popgrpo.core.exploration import (
    count_bonus,
    maxk_advantages,
    passk_advantages,
    unlikeliness_rewards,
)
from popgrpo.core.grpo import group_advantages

SMALL = ("run.epochs=2", "grpo.steps_per_epoch=2", "policy.n_prompts=4", "grpo.group_size=8", "eval.k=4")


def _member(*overrides, archive=None, member_id=0):
    cfg = load_config(None, [*SMALL, *overrides])
    return Member(member_id, cfg, archive or LocalArchive())


def _one_step(member):
    """One step's scores and the batch the update would learn from (no update)."""
    samples = member.rollouts.sample(member.generator)
    pending = member.score_begin(samples)
    return pending, member.score_end(pending)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("explore.advantage=passk", "eval.success_threshold=0.3"), lambda r, s: passk_advantages(r, 0.3, 4, 1e-6)),
        (("explore.advantage=maxk", "explore.k=3"), lambda r, s: maxk_advantages(r, 3)),
        (
            ("explore.unlikeliness=0.5",),
            lambda r, s: group_advantages(unlikeliness_rewards(r, s.old_logp, 0.5), 1e-6),
        ),
    ],
    ids=["passk", "maxk", "unlikeliness"],
)
def test_the_advantages_are_the_mechanisms_formula_of_the_rewards(overrides, expected):
    pending, batch = _one_step(_member(*overrides))
    want = expected(pending.scores.rewards, pending.samples)
    assert bool((want != 0).any())
    torch.testing.assert_close(batch.advantages, want)
    plain = group_advantages(pending.scores.rewards, 1e-6)
    assert not torch.allclose(batch.advantages, plain)  # the mechanism changed something


def test_w_reinforce_is_plus_lambda_or_minus_one():
    pending, batch = _one_step(
        _member("explore.advantage=reinforce", "explore.positive_weight=0.1", "eval.success_threshold=0.3")
    )
    correct = pending.scores.rewards >= 0.3
    assert correct.any() and (~correct).any()
    torch.testing.assert_close(batch.advantages, torch.where(correct, 0.1, -1.0))


def test_the_count_bonus_uses_and_grows_the_archives_counts():
    archive = LocalArchive()
    member = _member("explore.count_bonus=0.5", archive=archive)
    pending, batch = _one_step(member)
    n = pending.scores.rewards.numel()
    assert archive.outcomes.total == n
    cells = archive.grid.cell_of(member.rollouts.behaviour(pending.scores.features).numpy())
    bonus = count_bonus(archive.outcomes.counts[cells], 0.5).reshape(pending.scores.rewards.shape)
    want = group_advantages(pending.scores.rewards + torch.as_tensor(bonus, dtype=torch.float32), 1e-6)
    torch.testing.assert_close(batch.advantages, want)
    _one_step(member)
    assert archive.outcomes.total == 2 * n


def test_pooled_counts_see_every_member_and_private_ones_only_their_own():
    shared = LocalArchive()
    members = [_member("explore.count_bonus=0.5", archive=shared, member_id=k) for k in range(2)]
    for m in members:
        _one_step(m)
    n = 4 * 8
    assert shared.outcomes.total == 2 * n  # pooled over the population
    private = [LocalArchive(), LocalArchive()]
    for k, archive in enumerate(private):
        _one_step(_member("explore.count_bonus=0.5", archive=archive, member_id=k))
    assert [a.outcomes.total for a in private] == [n, n]
    # the second member saw the first's outcomes: its counts, and so its bonuses, differ
    assert not np.array_equal(shared.outcomes.counts, private[1].outcomes.counts)


def test_the_counts_survive_a_state_round_trip():
    archive = LocalArchive()
    _one_step(_member("explore.count_bonus=0.5", archive=archive))
    again = LocalArchive()
    again.load_state_dict(archive.state_dict())
    assert np.array_equal(again.outcomes.counts, archive.outcomes.counts) and again.outcomes.total == 32
    assert "outcomes" not in LocalArchive().state_dict()  # runs without the bonus keep their states


@pytest.mark.parametrize(
    "overrides",
    [
        ("explore.advantage=passk",),
        ("explore.advantage=maxk",),
        ("explore.advantage=reinforce", "explore.positive_weight=0.1"),
        ("explore.unlikeliness=0.5",),
        ("explore.count_bonus=0.3",),
        ("explore.clip_high=0.28", "grpo.updates_per_batch=4", "grpo.lr=0.01"),
        (
            "explore.policy_loss=clip_cov",
            "explore.cov_ratio=0.1",
            "explore.clip_cov_low=-100",
            "explore.clip_cov_high=100",
        ),
        ("explore.policy_loss=kl_cov", "explore.cov_ratio=0.1", "grpo.updates_per_batch=2"),
        # composed with QD-GRPO, MaxEnt-GRPO (entropy, novelty, complexity bins)
        ("explore.advantage=maxk", "qd.enabled=true", "maxent.novelty.enabled=true", "maxent.complexity_bins=2"),
        ("explore.policy_loss=kl_cov", "explore.count_bonus=0.3", "maxent.entropy.enabled=true"),
    ],
    ids=lambda o: ",".join(x.split("=")[0].split(".")[-1] + "=" + x.split("=")[1] for x in o),
)
def test_a_two_epoch_run_with_the_mechanism_trains_and_differs_from_grpo(overrides):
    plain = _member(*[o for o in overrides if not o.startswith("explore.")])
    member = _member(*overrides)
    rows = member.train_epochs(2)
    plain.train_epochs(2)
    assert all(np.isfinite(r["reward_mean"]) and np.isfinite(r["entropy"]) for r in rows)
    weights, plain_weights = member.get_weights(), plain.get_weights()
    assert any(not torch.equal(weights[k], plain_weights[k]) for k in weights)


def test_vectorised_members_run_the_mechanisms_as_unbatched_ones():
    # population.vectorize steps packed members in one batched pass; the explore terms are per member
    from popgrpo.runtime.executor import LocalExecutor

    sets = ("population.size=2", "explore.policy_loss=kl_cov", "explore.cov_ratio=0.1", "explore.advantage=maxk")
    rows, weights = {}, {}
    for vectorize in ("true", "false"):
        executor = LocalExecutor(load_config(None, [*SMALL, *sets, f"population.vectorize={vectorize}"]))
        rows[vectorize] = executor.train(1)
        weights[vectorize] = executor.get_weights(range(2))
        executor.close()
    for k in (0, 1):
        assert rows["true"][k][0]["reward_mean"] == pytest.approx(rows["false"][k][0]["reward_mean"], rel=1e-4)
        for name, value in weights["true"][k].items():
            torch.testing.assert_close(value, weights["false"][k][name], atol=1e-5, rtol=1e-4)


def test_clip_higher_changes_only_updates_past_the_first():
    # With one update per batch the ratio is 1 at the step: clip-higher cannot bind.
    a, b = _member(), _member("explore.clip_high=0.28")
    a.train_epochs(1)
    b.train_epochs(1)
    assert all(torch.equal(x, y) for x, y in zip(a.get_weights().values(), b.get_weights().values(), strict=True))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["explore.advantage=passk", "explore.k=9"], r"explore.k \(9\) must be <= grpo.group_size \(8\)"),
        (["explore.advantage=maxk", "explore.k=9"], r"explore.k \(9\) must be <= grpo.group_size \(8\)"),
        (["explore.clip_cov_low=2", "explore.clip_cov_high=1"], "clip_cov_high"),
        (["explore.positive_weight=-1"], "explore.positive_weight"),
        (["explore.advantage=passk2"], "explore.advantage: unknown advantage estimator 'passk2'"),
    ],
)
def test_bad_explore_values_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*SMALL, *overrides])


def test_explore_k_binds_only_the_estimators_that_take_k_subsets():
    """A group smaller than the default explore.k is fine while no pass@k or max@k advantage reads k."""
    config = load_config(None, [*SMALL, "grpo.group_size=2", "eval.k=2"])
    assert config.explore.advantage == "group" and config.explore.k > config.grpo.group_size
