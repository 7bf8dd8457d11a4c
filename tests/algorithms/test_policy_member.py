import math

import numpy as np
import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.initial_weights import initial_weights
from popgrpo.algorithms.member import BadRewardError, Member
from popgrpo.config import load_config
from popgrpo.policies import Policy
from popgrpo.policies.gaussian import PromptGaussianPolicy


def test_policy_shapes_logprob_and_entropy(gen):
    pol = PromptGaussianPolicy(idea_dim=16, n_prompts=8, generator=gen)
    assert isinstance(pol, Policy)
    prompts = torch.arange(8)
    ideas = pol.sample(prompts, 16, gen)
    assert ideas.shape == (8, 16, 16)
    mean, log_std = pol(prompts)
    ref = torch.distributions.Normal(mean[:, None], log_std.exp()[:, None]).log_prob(ideas).sum(-1)
    assert torch.allclose(pol.log_prob(prompts, ideas), ref, atol=1e-5)
    # starts near zero mean, unit std
    assert mean.abs().max() < 0.1 and log_std.abs().max() < 0.1
    assert pol.entropy(prompts).mean().item() == pytest.approx(0.5 * math.log(2 * math.pi * math.e), abs=0.05)
    n_params = sum(p.numel() for p in pol.parameters())
    assert n_params == 8 * 64 + (64 * 128 + 128) + (128 * 128 + 128) + 2 * (128 * 16 + 16)


def _member(overrides=(), archive=None):
    cfg = load_config(None, ["run.epochs=2", "grpo.steps_per_epoch=2", *overrides])
    return Member(0, cfg, archive or LocalArchive())


def test_member_is_deterministic_and_rows_complete():
    a, b = _member().train_epochs(2), _member().train_epochs(2)
    assert a == b
    assert [r["epoch"] for r in a] == [0, 1]
    assert a[0]["ideas"] == 2 * 8 * 16
    assert all(np.isfinite(a[0][k]) for k in ("reward_mean", "reward_max", "diversity", "complexity", "entropy", "kl"))


def test_members_share_init_but_not_samples():
    cfg = load_config(None, ["population.size=2"])
    w0, w1 = initial_weights(cfg, 0), initial_weights(cfg, 1)
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    ind = load_config(None, ["population.size=2", "population.shared_init=false"])
    assert not torch.equal(initial_weights(ind, 0)["mean_head.weight"], initial_weights(ind, 1)["mean_head.weight"])
    m0, m1 = Member(0, cfg, LocalArchive()), Member(1, cfg, LocalArchive())
    assert m0.train_epochs(1)[0]["reward_mean"] != m1.train_epochs(1)[0]["reward_mean"]


def test_qd_bonus_changes_update_only_when_enabled():
    plain = _member()
    qd = _member(["qd.enabled=true"])
    plain.train_epochs(1)
    qd.train_epochs(1)
    w_plain, w_qd = plain.get_weights(), qd.get_weights()
    assert not torch.equal(w_plain["mean_head.weight"], w_qd["mean_head.weight"])
    # both archives saw the same ideas and statuses (archive runs for every method)
    assert plain.archive.stats()["coverage"] == qd.archive.stats()["coverage"] > 0


def test_entropy_bonus_raises_alpha_when_entropy_is_low():
    m = _member(["maxent.entropy.enabled=true", "maxent.entropy.target=3.0", "maxent.entropy.alpha_lr=0.1"])
    rows = m.train_epochs(2)
    assert rows[-1]["alpha"] > 0
    off = _member(["maxent.entropy.enabled=true", "maxent.entropy.target=-5.0"])
    assert off.train_epochs(2)[-1]["alpha"] == 0.0


def test_novelty_reward_reported_when_enabled():
    rows = _member(["maxent.novelty.enabled=true"]).train_epochs(2)
    assert rows[1]["novelty"] > 0
    assert math.isnan(_member().train_epochs(1)[0]["novelty"])


class _FlakyEnv:
    """Wraps IdeaEnv and breaks a fraction of rewards."""

    def __init__(self, env, fraction):
        self.env, self.fraction = env, fraction
        self.idea_dim, self.behaviour_dim = env.idea_dim, env.behaviour_dim

    def reward(self, ideas, generator):
        r = self.env.reward(ideas, generator)
        n_bad = int(self.fraction * r.shape[0])
        r[:n_bad] = float("nan")
        if n_bad > 1:
            r[1] = float("inf")
        return r

    def behaviour(self, ideas):
        return self.env.behaviour(ideas)

    def complexity(self, ideas):
        return self.env.complexity(ideas)


def test_bad_rewards_are_counted_and_excluded(caplog):
    from popgrpo.envs.idea import IdeaEnv

    cfg = load_config(None, ["grpo.steps_per_epoch=1"])
    m = Member(0, cfg, LocalArchive(), env=_FlakyEnv(IdeaEnv(), 0.1))
    row = m.train_epochs(1)[0]
    assert row["bad_rewards"] == int(0.1 * 128)
    assert np.isfinite(row["reward_mean"])
    assert all(torch.isfinite(v).all() for v in m.get_weights().values())
    assert "NaN/inf rewards" in caplog.text


