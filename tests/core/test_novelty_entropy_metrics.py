import math

import numpy as np
import pytest
import torch

from popgrpo.core.entropy import AdaptiveAlpha, alpha_dual_step, gaussian_entropy
from popgrpo.core.metrics import complexity, linear_quantiles, pairwise_diversity, pass_at_k
from popgrpo.core.novelty import NoveltyMemory


def test_novelty_empty_partial_and_knn():
    m = NoveltyMemory(capacity=10, k=2)
    assert m.score(torch.ones(3, 2)).tolist() == [0.0, 0.0, 0.0]
    m.add(torch.tensor([[0.0, 0.0]]))
    # fewer than k stored: mean over those stored
    assert m.score(torch.tensor([[3.0, 4.0]])).tolist() == pytest.approx([5.0])
    m.add(torch.tensor([[1.0, 0.0], [10.0, 0.0]]))
    # nearest two of (0,0),(1,0),(10,0) to (2,0): distances 1, 2 → 1.5
    assert m.score(torch.tensor([[2.0, 0.0]])).tolist() == pytest.approx([1.5])


def test_novelty_fifo_eviction():
    m = NoveltyMemory(capacity=3, k=1)
    m.add(torch.tensor([[0.0], [1.0]]))
    m.add(torch.tensor([[2.0], [3.0]]))  # evicts 0.0
    assert m.ideas.flatten().tolist() == [1.0, 2.0, 3.0]
    assert m.score(torch.tensor([[0.0]])).tolist() == pytest.approx([1.0])
    m.add(torch.tensor([[5.0], [6.0], [7.0], [8.0]]))  # more than capacity: newest 3 survive
    assert m.ideas.flatten().tolist() == [6.0, 7.0, 8.0]
    assert len(m) == 3
    restored = NoveltyMemory.from_state_dict(m.state_dict())
    assert restored.ideas.flatten().tolist() == [6.0, 7.0, 8.0]


def test_gaussian_entropy_per_dimension():
    log_std = torch.zeros(3, 16)
    assert torch.allclose(gaussian_entropy(log_std), torch.full((3,), 0.5 * math.log(2 * math.pi * math.e)))
    # matches torch.distributions summed entropy / d
    ls = torch.tensor([[0.3, -1.2, 2.0]])
    ref = torch.distributions.Normal(torch.zeros(3), ls.exp()[0]).entropy().mean()
    assert gaussian_entropy(ls).item() == pytest.approx(ref.item())


def test_alpha_moves_toward_target_and_stays_nonnegative():
    assert alpha_dual_step(0.1, entropy=0.5, target=1.0, lr=0.1) == pytest.approx(0.15)
    assert alpha_dual_step(0.1, entropy=2.0, target=1.0, lr=0.1) == pytest.approx(0.0)
    assert alpha_dual_step(0.01, entropy=5.0, target=1.0, lr=0.1) == 0.0
    a = AdaptiveAlpha(target=1.0, init=0.0, lr=0.05)
    for _ in range(10):
        a.update(0.2)  # entropy below target: alpha grows every step
    assert a.value == pytest.approx(10 * 0.05 * 0.8)


def test_pairwise_diversity():
    same = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.5, 0.0]])
    assert pairwise_diversity(same) == pytest.approx(0.0, abs=1e-7)
    ortho = torch.eye(4)
    assert pairwise_diversity(ortho) == pytest.approx(1.0)
    opposite = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert pairwise_diversity(opposite) == pytest.approx(2.0)
    # matches the explicit pairwise formula
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 5, generator=g)
    cos = torch.nn.functional.cosine_similarity(x[:, None], x[None], dim=-1)
    iu = torch.triu_indices(9, 9, 1)
    assert pairwise_diversity(x) == pytest.approx(float((1 - cos[iu[0], iu[1]]).mean()), rel=1e-5)
    assert pairwise_diversity(x[:1]) == 0.0


def test_complexity_and_pass_at_k():
    assert complexity(torch.tensor([[3.0, 4.0], [0.0, 1.0]])) == pytest.approx(3.0)
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(4, 2, 3) == 1.0  # fewer failures than k
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_linear_quantiles_equal_numpys_bit_for_bit():
    rng = np.random.default_rng(0)
    epoch_quantiles = (0.10, 0.25, 0.50, 0.75, 0.90)
    for i in range(3000):
        n = int(rng.integers(1, 1500))
        x = rng.standard_normal(n) * 10 ** rng.uniform(-5, 5)
        if i % 3 == 0:
            x = np.round(x, 1)  # many ties
        for q in (epoch_quantiles, (0.0, 1.0, 0.5), tuple(rng.uniform(0, 1, 7))):
            assert linear_quantiles(x, q) == np.quantile(x, q).tolist()
    # NaN, inf and empty input: numpy's own answer, NaN where numpy gives NaN.
    for odd in ([1.0, np.inf, 2.0], [1.0, np.nan, 3.0], [-np.inf, np.inf]):
        np.testing.assert_array_equal(
            linear_quantiles(np.array(odd), epoch_quantiles), np.quantile(odd, epoch_quantiles)
        )
    with pytest.raises(IndexError):  # as np.quantile of nothing
        linear_quantiles(np.array([]), epoch_quantiles)
