import math

import pytest
import torch

from popgrpo.core.grpo import binned_advantages, clipped_surrogate, group_advantages, kl_penalty


def test_group_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])
    adv = group_advantages(rewards, eps=0.0)
    # group 0: mean 2, Bessel std 1 → (-1, 0, 1); group 1: mean 2, std sqrt(12) ≈ 3.4641
    assert torch.allclose(adv[0], torch.tensor([-1.0, 0.0, 1.0]))
    s = math.sqrt(((0 - 2) ** 2 * 2 + (6 - 2) ** 2) / 2)
    assert torch.allclose(adv[1], torch.tensor([-2 / s, -2 / s, 4 / s]))


def test_group_advantages_zero_mean_and_scale_invariance(gen):
    rewards = torch.randn(8, 16, generator=gen)
    adv = group_advantages(rewards)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(8), atol=1e-6)
    assert torch.allclose(adv.std(dim=1), torch.ones(8), atol=1e-4)
    scaled = group_advantages(rewards * 7.5 + 3.0)
    assert torch.allclose(adv, scaled, atol=1e-4)


def test_group_with_no_spread_gets_zero():
    adv = group_advantages(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.0, 1.0]]))
    assert torch.equal(adv[0], torch.zeros(4))
    assert adv[1].abs().sum() > 0


@pytest.mark.parametrize("value", [0.7, 0.1, 0.3, 0.9, 1.7])
@pytest.mark.parametrize("group_size", [3, 7, 8, 16])
def test_equal_rewards_that_float32_cannot_represent_get_exactly_zero(value, group_size):
    """In float32 the mean of G copies of 0.7 is not 0.7 (for G = 7, 8, 16), and dividing that
    rounding error by a std of ~6e-8 gave advantages of 0.056; equal groups must give 0."""
    rewards = torch.full((3, group_size), value)
    rewards[1] = torch.linspace(0.0, 1.0, group_size)  # a group with spread, between two equal ones
    adv = group_advantages(rewards)
    assert torch.equal(adv[0], torch.zeros(group_size)) and torch.equal(adv[2], torch.zeros(group_size))
    # the group with spread keeps the formula's numbers bit for bit
    row = rewards[1:2]
    assert torch.equal(adv[1:2], (row - row.mean(dim=1, keepdim=True)) / (row.std(dim=1, keepdim=True) + 1e-6))
    # so do equal bins of the length-conditional variant
    binned = binned_advantages(rewards, torch.arange(3 * group_size, dtype=torch.float32).view(3, -1), bins=2)
    assert torch.equal(binned[0], torch.zeros(group_size))


def test_group_advantages_rejects_bad_shape():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5))


def test_binned_normalises_within_complexity_bins():
    # 6 ideas, 3 bins of 2 by complexity rank. Complexity order: idx 5,4,3,2,1,0 ascending.
    returns = torch.tensor([[10.0, 20.0, 1.0, 3.0, 100.0, 200.0]])
    complexity = torch.tensor([[6.0, 5.0, 4.0, 3.0, 2.0, 1.0]])
    adv = binned_advantages(returns, complexity, bins=3, eps=0.0)
    # bins: {5,4}, {3,2}, {1,0}; each pair normalises to ±1/sqrt(2)·... two values → (-0.7071, 0.7071)
    h = 1 / math.sqrt(2)
    expected = torch.tensor([[-h, h, -h, h, -h, h]])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_binned_single_idea_bin_gets_zero_and_bins1_is_plain(gen):
    returns = torch.randn(2, 7, generator=gen)
    complexity = torch.rand(2, 7, generator=gen)
    # 7 ideas into 4 bins: sizes 2,2,2,1 → the most complex idea of each group is alone.
    adv = binned_advantages(returns, complexity, bins=4)
    most_complex = complexity.argmax(dim=1)
    assert torch.equal(adv[torch.arange(2), most_complex], torch.zeros(2))
    assert torch.allclose(binned_advantages(returns, complexity, bins=1), group_advantages(returns))


