"""The naming rule of a run's Ray actors and a member actor's description (no Ray needed)."""

import math

import pytest

from popgrpo.runtime.naming import (
    archive_actor_name,
    describe_group,
    member_actor_name,
    member_label,
    run_namespace,
)


@pytest.mark.parametrize(
    ("ids", "label"),
    [
        ([3], "member-3"),
        ([0, 1, 2, 3, 4, 5, 6, 7], "members-0-7"),
        ([7, 6, 5], "members-5-7"),  # any order
        ([0, 1, 2, 5], "members-0-2,5"),
        ([1, 3, 4, 9], "members-1,3-4,9"),
    ],
)
def test_member_label_says_which_members(ids, label):
    assert member_label(ids) == label


@pytest.mark.parametrize("ids", [[], [1, 1], [-1]])
def test_member_label_refuses_what_is_no_group(ids):
    with pytest.raises(ValueError):
        member_label(ids)


def test_names_carry_the_run_and_what_the_actor_holds():
    assert member_actor_name("pop_grpo-20261125-163000", [3]) == "pop_grpo-20261125-163000/member-3"
    assert member_actor_name("run", range(8)) == "run/members-0-7"
    assert archive_actor_name("run") == "run/archive"


def test_every_actor_of_a_packed_population_has_its_own_name():
    groups = [list(range(i, min(i + 3, 10))) for i in range(0, 10, 3)]
    names = [member_actor_name("r", g) for g in groups]
    assert names == ["r/members-0-2", "r/members-3-5", "r/members-6-8", "r/member-9"]
    assert len({*names, archive_actor_name("r")}) == 5


def test_two_runs_with_one_label_get_two_namespaces():
    a, b = run_namespace("pop_grpo-1", "1a2b3c4d"), run_namespace("pop_grpo-1", "5e6f7a8b")
    assert a != b and a.startswith("popgrpo.pop_grpo-1.")
    with pytest.raises(ValueError):
        run_namespace("", "1a2b")


def test_describe_group_before_any_state_claims_no_round():
    assert describe_group("members-0-1", "cpu", 0, None, 120, 10, {}) == ("members-0-1 [cpu] new")
    assert describe_group("member-3", "cuda:0", 2, None, 120, 10, {}) == ("member-3 [cuda:0] rebuilt (restart 2)")


@pytest.mark.parametrize(
    ("epochs_done", "where"),
    [(0, "round 0, epoch 0/25"), (9, "round 0, epoch 9/25"), (10, "round 1, epoch 10/25"),
     (24, "round 2, epoch 24/25"), (25, "done, epoch 25/25")],
)  # fmt: skip
def test_describe_group_places_members_in_their_round(epochs_done, where):
    text = describe_group("member-0", "cpu", 0, epochs_done, 25, 10, {0: 0.5})
    assert text == f"member-0 [cpu] {where}, last reward mean 0: 0.500"


def test_describe_group_lists_each_members_last_reward_in_member_order():
    text = describe_group("members-0-2", "cpu", 0, 3, 10, 2, {2: -1.0, 0: 0.12345, 1: math.nan})
    assert text.endswith("round 1, epoch 3/10, last reward mean 0: 0.123, 1: nan, 2: -1.000")
