import pytest
import torch

from popgrpo.core.merge import perturb, soup, wise_ft
from popgrpo.core.selection import pop_score, select_top_m


def _sd(v):
    return {"w": torch.full((2, 2), float(v)), "b": torch.tensor([float(v)])}


def test_soup_uniform_and_weighted():
    s = soup([_sd(1), _sd(2), _sd(6)])
    assert torch.allclose(s["w"], torch.full((2, 2), 3.0))
    w = soup([_sd(0), _sd(10)], weights=[3, 1])
    assert torch.allclose(w["b"], torch.tensor([2.5]))
    with pytest.raises(ValueError):
        soup([_sd(0), _sd(1)], weights=[-1, 2])
    with pytest.raises(ValueError):
        soup([])


def test_perturb_is_seeded_and_scaled():
    base = _sd(0)
    a = perturb(base, 0.01, torch.Generator().manual_seed(5))
    b = perturb(base, 0.01, torch.Generator().manual_seed(5))
    c = perturb(base, 0.01, torch.Generator().manual_seed(6))
    assert torch.equal(a["w"], b["w"]) and not torch.equal(a["w"], c["w"])
    big = perturb({"w": torch.zeros(20000)}, 0.5, torch.Generator().manual_seed(0))
    assert big["w"].std().item() == pytest.approx(0.5, rel=0.03)
    assert torch.equal(base["w"], torch.zeros(2, 2))  # input untouched
    assert torch.equal(perturb(base, 0.0, torch.Generator())["w"], base["w"])


def test_wise_ft_endpoints_and_midpoint():
    early, late = _sd(0), _sd(4)
    assert torch.equal(wise_ft(early, late, 0.0)["w"], late["w"])
    assert torch.equal(wise_ft(early, late, 1.0)["w"], early["w"])
    assert torch.allclose(wise_ft(early, late, 0.25)["b"], torch.tensor([3.0]))
    with pytest.raises(ValueError):
        wise_ft(early, late, 1.5)


def test_pop_score_and_top_m():
    assert pop_score(0.5, 1.0) == pytest.approx(1.0)
    scores = [pop_score(d, r) for d, r in [(0.9, 0.5), (0.2, 2.0), (0.99, 0.9), (0.9, 0.5)]]
    assert select_top_m(scores, 3) == [2, 0, 3]  # tie between 0 and 3 → lower index first
    assert select_top_m([float("nan"), 0.1], 1) == [1]
    with pytest.raises(ValueError):
        select_top_m([1.0, 2.0], 3)