def test_binned_keeps_complex_ideas_from_competing_with_simple():
    # Simple ideas pay 1, complex ideas pay 0.5: plain GRPO punishes every complex idea,
    # binned normalisation ranks complex ideas only against each other.
    returns = torch.tensor([[1.0, 1.1, 0.5, 0.6]])
    complexity = torch.tensor([[1.0, 1.0, 9.0, 9.0]])
    plain = group_advantages(returns)
    binned = binned_advantages(returns, complexity, bins=2)
    assert (plain[0, 2:] < 0).all()
    assert binned[0, 3] > 0


def test_clipped_surrogate_bounds():
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    old = torch.zeros(4)
    # ratios 2, 2, 0.5, 0.5
    logp = torch.log(torch.tensor([2.0, 2.0, 0.5, 0.5]))
    loss = clipped_surrogate(logp, old, adv, clip=0.2)
    # min(rA, clip(r)A): 1.2, -2.0, 0.5, -0.8  → mean 1.2-2+0.5-0.8 = -1.1 /4
    assert math.isclose(float(loss), -(1.2 - 2.0 + 0.5 - 0.8) / 4, rel_tol=1e-6)


def test_clipped_surrogate_no_gradient_beyond_clip():
    logp = torch.log(torch.tensor([1.5])).requires_grad_(True)
    loss = clipped_surrogate(logp, torch.zeros(1), torch.tensor([1.0]), clip=0.2)
    loss.backward()
    assert logp.grad.abs().item() == 0.0
    logp2 = torch.zeros(1, requires_grad=True)
    clipped_surrogate(logp2, torch.zeros(1), torch.tensor([2.0])).backward()
    assert math.isclose(logp2.grad.item(), -2.0)


def test_kl_k3_is_nonnegative_zero_at_equality_and_unbiased():
    logp = torch.tensor([-1.0, -2.0, 0.3])
    assert torch.allclose(kl_penalty(logp, logp), torch.zeros(3))
    assert (kl_penalty(logp, logp + torch.tensor([0.5, -0.7, 2.0])) > 0).all()
    # Unbiased: E_{x~p}[k3] = KL(p || q) for p = N(0, 1), q = N(0.5, 1): KL = 0.125.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400_000, generator=g)
    p, q = torch.distributions.Normal(0.0, 1.0), torch.distributions.Normal(0.5, 1.0)
    estimate = kl_penalty(p.log_prob(x), q.log_prob(x)).mean()
    assert abs(float(estimate) - 0.125) < 0.005


# ---- token-level loss (language-model members) ------------------------------------------------
def test_masked_aggregate_three_normalisations_by_hand():
    from popgrpo.core.grpo import masked_aggregate

    values = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # token: every token equal → (1+2+3+4)/4; sequence: mean of (6/3, 4/1); constant: 10/(2·4)
    assert masked_aggregate(values, mask, "token").item() == pytest.approx(2.5)
    assert masked_aggregate(values, mask, "sequence").item() == pytest.approx(3.0)
    assert masked_aggregate(values, mask, "constant").item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="normalisation"):
        masked_aggregate(values, mask, "mean")
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        masked_aggregate(values[0], mask[0])


def test_token_surrogate_equals_sequence_surrogate_for_one_token_completions(gen):
    """With one token per completion, the token loss is the per-idea clipped surrogate."""
    from popgrpo.core.grpo import token_clipped_surrogate

    logp, old = torch.randn(12, 1, generator=gen), torch.randn(12, 1, generator=gen)
    adv = torch.randn(12, generator=gen)
    token = token_clipped_surrogate(logp, old, adv, torch.ones(12, 1), clip=0.2)
    assert token.item() == pytest.approx(clipped_surrogate(logp[:, 0], old[:, 0], adv, 0.2).item(), rel=1e-6)


def test_token_surrogate_ignores_padding_and_clips_per_token():
    from popgrpo.core.grpo import token_clipped_surrogate

    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.5, 0.0, 5.0]], requires_grad=True)  # ratios e^0.5 ≈ 1.65 (clipped), 1, padding
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = token_clipped_surrogate(logp, old, torch.tensor([1.0]), mask, clip=0.2)
    assert loss.item() == pytest.approx(-(1.2 + 1.0) / 2)
    loss.backward()
    # The clipped token and the padding token get no gradient; the unclipped one -A/2.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5, 0.0]]))
