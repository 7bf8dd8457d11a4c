"""What ``popgrpo eval`` computes: score a code run's members on its held-out problems (or the base model alone).

``popgrpo eval RUN_DIR --split heldout --k 1,10`` loads the run's ``config.yaml`` and its newest
intact checkpoint, and for every member samples ``n`` completions (``--samples``; default the
largest ``k``) of every problem of the split, runs each problem's tests in the sandbox
(:mod:`popgrpo.envs.harness`) and reports the unbiased pass@k for each ``k``
(:mod:`popgrpo.core.passk`), the problems solved and the distinct correct programs per problem
solved. The population's row pools every member's samples of a problem; the best member's row
is beside it. The table is printed and written as JSON to ``RUN_DIR/eval_<split>.json``
(``--out`` elsewhere).

Without ``RUN_DIR``, ``--config`` (a preset or YAML file, with ``--set``) names a code run whose
base model is scored as one member, ``base``: how much of the problem set the model solves
before any RL.

Draws come from a stream of their own, ``(run.seed, STREAM_EVAL, 2, member)``: the same command
gives the same table, and no training stream is touched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from popgrpo.config import ConfigError
from popgrpo.markdown import md_table

__all__ = ["evaluate", "markdown", "run_members"]

PURPOSE_CODE_EVAL = 2  # the third use of STREAM_EVAL (the scheduler's are 0 and 1)


def run_members(run_dir: Path | None, config: Any) -> list[tuple[str, dict[str, Any] | None]]:
    """``(name, adapter weights)`` of each member of the newest intact checkpoint; the base model alone without a run."""
    if run_dir is None:
        return [("base", None)]
    from popgrpo.telemetry.checkpoint import Checkpointer, CheckpointError

    checkpointer = Checkpointer(run_dir)
    try:
        info = checkpointer.latest()
        if info is None:
            raise ConfigError(f"{run_dir}: no intact checkpoint to evaluate ({checkpointer.fallback or 'none yet'})")
        states, _ = checkpointer.load(info)
    except CheckpointError as exc:
        raise ConfigError(f"{run_dir}: {exc}") from None
    del config
    return [(f"member_{s['member_id']}", s["policy"]) for s in states]


def evaluate(
    config: Any,
    members: list[tuple[str, dict[str, Any] | None]],
    split: str,
    ks: tuple[int, ...],
    samples: int,
    batch: int = 8,
) -> dict[str, Any]:
    """The eval table: a row per member, then ``population`` and ``best_member`` (see the module docstring)."""
    import torch

    from popgrpo.core.passk import mean_pass_at_k, pool_counts
    from popgrpo.core.seeding import STREAM_EVAL, torch_generator
    from popgrpo.envs.code import CodeEnv
    from popgrpo.policies.causal_lm import CausalLMPolicy

    env = CodeEnv(config.env)
    problems = {
        "heldout": env.heldout_problems,
        "train": env.train_problems,
        "all": env.train_problems + env.heldout_problems,
    }[split]
    if not problems:
        raise ConfigError(f"--split {split}: the run has no {split} problems (env.code.heldout_fraction)")
    policy = CausalLMPolicy(config.policy.causal_lm, "cpu")
    base = policy.state_dict()
    rows: list[dict[str, Any]] = []
    counts: list[dict[str, tuple[int, int]]] = []
    solutions: list[dict[str, set[str]]] = []
    for index, (name, weights) in enumerate(members):
        policy.load_state_dict(weights if weights is not None else base)
        generator = torch_generator(config.run.seed, STREAM_EVAL, PURPOSE_CODE_EVAL, index)
        member_counts: dict[str, tuple[int, int]] = {}
        member_solutions: dict[str, set[str]] = {}
        for start in range(0, len(problems), batch):
            chunk = problems[start : start + batch]
            with torch.no_grad():
                rollout = policy.rollout([p.prompt for p in chunk], samples, generator)
            completions = rollout.completions
            prompts = [p.prompt for p in chunk for _ in range(samples)]
            runs = env.run_tests(prompts, completions)
            for j, problem in enumerate(chunk):
                group = range(j * samples, (j + 1) * samples)
                passed = [i for i in group if runs[i].all_passed]
                member_counts[problem.id] = (samples, len(passed))
                member_solutions[problem.id] = {env.solution_key(prompts[i], completions[i]) for i in passed}
        counts.append(member_counts)
        solutions.append(member_solutions)
        rows.append(_row(name, member_counts, member_solutions, ks, mean_pass_at_k))
    pooled = pool_counts(counts)
    union: dict[str, set[str]] = {}
    for member in solutions:
        for problem, keys in member.items():
            union.setdefault(problem, set()).update(keys)
    population = _row("population", pooled, union, ks, mean_pass_at_k)
    best = max(rows, key=lambda r: (r[f"pass@{ks[-1]}"], r["solved"]))
    table = [*rows]
    if len(rows) > 1:
        table += [population, {**best, "name": f"best_member ({best['name']})"}]
    return {
        "split": split,
        "problems": len(problems),
        "samples": samples,
        "k": list(ks),
        "rows": table,
    }


def _row(
    name: str, counts: dict[str, tuple[int, int]], solutions: dict[str, set[str]], ks: tuple[int, ...], mean
) -> dict[str, Any]:
    solved = [p for p, (_, c) in counts.items() if c > 0]
    return {
        "name": name,
        **{f"pass@{k}": mean(counts, k) for k in ks},
        "solved": len(solved),
        "distinct_correct": (sum(len(solutions.get(p, ())) for p in solved) / len(solved)) if solved else math.nan,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table as Markdown."""
    ks = result["k"]
    head = ["member", *[f"pass@{k}" for k in ks], "solved", "distinct correct / solved"]
    rows = []
    for row in result["rows"]:
        cells = [row["name"], *[f"{row[f'pass@{k}']:.3f}" for k in ks], f"{row['solved']}/{result['problems']}"]
        cells.append("—" if math.isnan(row["distinct_correct"]) else f"{row['distinct_correct']:.2f}")
        rows.append(cells)
    return md_table(head, rows)
