from collections import namedtuple

import numpy as np
import torch

from popgrpo.core.trees import map_leaves


def test_map_leaves_rebuilds_dicts_lists_and_tuples_around_replaced_leaves():
    state = {"w": torch.ones(2), "opt": {"state": {0: {"m": torch.zeros(3)}}, "groups": [{"betas": (0.9, 0.99)}]},
             "pair": (torch.full((1,), 2.0), "label"), "steps": [1, torch.tensor(5)]}  # fmt: skip
    out = map_leaves(state, torch.Tensor, lambda t: t * 10)
    assert isinstance(out, dict)
    assert torch.equal(out["w"], torch.full((2,), 10.0))
    assert torch.equal(out["opt"]["state"][0]["m"], torch.zeros(3))
    assert out["opt"]["groups"] == [{"betas": (0.9, 0.99)}]  # non-leaves kept, tuple stays a tuple
    assert (
        isinstance(out["pair"], tuple)
        and torch.equal(out["pair"][0], torch.tensor([20.0]))
        and out["pair"][1] == "label"
    )
    assert out["steps"][0] == 1 and int(out["steps"][1]) == 50
    assert torch.equal(state["w"], torch.ones(2))  # the input is not changed
    assert out["opt"] is not state["opt"] and out["steps"] is not state["steps"]


def test_map_leaves_leaves_named_tuples_and_other_leaf_types_alone():
    Point = namedtuple("Point", "x y")
    p = Point(torch.ones(1), torch.ones(1))
    arr = np.arange(3)
    out = map_leaves({"p": p, "a": arr, "t": torch.ones(1)}, np.ndarray, lambda a: a + 1)
    assert out["p"] is p  # a named tuple is returned as it is, what it holds untouched
    assert np.array_equal(out["a"], [1, 2, 3])
    assert torch.equal(out["t"], torch.ones(1))  # not the leaf type


def test_map_leaves_takes_a_test_for_leaves_and_tests_a_dict_before_walking_it():
    def marked(x: object) -> bool:
        return isinstance(x, dict) and set(x) == {"m"}

    nest = {"a": {"m": 1}, "b": [{"m": 2}, {"m": 3, "n": 4}], "c": ({"m": 5},)}
    out = map_leaves(nest, marked, lambda d: d["m"] * 10)
    assert out == {"a": 10, "b": [20, {"m": 3, "n": 4}], "c": (50,)}
