"""Config of the weight-space toolbox: defaults are the main paper's, bad combinations are named."""

import pytest

from popgrpo.config import Config, ConfigError, load_config


def test_defaults_are_the_main_papers_round():
    sched, ev = Config().scheduler, Config().eval
    assert (sched.merge, sched.mutate, sched.objectives, sched.perturb_sigma) == (
        "soup",
        "gaussian",
        ["pop_score"],
        0.01,
    )
    assert (sched.wise_ft_delta, sched.task_arithmetic_mu, sched.task_arithmetic_sigma, sched.svd_w_max) == (
        0.5,
        1.0,
        0.03,
        0.3,
    )
    assert (ev.k, ev.samples, ev.success_threshold, ev.merged) == (8, 32, 1.0, True)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["scheduler.merge=weighted_soup", "scheduler.weighted_soup_temperature=0.1"],
            {"scheduler.merge": "weighted_soup", "scheduler.weighted_soup_temperature": 0.1},
        ),
        (
            ["scheduler.merge=greedy_soup", "scheduler.greedy_soup_metric=best_at_k"],
            {"scheduler.merge": "greedy_soup", "scheduler.greedy_soup_metric": "best_at_k"},
        ),
        (["scheduler.merge=wise_ft", "scheduler.wise_ft_delta=0.3"], {"scheduler.wise_ft_delta": 0.3}),
        (["scheduler.merge=task_arithmetic"], {"scheduler.merge": "task_arithmetic", "scheduler.top_m": 3}),
        (["scheduler.mutate=svd", "scheduler.svd_mode=add"], {"scheduler.mutate": "svd", "scheduler.svd_mode": "add"}),
        (
            ["scheduler.objectives=[reward_max, diversity, archive_coverage]"],
            {"scheduler.objectives": ["reward_max", "diversity", "archive_coverage"]},
        ),
        (["scheduler.objectives=[novelty]", "maxent.novelty.enabled=true"], {"scheduler.objectives": ["novelty"]}),
        (["eval.k=16", "eval.samples=16", "eval.merged=false"], {"eval.k": 16, "eval.merged": False}),
    ],
)
def test_every_strategy_is_selectable_by_set(overrides, expected):
    cfg = load_config(None, ["scheduler.enabled=true", "population.size=5", *overrides])
    for key, value in expected.items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["scheduler.merge=task_arithmetic", "scheduler.top_m=1"], "top_m >= 2"),
        (["scheduler.merge=mean"], "scheduler.merge"),
        (["scheduler.mutate=cauchy"], "scheduler.mutate"),
        (["scheduler.objectives=[reward_max, bogus]"], "unknown selection statistic 'bogus'; choices: "),
        (["scheduler.objectives=[]"], "at least one"),
        (["scheduler.objectives=[diversity, diversity]"], "repeat"),
        (["scheduler.objectives=[novelty]"], "maxent.novelty.enabled"),
        (["scheduler.greedy_soup_metric=accuracy"], "greedy_soup_metric"),
        (["scheduler.wise_ft_delta=1.5"], "scheduler.wise_ft_delta"),
        (["scheduler.svd_w_max=-0.1"], "scheduler.svd_w_max"),
        (["scheduler.weighted_soup_temperature=0"], "scheduler.weighted_soup_temperature"),
        (["scheduler.task_arithmetic_mu=0"], "scheduler.task_arithmetic_mu"),
        (["eval.k=17"], "eval.k (17) must be <= grpo.group_size (16)"),
        (["eval.k=8", "eval.samples=4"], "k (8) must be <= samples (4)"),
    ],
)
def test_bad_combinations_are_explained(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)
