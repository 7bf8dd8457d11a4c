"""Packed members (population.vectorize): one batched policy pass per step gives the same training
as the members one by one (private archives), and hands back ordinary members."""

import pandas as pd
import pytest
import torch

from popgrpo.algorithms.packed import PackedMembers
from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
from tests.driving import drive


def _equal_members(a, b, atol=1e-6):
    for ma, mb in zip(a.members, b.members, strict=True):
        wa, wb = ma.get_weights(), mb.get_weights()
        for name in wa:
            torch.testing.assert_close(wa[name], wb[name], atol=atol, rtol=0)
        sa, sb = ma.optimizer.state_dict()["state"], mb.optimizer.state_dict()["state"]
        assert sa.keys() == sb.keys()
        for i in sa:
            assert float(sa[i]["step"]) == float(sb[i]["step"])
            torch.testing.assert_close(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"], atol=atol, rtol=1e-5)
        assert ma.alpha.value == pytest.approx(mb.alpha.value, abs=1e-6)
        assert ma.epochs_done == mb.epochs_done
        assert torch.equal(ma.generator.get_state(), mb.generator.get_state())  # the same draws were made


@pytest.mark.parametrize("preset", ["grpo", "qd_grpo", "maxent_grpo"])
def test_packed_training_equals_members_one_by_one(preset):
    cfg = load_config(preset_path(preset), ["population.size=4", "grpo.steps_per_epoch=4"])
    one_by_one, packed = LocalExecutor(cfg), LocalExecutor(cfg)
    rows_a = [m.train_epochs(3) for m in one_by_one.members]
    rows_b = PackedMembers(packed.members).train_epochs(3)
    pd.testing.assert_frame_equal(
        pd.DataFrame([r for per in rows_a for r in per]), pd.DataFrame([r for per in rows_b for r in per]), atol=1e-6
    )
    _equal_members(one_by_one, packed)
    # a second call starts from the Adam state the first one wrote back
    [m.train_epochs(1) for m in one_by_one.members]
    PackedMembers(packed.members).train_epochs(1)
    _equal_members(one_by_one, packed)


def test_vectorized_population_run_equals_the_plain_one():
    sets = ["population.size=4", "run.epochs=6", "scheduler.interval_epochs=2", "grpo.steps_per_epoch=3"]
    plain = load_config(preset_path("pop_grpo"), sets)
    vectorized = load_config(preset_path("pop_grpo"), [*sets, "population.vectorize=true"])
    rows_a, lineage_a = drive(plain, LocalExecutor(plain))
    rows_b, lineage_b = drive(vectorized, LocalExecutor(vectorized))
    pd.testing.assert_frame_equal(pd.DataFrame(rows_a), pd.DataFrame(rows_b), atol=1e-6)
    assert [r and r["selected"] for r in lineage_a] == [r and r["selected"] for r in lineage_b]


def test_a_policy_that_cannot_split_its_sampling_is_refused(monkeypatch):
    cfg = load_config(preset_path("grpo"), ["population.size=2"])
    members = LocalExecutor(cfg).members
    monkeypatch.delattr(type(members[0].policy), "draw_noise")
    with pytest.raises(ValueError, match="cannot be vectorised"):
        PackedMembers(members)
