"""A code run's population metrics per epoch, from its members' ``code_problems`` records.

Each member's row of an epoch carries ``code_problems`` (:data:`popgrpo.columns.CODE_COLUMNS`):
its samples and passes per problem and the keys of its distinct correct programs. The
population's figures pool them (:func:`popgrpo.core.passk.population_summary`): its pass@1 and
pass@G over the pooled samples, problems solved by any member, distinct correct programs of
all members together per problem solved, next to the best member's pass@G and problems solved.
TensorBoard's ``population`` run shows them (:func:`popgrpo.telemetry.loggers.population_scalars`),
as does ``popgrpo report`` on a code run's directory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from popgrpo.core.passk import population_summary

__all__ = ["POPULATION_CODE_KEYS", "population_code_scalars"]

# population_summary's keys → the names they are logged under.
POPULATION_CODE_KEYS = {
    "population_pass_at_1": "population_code_pass_at_1",
    "population_pass_at_k": "population_code_pass_at_group",
    "best_member_pass_at_k": "best_member_code_pass_at_group",
    "population_solved": "population_code_solved",
    "best_member_solved": "best_member_code_solved",
    "population_distinct_correct": "population_code_distinct_correct",
}


def population_code_scalars(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The population's code metrics of one epoch's rows (one per member); {} when no row has a record."""
    counts: list[dict[str, tuple[int, int]]] = []
    solutions: list[dict[str, list[str]]] = []
    group = 0
    for row in rows:
        text = row.get("code_problems")
        if not isinstance(text, str) or not text:
            continue
        record = json.loads(text)
        group = max(group, int(record.get("group", 0)))
        problems = record.get("problems", {})
        counts.append({p: (int(v[0]), int(v[1])) for p, v in problems.items()})
        solutions.append({p: list(v[2]) for p, v in problems.items()})
    if not counts or group < 1:
        return {}
    summary = population_summary(counts, solutions, group)
    return {POPULATION_CODE_KEYS[k]: v for k, v in summary.items() if not math.isnan(v)}
