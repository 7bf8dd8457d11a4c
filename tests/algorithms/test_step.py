"""The GRPO step's pure functions against their formulas (main paper eqs. 3–6), and the merge registry."""

import math

import numpy as np
import pytest
import torch

from popgrpo.algorithms.archive_service import EpochInserts, LocalArchive
from popgrpo.algorithms.merges import MERGES, MUTATIONS, MergeInputs
from popgrpo.algorithms.step import distinct_share, grpo_loss, shape_returns, step_advantages, zero_bad
from popgrpo.config import ConfigError, load_config
from popgrpo.core.archive import STATUS_IMPROVED, STATUS_NEW, STATUS_NOT_ADDED
from popgrpo.telemetry.atomic import atomic_path, atomic_write


def test_shape_returns_adds_archive_bonus_and_novelty():
    returns = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    statuses = np.array([STATUS_NEW, STATUS_IMPROVED, STATUS_NOT_ADDED, STATUS_NEW])
    novelty = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    shaped, info = shape_returns(returns, statuses, novelty, beta_new=0.5, beta_imp=0.25, novelty_coef=2.0)
    expected = torch.tensor([[1.0 + 0.5 + 0.2, 2.0 + 0.25 + 0.4], [3.0 + 0.6, 4.0 + 0.5 + 0.8]])
    torch.testing.assert_close(shaped, expected)
    assert (info.new, info.improved, info.novelty) == (2, 1, pytest.approx(0.25))
    # No QD bonus (beta_new None) and no novelty: the returns pass through, the counts remain.
    plain, info = shape_returns(returns, statuses, None, beta_new=None, beta_imp=0.25, novelty_coef=2.0)
    assert torch.equal(plain, returns) and info.new == 2 and math.isnan(info.novelty)


def test_step_advantages_are_group_normalised_and_zero_for_bad_rewards():
    returns = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    finite = torch.tensor([[True, True, True, False]])
    adv = step_advantages(returns, returns.abs(), finite, 1, bins=1, eps=0.0)
    # The bad idea takes the mean of the good ones (2.0): it neither moves the group nor gets an advantage.
    filled = torch.tensor([1.0, 2.0, 3.0, 2.0])
    expected = (filled - filled.mean()) / filled.std()
    expected[3] = 0.0
    torch.testing.assert_close(adv[0], expected)
    good = step_advantages(returns, returns.abs(), torch.ones_like(finite), 0, bins=1, eps=0.0)
    torch.testing.assert_close(good[0], (returns[0] - returns[0].mean()) / returns[0].std())


def test_step_advantages_normalise_within_complexity_bins():
    returns = torch.tensor([[1.0, 5.0, 2.0, 9.0]])
    complexity = torch.tensor([[0.1, 3.0, 0.2, 4.0]])  # bins by complexity: {0, 2} and {1, 3}
    adv = step_advantages(returns, complexity, torch.ones(1, 4, dtype=torch.bool), 0, bins=2, eps=0.0)
    low, high = torch.tensor([1.0, 2.0]), torch.tensor([5.0, 9.0])
    torch.testing.assert_close(adv[0, [0, 2]], (low - low.mean()) / low.std())
    torch.testing.assert_close(adv[0, [1, 3]], (high - high.mean()) / high.std())


def test_grpo_loss_is_clipped_surrogate_plus_kl_minus_entropy():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.0]])
    ref = torch.tensor([[-1.2, -2.5]])
    adv = torch.tensor([[1.0, -1.0]])
    entropy = torch.tensor(0.7)
    loss, kl = grpo_loss(logp, old, ref, adv, entropy, clip=0.2, kl_coef=0.1, alpha=0.3)
    ratio = torch.exp(logp - old)
    surrogate = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
    k3 = (torch.exp(ref - logp) - (ref - logp) - 1).mean()
    torch.testing.assert_close(kl, k3)
    torch.testing.assert_close(loss, surrogate + 0.1 * k3 - 0.3 * 0.7)
    no_bonus, _ = grpo_loss(logp, old, ref, adv, entropy, clip=0.2, kl_coef=0.1, alpha=None)
    torch.testing.assert_close(no_bonus, surrogate + 0.1 * k3)
    summed, _ = grpo_loss(logp, old, ref, adv, entropy, clip=0.2, kl_coef=0.0, alpha=None, reduce=torch.sum)
    torch.testing.assert_close(summed, 2 * surrogate)


def test_zero_bad_replaces_only_non_finite_rewards():
    rewards = torch.tensor([[1.0, math.nan, math.inf, -2.0]])
    assert zero_bad(rewards, torch.isfinite(rewards)).tolist() == [[1.0, 0.0, 0.0, -2.0]]


def test_epoch_inserts_hold_deferred_batches_until_the_epoch_ends():
    behaviour = lambda flat: torch.sigmoid(flat[:, :2])  # noqa: E731
    flat = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    rewards, finite = torch.arange(6.0).reshape(2, 3), torch.ones(2, 3, dtype=torch.bool)
    deferred, direct = LocalArchive(), LocalArchive()
    held = EpochInserts(deferred, behaviour, deferred=True)
    assert held.submit(flat, rewards, finite, False) is None and held.result(None) is None
    assert held.pending == 1 and len(deferred.grid) == 0  # nothing inserted yet
    counts = held.end_epoch()
    sent = EpochInserts(direct, behaviour, deferred=False)
    statuses, _ = sent.result(sent.submit(flat, rewards, finite, False))
    assert sent.end_epoch() is None
    assert counts == (int((statuses == STATUS_NEW).sum()), int((statuses == STATUS_IMPROVED).sum()))
    assert held.pending == 0 and len(deferred.grid) == len(direct.grid) > 0


