"""The metrics schema: the columns of a member's per-epoch row, as written to ``metrics.parquet``.

A leaf module (no torch, no pyarrow until a schema is asked for), imported by whoever produces rows (:mod:`popgrpo.algorithms.member`) and whoever
stores or reads them (:mod:`popgrpo.telemetry`, :mod:`popgrpo.research.study`, the config's selection
objectives).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "CODE_COLUMNS",
    "COMPLEXITY_QUANTILES",
    "CONTROL_COLUMNS",
    "DISCOVERY_COLUMNS",
    "INT_COLUMNS",
    "METRIC_COLUMNS",
    "POP_SCORE",
    "REASONS_COLUMN",
    "STRING_COLUMNS",
    "json_float",
    "metrics_schema",
]

# The main paper's selection score S_k = d_k·(1 + max R_k): the default objective of the
# scheduler (scheduler.objectives) and a held-out metric; every other objective is a column.
POP_SCORE = "pop_score"

# Of every idea of an epoch (paper Figure 3): complexity_p10 … complexity_p90.
COMPLEXITY_QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90)

# The control reward (docs/WARM.md): the execution reward of the epoch's ideas, whatever the
# member trained on (equal to reward_mean / reward_max with reward.source=execution), and its
# noise-free expectation E[R(x)] = Q(x)·p_exec(x) where the environment knows it (NaN otherwise).
# control_share: the share of the epoch's ideas the control was measured on (executed, with a
# finite reward): below 1 with reward.proxy.control_fraction < 1, when control_reward_* are
# estimates from that seeded subset.
CONTROL_COLUMNS = ("control_reward_mean", "control_reward_max", "control_expected_reward", "control_share")

# Discovery (popgrpo.core.discovery), of the epoch's executed ideas: the best noise-free expected
# reward max Q·p_exec (where the environment knows it), the best noise-free quality max Q, the
# peaks reached as JSON {"peak": position of the epoch's first idea with
# Q >= eval.discovery_threshold × the peak's height} (positions 0-based in sampling order), and
# as JSON {"peak": the highest Q / height among the epoch's ideas in that peak's basin} for every
# basin visited (so a study can apply another threshold afterwards). All but the first only where
# the environment names its peaks (popgrpo.envs.Landscape): NaN / null elsewhere.
DISCOVERY_COLUMNS = (
    "discovery_best_expected",
    "discovery_best_quality",
    "discovery_peaks",
    "discovery_peak_fraction",
)

# Code problems (env.kind=code; popgrpo.algorithms.code_metrics), of the epoch's completions: a
# completion passes when it passes every test of its problem. code_pass_at_1 and
# code_pass_at_group: the unbiased pass@k (Chen et al. 2021) for k = 1 and k = grpo.group_size,
# from each problem's samples pooled over the epoch, averaged over the problems drawn;
# code_solved: how many problems at least one completion passed; code_distinct_correct: distinct
# passing programs (renaming aside: popgrpo.envs.problems.solution_key) per problem solved;
# code_problems: JSON {"group": G, "problems": {id: [n, c, [solution keys]]}}, from which the
# population's pass@k and problems solved by any member are computed (popgrpo.core.passk).
# NaN / null for other environments.
CODE_COLUMNS = ("code_pass_at_1", "code_pass_at_group", "code_solved", "code_distinct_correct", "code_problems")

# ``distinct``: the share of an epoch's ideas that are distinct (for text: distinct completions,
# whatever prompt they answered). ``success``: the share of the epoch's ideas whose execution
# succeeded (the sandbox said ``ok``; B = 1 in IdeaEnv), NaN where the environment does not say.
METRIC_COLUMNS = (
    "epoch",
    "member",
    "reward_mean",
    "reward_max",
    "diversity",
    "complexity",
    "entropy",
    "alpha",
    "kl",
    "novelty",
    "archive_new",
    "archive_improved",
    "archive_coverage",
    "archive_qd_score",
    "bad_rewards",
    "ideas",
    "pass_at_k",
    "best_at_k",
    "distinct",
    "success",
    *(f"complexity_p{round(q * 100)}" for q in COMPLEXITY_QUANTILES),
    *CONTROL_COLUMNS,
    *DISCOVERY_COLUMNS,
    *CODE_COLUMNS,
)
INT_COLUMNS = frozenset({"epoch", "member", "archive_new", "archive_improved", "bad_rewards", "ideas"})
STRING_COLUMNS = frozenset({"discovery_peaks", "discovery_peak_fraction", "code_problems"})

# Why rewards were what they were, as JSON {"reason": count}: rows of members whose reward source
# gives reasons (the text environment's reward callables); null otherwise.
REASONS_COLUMN = "reward_reasons"


def metrics_schema() -> pa.Schema:
    """The Arrow schema of ``metrics.parquet``: every metric column, then the reasons column."""
    import pyarrow as pa

    columns = [
        (c, pa.int64() if c in INT_COLUMNS else pa.string() if c in STRING_COLUMNS else pa.float64())
        for c in METRIC_COLUMNS
    ]
    return pa.schema([*columns, (REASONS_COLUMN, pa.string())])


def json_float(x: float) -> float | None:
    """``x`` for a JSON record (the lineage): NaN, which JSON cannot hold, becomes null."""
    return None if math.isnan(x) else float(x)
