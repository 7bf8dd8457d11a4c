import numpy as np
import pytest

from popgrpo.core.archive import MapElitesArchive, state_heatmap


def test_statuses_in_order_within_a_batch():
    a = MapElitesArchive(cells_per_dim=10)
    b = np.array([[0.05, 0.05]] * 4 + [[0.95, 0.95]])
    r = np.array([1.0, 0.5, 2.0, 2.0, -1.0])
    ideas = np.arange(10, dtype=float).reshape(5, 2)
    status = a.add(b, r, ideas)
    # first opens, lower not stored, higher improves, tie does not improve, other cell opens
    assert status.tolist() == [2, 0, 1, 0, 2]
    elites = a.elites()
    assert elites["reward"].tolist() == [2.0, -1.0]
    assert elites["idea"][0].tolist() == [4.0, 5.0]  # the idea that improved, not the tie


def test_statuses_against_existing_elites_and_stats():
    a = MapElitesArchive(cells_per_dim=10)
    a.add(np.array([[0.15, 0.15]]), np.array([1.0]), np.zeros((1, 3)))
    status = a.add(np.array([[0.15, 0.15], [0.15, 0.15], [0.55, 0.55]]), np.array([0.9, 1.5, 0.2]), np.ones((3, 3)))
    assert status.tolist() == [0, 1, 2]
    assert a.coverage == pytest.approx(2 / 100)
    assert a.qd_score == pytest.approx(1.5 + 0.2)
    assert a.best_reward == pytest.approx(1.5)
    assert len(a) == 2


def test_out_of_range_goes_to_edge_cells():
    a = MapElitesArchive(cells_per_dim=10)
    cells = a.cell_of(np.array([[-3.0, 0.5], [7.0, 0.5], [0.5, 1.0], [1.0, 1.0]]))
    assert cells.tolist() == [0 * 10 + 5, 9 * 10 + 5, 5 * 10 + 9, 99]


def test_matches_one_by_one_insertion_on_random_batches():
    rng = np.random.default_rng(0)
    batch_a, one_by_one = MapElitesArchive(4), MapElitesArchive(4)
    for _ in range(20):
        n = 30
        b = rng.random((n, 2))
        r = np.round(rng.normal(size=n), 1)  # rounding makes ties common
        x = rng.normal(size=(n, 3))
        got = batch_a.add(b, r, x)
        want = [one_by_one.add(b[i : i + 1], r[i : i + 1], x[i : i + 1])[0] for i in range(n)]
        assert got.tolist() == want
    ea, eb = batch_a.elites(), one_by_one.elites()
    for key in ea:
        np.testing.assert_array_equal(ea[key], eb[key])


def test_rejects_nonfinite_and_mismatched():
    a = MapElitesArchive()
    with pytest.raises(ValueError):
        a.add(np.zeros((1, 2)), np.array([np.nan]), np.zeros((1, 2)))
    with pytest.raises(ValueError):
        a.add(np.zeros((2, 2)), np.zeros(3), np.zeros((2, 2)))


def test_state_roundtrip_and_heatmap():
    a = MapElitesArchive(5)
    a.add(np.array([[0.1, 0.1], [0.9, 0.1]]), np.array([0.3, 0.7]), np.eye(2))
    b = MapElitesArchive.from_state_dict(a.state_dict())
    assert b.qd_score == pytest.approx(a.qd_score)
    h = b.heatmap()
    assert h.shape == (5, 5) and np.isnan(h).sum() == 23 and h[4, 0] == pytest.approx(0.7)
    # Read from the state alone (what the loggers do each round), the same grid.
    np.testing.assert_array_equal(state_heatmap(a.state_dict()), h)
    with pytest.raises(ValueError, match="2-D"):
        state_heatmap({**a.state_dict(), "ranges": [(0.0, 1.0)] * 3})
