"""Clip-higher, Clip-Cov and KL-Cov against their formulas (DAPO §3.1; Cui et al. 2025 §4)."""

import pytest
import torch

from popgrpo.core.covariance import clip_cov_terms, kl_cov_terms, token_covariance
from popgrpo.core.grpo import clipped_terms


def test_clip_higher_raises_only_the_upper_bound():
    logp = torch.log(torch.tensor([1.5, 0.5]))
    old = torch.zeros(2)
    adv = torch.tensor([1.0, -1.0])
    torch.testing.assert_close(clipped_terms(logp, old, adv, 0.2), torch.tensor([-1.2, 0.8]))
    # ρ = 1.5 with A > 0 is now clipped at 1.28; ρ = 0.5 with A < 0 still at 1 − 0.2
    torch.testing.assert_close(clipped_terms(logp, old, adv, 0.2, clip_high=0.28), torch.tensor([-1.28, 0.8]))
    assert torch.equal(clipped_terms(logp, old, adv, 0.2, None), clipped_terms(logp, old, adv, 0.2))


def test_token_covariance_is_the_centred_cross_product_over_valid_tokens():
    logp = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    adv = torch.tensor([[1.0, 0.0, -1.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is padding: left out of the means
    cov = token_covariance(logp, adv, mask)
    assert cov[0, :3].tolist() == [-1.0, 0.0, -1.0] and cov[0, 3] == -torch.inf


def test_token_covariance_broadcasts_a_completion_advantage_over_its_tokens():
    logp = torch.tensor([[0.0, -2.0], [-1.0, -1.0]])
    adv = torch.tensor([[1.0], [-1.0]])  # [N, 1]
    cov = token_covariance(logp, adv, torch.ones(2, 2))
    # mean logp −1, mean advantage 0: (logp + 1)·A
    assert cov.tolist() == [[1.0, -1.0], [-0.0, -0.0]]


def test_kl_cov_penalises_the_top_covariance_tokens_only():
    logp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    old = torch.tensor([-1.5, -2.0, -2.5])
    adv = torch.tensor([1.0, 0.0, -1.0])
    # centred logp (1, 0, −1) × centred adv (1, 0, −1): cov (1, 0, 1); one token (⌊0.34·3⌋ = 1), tie → first
    terms, chosen = kl_cov_terms(logp, old, adv, torch.ones(3), ratio=0.34, coef=2.0)
    assert chosen.tolist() == [True, False, False]
    delta = logp.detach() - old
    expected = -torch.exp(delta) * adv
    expected[0] += 2.0 * delta[0].abs()
    torch.testing.assert_close(terms.detach(), expected)
    terms.sum().backward()
    # the penalised token's gradient: −ρA + β·sign(δ)
    assert logp.grad is not None
    assert logp.grad[0].item() == pytest.approx(-float(torch.exp(delta[0])) + 2.0)


def test_kl_cov_acts_on_at_least_one_token():
    _, chosen = kl_cov_terms(torch.zeros(4), torch.zeros(4), torch.arange(4.0), torch.ones(4), ratio=1e-9, coef=1.0)
    assert int(chosen.sum()) == 1


def test_clip_cov_removes_the_gradient_of_drawn_tokens_in_the_window():
    logp = torch.tensor([-1.0, -2.0, -3.0, -2.0], requires_grad=True)
    adv = torch.tensor([1.0, 0.0, -1.0, 0.0])
    old = logp.detach().clone()
    terms = clipped_terms(logp, old, adv, 0.2)
    # cov (1, 0, 1, 0): the window [0.5, 2] holds tokens 0 and 2; ratio 0.25 of 4 → one of them
    kept, removed = clip_cov_terms(
        terms, logp, adv, torch.ones(4), ratio=0.25, low=0.5, high=2.0, generator=torch.Generator().manual_seed(0)
    )
    assert int(removed.sum()) == 1 and bool(removed[0] | removed[2]) and not bool(removed[1] | removed[3])
    kept.sum().backward()
    assert logp.grad is not None
    assert logp.grad[removed].tolist() == [0.0]
    assert logp.grad[~removed].tolist() == (-adv[~removed]).tolist()  # ρ = 1: d(−ρA)/dlogp = −A


def test_clip_cov_takes_every_window_token_when_there_are_few():
    terms = torch.ones(3)
    kept, removed = clip_cov_terms(
        terms,
        torch.tensor([-1.0, -2.0, -3.0]),
        torch.tensor([1.0, 0.0, -1.0]),
        torch.ones(3),
        ratio=1.0,
        low=0.5,
        high=2.0,
    )
    assert removed.tolist() == [True, False, True] and kept.tolist() == [0.0, 1.0, 0.0]
