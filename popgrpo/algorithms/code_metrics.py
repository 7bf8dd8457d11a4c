"""An epoch's code columns (:data:`popgrpo.columns.CODE_COLUMNS`) from its steps.

For an environment whose prompts are problems (:class:`popgrpo.envs.code.ProblemEnvironment`):
each step's groups say which problem each group answered, ``success`` says which completions
passed every test, and the environment keys each passing program so that two that differ only
in names count once. The estimators are :mod:`popgrpo.core.passk`'s; nothing here feeds back
into training.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from popgrpo.algorithms.step import StepStats
from popgrpo.columns import CODE_COLUMNS
from popgrpo.core.passk import mean_pass_at_k
from popgrpo.core.tensor_lists import float_list
from popgrpo.envs.code import ProblemEnvironment

__all__ = ["epoch_code"]


def _empty() -> dict[str, float | str | None]:
    return {c: None if c == "code_problems" else math.nan for c in CODE_COLUMNS}


def epoch_code(steps: Sequence[StepStats], env: object) -> dict[str, float | str | None]:
    """The code columns of an epoch of ``steps`` (NaN / None unless ``env`` is a problem environment).

    A completion whose execution is unknown (a proxy's ``control_fraction`` left it unexecuted:
    NaN success) is left out of its problem's samples.
    """
    if not isinstance(env, ProblemEnvironment) or not steps:
        return _empty()
    counts: dict[str, list[int]] = {}
    solutions: dict[str, set[str]] = {}
    group_size = 0
    for step in steps:
        success, groups, completions = step.scores.success, step.groups, step.identities
        if success is None or groups is None or not isinstance(completions, list) or not groups:
            return _empty()
        group_size = len(completions) // len(groups)
        passed = float_list(success.double())
        for p, prompt in enumerate(groups):
            problem = env.problem_id(str(prompt))
            n_c = counts.setdefault(problem, [0, 0])
            for i in range(p * group_size, (p + 1) * group_size):
                if math.isnan(passed[i]):
                    continue
                n_c[0] += 1
                if passed[i]:
                    n_c[1] += 1
                    solutions.setdefault(problem, set()).add(env.solution_key(str(prompt), str(completions[i])))
    pairs = {problem: (n, c) for problem, (n, c) in counts.items()}
    solved = [problem for problem, (_, c) in pairs.items() if c > 0]
    record = {
        "group": group_size,
        "problems": {p: [n, c, sorted(solutions.get(p, ()))] for p, (n, c) in sorted(pairs.items())},
    }
    return {
        "code_pass_at_1": mean_pass_at_k(pairs, 1),
        "code_pass_at_group": mean_pass_at_k(pairs, group_size) if group_size else math.nan,
        "code_solved": float(len(solved)),
        "code_distinct_correct": (sum(len(solutions[p]) for p in solved) / len(solved)) if solved else math.nan,
        "code_problems": json.dumps(record, separators=(",", ":")),
    }
