"""An overlapped language-model step (policy.causal_lm.overlap) trains exactly as the sequential one.

Overlapped: each completion's program starts in the sandbox as soon as its row is generated
(TextEnv.prefetch), the reference pass and the embeddings run while the programs do, and the
embeddings are joined after the update. The same seed must give the same rewards, reasons,
losses, features, archive and weights as every phase one after the other.
"""

import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from popgrpo.envs.programs import program_reward
from tests.lm import TARGET_FRACTION, lm_config

pytestmark = pytest.mark.usefixtures("tiny_lm")

PROGRAM_REWARD = "popgrpo.envs.programs:program_reward"


class _Counting:
    """A reward callable's stand-in that counts whole-batch calls and keeps its submit_one."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0
        self.submit_one = fn.submit_one

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _member(tiny_lm, overlap: bool, merged: bool = False, **grpo) -> Member:
    config = lm_config(
        tiny_lm,
        env={
            "kind": "text",
            "text": {
                "prompts": ["say a", "write", "go on"],
                "rewards": [
                    {"fn": PROGRAM_REWARD, "kwargs": {"timeout_s": 2.0, "memory_mb": 256}},
                    {"fn": TARGET_FRACTION, "kwargs": {"target": "a"}, "weight": 0.5},
                ],
                "sandbox_pool_size": 4,
            },
        },
        policy={
            "kind": "causal_lm",
            "causal_lm": {
                "model": str(tiny_lm),
                "max_new_tokens": 8,
                "prompts_per_step": 2,
                "lora": {"r": 4},
                "overlap": overlap,
                "merged_generation": merged,
            },
        },
        grpo={"group_size": 4, "steps_per_epoch": 3, "lr": 0.03, "kl_coef": 0.05, **grpo},
        population={"size": 1},
    )
    member = Member(0, config, LocalArchive())
    env = member.rollouts.env
    name, fn, weight, kwargs = env.rewards[0]
    assert fn is program_reward
    env.rewards[0] = (name, _Counting(fn), weight, kwargs)
    return member


def _run(member: Member):
    steps = [member.step() for _ in range(3)]
    row = member.end_epoch(steps)
    return steps, row, member.get_weights()


@pytest.mark.requires("sandbox")  # the programs run in the execution sandbox
@pytest.mark.parametrize(
    ("grpo", "merged"),
    [({}, False), ({"updates_per_batch": 2}, False), ({}, True)],
    ids=["one-update", "two-updates", "merged-generation"],
)
def test_overlapped_steps_equal_sequential_ones(tiny_lm, grpo, merged):
    torch.set_num_threads(1)
    sequential, overlapped = _member(tiny_lm, False, merged, **grpo), _member(tiny_lm, True, merged, **grpo)
    assert (sequential.policy.merged is not None) == merged
    assert not sequential.features_can_wait() and overlapped.features_can_wait()
    assert overlapped.rollouts.prefetch_rewards and not sequential.rollouts.prefetch_rewards
    (s_steps, s_row, s_weights), (o_steps, o_row, o_weights) = _run(sequential), _run(overlapped)
    assert sequential.rollouts.env.rewards[0][1].calls == 3  # one batch per step
    assert overlapped.rollouts.env.rewards[0][1].calls == 0  # every program was prefetched
    for s, o in zip(s_steps, o_steps, strict=True):
        assert torch.equal(s.scores.rewards, o.scores.rewards)
        assert s.scores.reasons == o.scores.reasons
        assert torch.equal(s.scores.features, o.scores.features) and s.scores.features.shape[0] == 8
        assert torch.equal(s.kl, o.kl) and torch.equal(s.entropy, o.entropy)
        assert s.identities == o.identities
    assert s_row == o_row  # the epoch's metrics and archive counts
    assert s_weights.keys() == o_weights.keys()
    assert all(torch.equal(s_weights[k], o_weights[k]) for k in s_weights)
    assert any(not torch.equal(s_weights[k], sequential.rollouts.round0()[k]) for k in s_weights)  # it trained


def test_rows_are_reported_with_their_final_text(tiny_lm):
    member = _member(tiny_lm, False)
    seen: dict[int, str] = {}
    generator = torch.Generator().manual_seed(5)
    rollout = member.policy.rollout(["say a", "write"], 4, generator, on_row_done=lambda r, t: seen.setdefault(r, t))
    plain = member.policy.rollout(["say a", "write"], 4, torch.Generator().manual_seed(5))
    assert seen == dict(enumerate(rollout.completions))
    assert rollout.completions == plain.completions and torch.equal(rollout.sequences, plain.sequences)
