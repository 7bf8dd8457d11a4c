"""``scheduler.merge=toy_best``: every member continues from the round's best member."""

from __future__ import annotations


def best_member(inputs):
    """``(MergeInputs) → (weights, lineage description)``: the first selected member's weights (best first)."""
    best = inputs.selected[0]
    weights = {k: v.clone() for k, v in inputs.weights[0].items()}
    return weights, {"kind": "toy_best", "members": [best], "weights": [1.0]}
