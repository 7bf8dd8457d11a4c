"""Truncated importance sampling: the weights are the formula, and equal log-probs change nothing."""

import pytest
import torch

from popgrpo.algorithms.step import grpo_loss
from popgrpo.core.grpo import masked_aggregate
from popgrpo.core.tis import tis_weights


def test_weights_are_the_truncated_ratio_and_carry_no_gradient():
    train = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -4.0]], requires_grad=True)
    rollout = torch.tensor([[-1.0, -1.0, -2.0], [-0.5, -0.1, -6.0]])
    w = tis_weights(train, rollout, cap=2.0)
    expected = [[1.0, torch.e**-1, 2.0], [torch.e**-2.5, 1.0, 2.0]]  # exp(0.5·3)=4.48 and exp(2)=7.39 capped
    assert torch.allclose(w, torch.tensor(expected))
    assert not w.requires_grad
    assert torch.equal(tis_weights(train, rollout, cap=10.0)[1, 2], torch.exp(torch.tensor(2.0)))


def test_bad_shapes_and_a_cap_below_one_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        tis_weights(torch.zeros(2, 3), torch.zeros(2, 4), 2.0)
    with pytest.raises(ValueError, match=">= 1"):
        tis_weights(torch.zeros(2, 3), torch.zeros(2, 3), 0.5)


def _loss(logp, old, ref, adv, mask, **kw):
    return grpo_loss(
        logp,
        old,
        ref,
        adv,
        torch.tensor(0.7),
        clip=0.2,
        kl_coef=0.05,
        alpha=0.01,
        reduce=lambda v: masked_aggregate(v, mask),
        **kw,
    )


def _batch():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 5, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(4, 5, generator=g)
    ref = logp.detach() - 0.2
    adv = torch.randn(4, 1, generator=g)
    mask = (torch.rand(4, 5, generator=g) > 0.2).float()
    return logp, old, ref, adv, mask


def test_equal_rollout_log_probs_give_exactly_the_ordinary_loss_and_gradient():
    logp, old, ref, adv, mask = _batch()
    plain, kl = _loss(logp, old, ref, adv, mask)
    (grad_plain,) = torch.autograd.grad(plain, logp)
    weighted, kl_w = _loss(logp, old, ref, adv, mask, rollout_logp=old.clone(), tis_cap=1.0)
    (grad_weighted,) = torch.autograd.grad(weighted, logp)
    assert torch.equal(weighted, plain) and torch.equal(kl_w, kl)
    assert torch.equal(grad_weighted, grad_plain)


def test_different_rollout_log_probs_weight_the_surrogate_only():
    logp, old, ref, adv, mask = _batch()
    rollout = old - 0.3 * torch.arange(5.0)  # the engine found later tokens less likely
    loss, kl = _loss(logp, old, ref, adv, mask, rollout_logp=rollout, tis_cap=2.0)
    plain, kl_plain = _loss(logp, old, ref, adv, mask)
    w = torch.clamp(torch.exp(old - rollout), max=2.0)
    ratio = torch.exp(logp - old)
    surrogate = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv) * w
    expected = masked_aggregate(surrogate, mask) + 0.05 * kl_plain - 0.01 * 0.7
    assert torch.allclose(loss, expected) and not torch.allclose(loss, plain)
    assert torch.equal(kl, kl_plain)  # the KL term is not weighted