def test_merge_and_mutation_names_in_the_config_come_from_the_registries():
    assert set(MERGES) == {"soup", "weighted_soup", "greedy_soup", "wise_ft", "task_arithmetic"}
    assert set(MUTATIONS) == {"gaussian", "svd", "none"}
    for name in MERGES:
        overrides = [f"scheduler.merge={name}", "scheduler.top_m=2"]
        assert load_config(None, overrides).scheduler.merge == name
    with pytest.raises(ConfigError, match="merge"):
        load_config(None, ["scheduler.merge=bogus"])
    weights = [{"w": torch.tensor([1.0, 3.0])}, {"w": torch.tensor([3.0, 5.0])}]
    cfg = load_config(None, []).scheduler
    inputs = MergeInputs([4, 1], weights, [2.0, 1.0], cfg, round0=lambda: None, generator=lambda: None)
    merged, record = MERGES["soup"](inputs)
    assert torch.equal(merged["w"], torch.tensor([2.0, 4.0])) and record == {
        "kind": "soup",
        "members": [4, 1],
        "weights": [0.5, 0.5],
    }


def test_atomic_write_replaces_whole_files_and_leaves_the_old_one_on_failure(tmp_path):
    target = tmp_path / "f.json"
    atomic_write(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("died mid-write")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    atomic_write(target, b"new")
    assert target.read_text() == "new"


def test_a_reward_source_replaces_the_execution_reward_without_touching_the_step():
    """The member's reward source is a seam: a learned proxy (here: −‖x‖) plugs in, and the
    rows and the update follow it, while the environment still gives complexity and behaviour."""
    from popgrpo.algorithms.member import Member
    from popgrpo.algorithms.rollouts import Rewards

    calls = []

    def proxy(samples, flat, generator):
        calls.append(flat.shape)
        return Rewards(-flat.norm(dim=1))

    cfg = load_config(None, ["grpo.steps_per_epoch=2"])
    member = Member(0, cfg, LocalArchive(), reward_source=proxy)
    (row,) = member.train_epochs(1)
    ideas = cfg.policy.n_prompts * cfg.grpo.group_size
    assert calls == [(ideas, cfg.env.dim)] * 2
    assert row["reward_max"] <= 0 and row["reward_mean"] == pytest.approx(-row["complexity"], rel=1e-5)
    plain = Member(0, cfg, LocalArchive())
    assert plain.train_epochs(1)[0]["reward_mean"] != row["reward_mean"]


@pytest.mark.parametrize("vectorize", [False, True])
def test_entropy_counted_over_all_dimensions_is_d_times_the_per_dimension_entropy(vectorize):
    from popgrpo.runtime.executor import LocalExecutor

    sets = ["grpo.steps_per_epoch=1", "population.size=2", f"population.vectorize={str(vectorize).lower()}"]
    per_dim = LocalExecutor(load_config(None, sets)).train(1)
    joint = LocalExecutor(load_config(None, [*sets, "maxent.entropy.per_dimension=false"])).train(1)
    dim = load_config(None, []).env.dim
    for a, b in zip(per_dim, joint, strict=True):
        assert b[0]["entropy"] == pytest.approx(dim * a[0]["entropy"], rel=1e-6)
        assert b[0]["reward_mean"] == a[0]["reward_mean"]  # without the bonus, training is the same


def test_distinct_share_counts_ideas_equal_across_the_epochs_steps_once():
    assert distinct_share([["a", "b"], ["a", "c"]]) == 0.75
    assert distinct_share([["x"] * 4]) == 0.25
    assert distinct_share([["a", "b"], ["c", "d"]]) == 1.0
    assert math.isnan(distinct_share([["a"], None]))  # a step without identities: unknown
    # Vector ideas: rows compared bit for bit across the steps.
    a, b, c = [0.5, -1.0], [0.25, 2.0], [0.5, -1.0 + 1e-6]
    assert distinct_share([torch.tensor([a, b]), torch.tensor([a, c])]) == 0.75
    assert distinct_share([torch.tensor([a, a, a, a])]) == 0.25


def test_distinct_share_of_different_rows_with_equal_xor_folds_counts_them_apart():
    """Rows made of the same 8-byte words in another order fold to one word, yet differ."""
    x, y = [0.5, -1.0], [0.25, 2.0]
    swapped = torch.tensor([x + y, y + x])  # [2, 4] float32: two 8-byte words each
    assert distinct_share([swapped]) == 1.0
    assert distinct_share([swapped, swapped[:1]]) == pytest.approx(2 / 3)
    odd = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])  # 12-byte rows: 4-byte words
    assert distinct_share([odd]) == pytest.approx(2 / 3)
    halves = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]], dtype=torch.float16)  # 6-byte rows: bytes
    assert distinct_share([halves]) == 1.0
    many = torch.randn(1000, 16)
    assert distinct_share([many, many[:10]]) == pytest.approx(1000 / 1010)
