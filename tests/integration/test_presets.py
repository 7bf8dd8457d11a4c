"""Each preset trained briefly, checked for the direction the main paper reports.

Deterministic (seeded), so these are exact reproductions, not flaky statistics; the
budgets are the smallest at which each effect is clear on this environment.
"""

import numpy as np
import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from popgrpo.config import load_config, preset_path
from popgrpo.core.merge import soup
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.scheduler import run_rounds

pytestmark = pytest.mark.integration


def _train(preset, epochs, seed=42, extra=()):
    cfg = load_config(preset_path(preset), [f"run.seed={seed}", f"run.epochs={epochs}", *extra])
    return Member(0, cfg, LocalArchive()).train_epochs(epochs)


def _mean(rows, key, sl):
    return float(np.mean([r[key] for r in rows[sl]]))


def test_grpo_collapses_diversity_and_complexity():
    rows = _train("grpo", 40)
    assert _mean(rows, "diversity", slice(-5, None)) < _mean(rows, "diversity", slice(0, 5)) - 0.2
    assert _mean(rows, "complexity", slice(-5, None)) < _mean(rows, "complexity", slice(0, 5)) - 1.0
    assert _mean(rows, "reward_mean", slice(-5, None)) > _mean(rows, "reward_mean", slice(0, 5))


def test_maxent_keeps_complexity_and_diversity_above_grpo():
    grpo, maxent = _train("grpo", 30), _train("maxent_grpo", 30)
    last = slice(-5, None)
    assert _mean(maxent, "complexity", last) > 2 * _mean(grpo, "complexity", last)
    assert _mean(maxent, "diversity", last) > _mean(grpo, "diversity", last) + 0.2
    assert _mean(maxent, "entropy", last) > _mean(grpo, "entropy", last)


def test_qd_grpo_fills_at_least_as_many_cells_as_grpo():
    gains = []
    for seed in (142, 242, 342):
        cov_grpo = _train("grpo", 10, seed)[-1]["archive_coverage"]
        cov_qd = _train("qd_grpo", 10, seed)[-1]["archive_coverage"]
        assert cov_qd >= cov_grpo, seed
        gains.append(cov_qd - cov_grpo)
    assert sum(gains) > 0


def test_pop_grpo_rounds_soup_the_top_m_and_reseed_everyone():
    cfg = load_config(
        preset_path("pop_grpo"), ["run.epochs=4", "scheduler.interval_epochs=2", "grpo.steps_per_epoch=2"]
    )
    executor = LocalExecutor(cfg)
    fetched = []
    real_get = executor.get_weights
    executor.get_weights = lambda ids: fetched.append(real_get(ids)) or fetched[-1]
    seen = []

    def on_round(round_index, epoch_end, rows, record):
        seen.append((round_index, rows, record, [m.get_weights() for m in executor.members]))

    run_rounds(cfg, executor, on_round)
    assert [s[0] for s in seen] == [0, 1]
    _, rows, record, after = seen[0]
    assert len(rows) == 5 and all(len(r) == 2 for r in rows)
    scores = record["scores"]
    top = sorted(scores, key=lambda k: -scores[k])[:3]
    assert [str(k) for k in record["selected"]] == top
    expected = soup(fetched[0])
    for w in after:  # every member = soup + N(0, 0.01²) noise of its own
        delta = torch.cat([(w[k] - expected[k]).flatten() for k in w])
        assert delta.std().item() == pytest.approx(0.01, rel=0.05)
    assert not torch.equal(after[0]["trunk.0.weight"], after[1]["trunk.0.weight"])
    assert seen[1][2] is None  # final round: nothing merged


def test_shared_archive_sees_every_member():
    cfg = load_config(preset_path("pop_grpo"), ["run.epochs=2", "archive.shared=true", "grpo.steps_per_epoch=1"])
    executor = LocalExecutor(cfg)
    assert len(executor.archives()) == 1
    rows = executor.train(1)
    assert rows[4][0]["archive_coverage"] >= rows[0][0]["archive_coverage"]
    private = LocalExecutor(load_config(preset_path("pop_grpo"), ["grpo.steps_per_epoch=1"]))
    assert len(private.archives()) == 5