def test_too_many_bad_rewards_stop_the_run():
    from popgrpo.envs.idea import IdeaEnv

    cfg = load_config(None, ["grpo.steps_per_epoch=1", "grpo.max_bad_reward_fraction=0.2"])
    m = Member(0, cfg, LocalArchive(), env=_FlakyEnv(IdeaEnv(), 0.5))
    with pytest.raises(BadRewardError, match="max_bad_reward_fraction"):
        m.train_epochs(1)


def test_reseed_loads_soup_plus_member_specific_noise():
    cfg = load_config(None, ["population.size=2"])
    m0, m1 = Member(0, cfg, LocalArchive()), Member(1, cfg, LocalArchive())
    base = {k: torch.zeros_like(v) for k, v in m0.get_weights().items()}
    m0.adopt(base, 0.01, round_index=1)
    m1.adopt(base, 0.01, round_index=1)
    w0, w1 = m0.get_weights()["trunk.0.weight"], m1.get_weights()["trunk.0.weight"]
    assert w0.std().item() == pytest.approx(0.01, rel=0.05)
    assert not torch.equal(w0, w1)
    again = Member(0, cfg, LocalArchive())
    again.adopt(base, 0.01, round_index=1)
    assert torch.equal(again.get_weights()["trunk.0.weight"], w0)


def test_epoch_rows_carry_quantiles_of_every_idea_complexity():
    """The epoch's per-idea complexity quantiles (paper Figure 3) are those of the ideas it drew."""
    import numpy as np

    from popgrpo.algorithms.archive_service import LocalArchive
    from popgrpo.algorithms.member import Member
    from popgrpo.config import load_config, preset_path

    cfg = load_config(preset_path("grpo"), ["grpo.steps_per_epoch=3"])
    member = Member(0, cfg, LocalArchive(cfg.archive.cells_per_dim, 16, 4))
    drawn = []
    complexity = member.env.complexity
    member.env.complexity = lambda flat: drawn.append(complexity(flat)) or drawn[-1]
    (row,) = member.train_epochs(1)
    values = np.concatenate([d.numpy() for d in drawn])
    assert len(values) == 3 * cfg.grpo.group_size * cfg.policy.n_prompts
    for q in (10, 25, 50, 75, 90):
        assert row[f"complexity_p{q}"] == pytest.approx(np.quantile(values, q / 100), rel=1e-6)
    assert row["complexity"] == pytest.approx(values.mean(), rel=1e-5)


class _StepByStepMember(Member):
    """A member that inserts into its archive every step, as QD/MaxEnt members must."""

    @property
    def defers_archive_inserts(self) -> bool:
        return False


def test_deferred_archive_inserts_equal_step_by_step_inserts():
    """Without QD bonus or novelty the epoch's ideas go into the archive at the epoch's end, in one
    insert: the rows (new/improved counts, coverage, QD score) and the elites are those of
    inserting each step's batch as it comes."""
    cfg = load_config(None, ["grpo.steps_per_epoch=4"])
    deferred, stepwise = Member(0, cfg, LocalArchive()), _StepByStepMember(0, cfg, LocalArchive())
    assert deferred.defers_archive_inserts
    rows_a, rows_b = deferred.train_epochs(3), stepwise.train_epochs(3)
    assert rows_a == rows_b
    assert sum(r["archive_new"] for r in rows_a) > 0 and sum(r["archive_improved"] for r in rows_a) > 0
    ea, eb = deferred.archive.grid.elites(), stepwise.archive.grid.elites()
    for key in ea:
        np.testing.assert_array_equal(ea[key], eb[key])
    assert not deferred.inserts.pending  # flushed


@pytest.mark.parametrize("overrides", [["qd.enabled=true"], ["maxent.novelty.enabled=true"]])
def test_members_whose_update_needs_the_archive_insert_every_step(overrides):
    member = _member(overrides)
    assert not member.defers_archive_inserts
    member.step()
    assert not member.inserts.pending and len(member.archive.grid) > 0  # inserted before the update


def test_adam_implementations_make_the_same_update():
    """grpo.adam picks torch's kernel, not the math: fused, foreach and for_loop train alike."""
    weights = {}
    for impl in ("fused", "foreach", "for_loop"):
        member = _member([f"grpo.adam={impl}"])
        group = member.optimizer.param_groups[0]
        assert bool(group["fused"]) == (impl == "fused") and bool(group["foreach"]) == (impl == "foreach")
        member.train_epochs(2)
        weights[impl] = member.get_weights()
    for impl in ("foreach", "for_loop"):
        for name, value in weights["fused"].items():
            torch.testing.assert_close(value, weights[impl][name], atol=1e-5, rtol=1e-4)
