"""The progress bar: it moves per epoch, not per round, and its reward numbers are the summary's."""

from __future__ import annotations

import json
import re
import time

import pytest

from popgrpo.algorithms.member import Member
from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.telemetry.summary import RewardWindow
from popgrpo.train import train

# One round of 4 epochs: a bar fed by the rows alone would jump from 0 to 4.
ONE_ROUND = ["run.epochs=4", "scheduler.interval_epochs=4", "grpo.steps_per_epoch=1", "run.loggers=[]"]


def test_the_local_executor_counts_each_member_epoch_as_it_ends(monkeypatch):
    config = load_config(preset_path("pop_grpo"), [*ONE_ROUND, "population.size=2", "scheduler.top_m=2"])
    executor = LocalExecutor(config)
    seen: list[int] = []
    real = Member.train_epochs

    def watched(member, n_epochs):
        seen.append(executor.member_epochs())
        return real(member, n_epochs)

    monkeypatch.setattr(Member, "train_epochs", watched)
    rows = executor.train(3)
    assert seen == [0, 1, 2, 3, 4, 5]  # one epoch at a time, counted as each ends
    assert executor.member_epochs() == 6 and [len(r) for r in rows] == [3, 3]


def test_the_bar_moves_during_a_round_and_ends_on_the_summarys_rewards(tmp_path, monkeypatch, capsys):
    real = Member.train_epochs

    def slow(member, n_epochs):  # 1.3 s an epoch: the bar's follower reads the count every second
        time.sleep(1.3)
        return real(member, n_epochs)

    monkeypatch.setattr(Member, "train_epochs", slow)
    config = load_config(preset_path("grpo"), ONE_ROUND)
    summary = train(config, tmp_path / "run", progress=True)
    bar = capsys.readouterr().err
    shown = [int(n) for n in re.findall(r"\| (\d)/4 \[", bar)]
    assert any(0 < n < 4 for n in shown), bar  # mid-round, before the round's rows came back
    assert shown == sorted(shown)  # never back
    final = dict(re.findall(r"(max_reward|population_max_reward)=([0-9.]+)", bar.replace("\r", "\n").splitlines()[-1]))
    assert float(final["max_reward"]) == pytest.approx(summary["max_reward"], abs=5e-4)
    assert float(final["population_max_reward"]) == pytest.approx(summary["population_max_reward"], abs=5e-4)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["window"] == 4


def test_reward_window_is_the_summarys_over_the_last_epochs():
    window = RewardWindow(2)
    rows = [
        {"epoch": 0, "member": 0, "reward_max": 9.0},
        {"epoch": 1, "member": 0, "reward_max": 1.0},
        {"epoch": 1, "member": 1, "reward_max": 3.0},
        {"epoch": 2, "member": 0, "reward_max": float("nan")},
        {"epoch": 2, "member": 1, "reward_max": 5.0},
    ]
    window.add(rows)
    # Epochs 1 and 2: member means 2 and 5, bests 3 and 5; a NaN row is left out, as pandas leaves it.
    assert window.values() == {"max_reward": 3.5, "population_max_reward": 4.0}


@pytest.mark.ray
def test_ray_member_actors_report_their_epochs(ray_local):
    from popgrpo.runtime.ray_executor import RayExecutor

    config = load_config(preset_path("pop_grpo"), [*ONE_ROUND, "population.size=2", "scheduler.top_m=2"])
    executor = RayExecutor(config, count_epochs=True)
    try:
        executor.train(3)
        deadline = time.monotonic() + 30
        while executor.member_epochs() != 6 and time.monotonic() < deadline:  # the flush is fire and forget
            time.sleep(0.1)
        assert executor.member_epochs() == 6
    finally:
        executor.close()
