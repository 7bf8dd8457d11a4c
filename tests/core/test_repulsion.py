"""The repulsion kernel on hand-made behaviours, and a member's per-group behaviour centroids."""

import math

import pytest
import torch

from popgrpo.core.repulsion import group_best, repulsion_penalty


def test_penalty_is_the_kernel_of_the_nearest_centre():
    behaviours = torch.tensor([[0.0, 0.0], [0.3, 0.4], [1.0, 1.0]])
    centres = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    got = repulsion_penalty(behaviours, centres, strength=2.0, bandwidth=0.5)
    # idea 1 is 0.5 from (0, 0) and ~0.92 from (1, 1): the nearer counts.
    expected = [2.0, 2.0 * math.exp(-0.25 / (2 * 0.25)), 2.0]
    assert got.tolist() == pytest.approx(expected)
    assert got.dtype == behaviours.dtype


def test_penalty_falls_with_distance_and_is_bounded_by_the_strength():
    centre = torch.tensor([[0.5, 0.5]])
    d = torch.linspace(0, 0.5, 11)
    behaviours = torch.stack([0.5 + d, torch.full_like(d, 0.5)], dim=1)
    got = repulsion_penalty(behaviours, centre, strength=0.7, bandwidth=0.1)
    assert torch.all(got[1:] < got[:-1]) and got[0] == pytest.approx(0.7)
    many = repulsion_penalty(behaviours, centre.repeat(5, 1), strength=0.7, bandwidth=0.1)
    assert torch.allclose(many, got)  # five centres on one spot are one taboo region, not five


def test_no_centres_no_penalty_and_bad_bandwidth_is_refused():
    assert repulsion_penalty(torch.rand(4, 2), torch.zeros(0, 2), 1.0, 0.1).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="bandwidth"):
        repulsion_penalty(torch.rand(4, 2), torch.rand(1, 2), 1.0, 0.0)


def test_group_best_is_where_each_group_found_its_best_idea():
    # 2 steps, 3 groups, 2 ideas; behaviours encode (step, group, idea) so the pick is visible.
    s, p, g = 2, 3, 2
    b = torch.tensor(
        [[[[st, gr * 10 + i] for i in range(g)] for gr in range(p)] for st in range(s)], dtype=torch.float32
    )
    r = torch.zeros(s, p, g)
    r[1, 0, 1] = 5.0  # group 0: step 1, idea 1
    r[0, 1, 0] = 2.0  # group 1: step 0, idea 0
    r[0, 1, 1] = float("nan")  # a NaN reward is never the best
    r[:, 2] = float("-inf")
    r[1, 2, 0] = float("nan")
    got = group_best(b, r)
    assert got[0] == [1.0, 1.0] and got[1] == [0.0, 10.0]
    assert all(math.isnan(v) for v in got[2])  # no finite reward in group 2
    b[0, 1, 0] = float("nan")  # the best idea's descriptor broke: the next best counts
    assert group_best(b, r)[1] == [1.0, 10.0]
