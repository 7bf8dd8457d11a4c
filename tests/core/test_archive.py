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


# ---- the grid against pyribs' own GridArchive (the conventions it follows) ------------------
ribs_archives = pytest.importorskip("ribs.archives", reason="pyribs (the dev extra) is the grid's reference")


def _pyribs_grid(cells: int, ranges, dim: int):
    return ribs_archives.GridArchive(solution_dim=dim, dims=[cells] * len(ranges), ranges=ranges, dtype=np.float64)


@pytest.mark.parametrize("seed", range(6))
def test_grid_cells_equal_pyribs_on_boundaries_and_outside(seed):
    from popgrpo.core.archive import Grid

    rng = np.random.default_rng(seed)
    cells = int(rng.integers(1, 13))
    ranges = [(-1.0, 2.5), (0.0, 1.0), (3.0, 3.7)][: int(rng.integers(1, 4))]
    ours, theirs = Grid([cells] * len(ranges), ranges, 2), _pyribs_grid(cells, ranges, 2)
    lows = np.array([lo for lo, _ in ranges])
    width = np.array([hi - lo for lo, hi in ranges])
    # every cell boundary exactly, values a rounding error either side, and far outside
    k = rng.integers(0, cells + 1, size=(400, len(ranges)))
    on_edges = lows + width * k / cells
    nudged = on_edges + rng.choice([-1e-12, 0.0, 1e-12, -1e-7, 1e-7], size=on_edges.shape)
    wide = lows + width * rng.uniform(-0.5, 1.5, size=(400, len(ranges)))
    for behaviours in (on_edges, nudged, wide):
        np.testing.assert_array_equal(ours.index_of(behaviours), theirs.index_of(behaviours))


@pytest.mark.parametrize("seed", range(6))
def test_grid_elites_equal_pyribs_after_batches(seed):
    """Batches with several ideas per cell, equal rewards and improvements: the same elites,
    coverage and best reward as pyribs' grid given the same batches."""
    from popgrpo.core.archive import Grid

    rng = np.random.default_rng(100 + seed)
    ranges = [(0.0, 1.0), (0.0, 1.0)]
    ours, theirs = Grid([4, 4], ranges, 3), _pyribs_grid(4, ranges, 3)
    for _ in range(8):
        n = int(rng.integers(1, 40))
        behaviours = rng.uniform(-0.2, 1.2, size=(n, 2))
        rewards = np.round(rng.normal(size=n), 1)  # rounded: ties within and across batches
        ideas = rng.normal(size=(n, 3))
        ours.add(ideas, rewards, behaviours)
        theirs.add(ideas, rewards, behaviours)
        data = theirs.data(["index", "measures", "objective", "solution"])
        order = np.argsort(data["index"])
        cells = ours.cells()
        np.testing.assert_array_equal(cells, data["index"][order])
        np.testing.assert_array_equal(ours.objective[cells], data["objective"][order])
        np.testing.assert_array_equal(ours.measures[cells], data["measures"][order])
        np.testing.assert_array_equal(ours.solution[cells], data["solution"][order])
        assert ours.coverage == theirs.stats.coverage
        assert ours.objective[cells].max() == theirs.stats.obj_max


def test_archive_does_not_import_pyribs():
    """A member actor builds an archive at its start: the grid must not pull in pyribs (and its
    sklearn, scipy and pandas) there."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from popgrpo.core.archive import MapElitesArchive\n"
        "a = MapElitesArchive(10)\n"
        "a.add(np.random.rand(8, 2), np.random.rand(8), np.random.rand(8, 4))\n"
        "a.state_dict(); a.qd_score; a.best_reward\n"
        "print(sorted(m for m in ('ribs', 'sklearn', 'pandas', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
