"""``popgrpo eval``: score a code run's members on its held-out problems (or the base model alone).

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

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from popgrpo.config import ConfigError
from popgrpo.envs.kinds import env_kind
from popgrpo.markdown import md_table

__all__ = ["add_parsers", "evaluate"]

PURPOSE_CODE_EVAL = 2  # the third use of STREAM_EVAL (the scheduler's are 0 and 1)


def _k_list(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"every k must be >= 1, got {text!r}")
    return ks


def _members(run_dir: Path | None, config: Any) -> list[tuple[str, dict[str, Any] | None]]:
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


def _cmd_eval(args: argparse.Namespace) -> int:
    from popgrpo.config import load_config, resolve_config_path

    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is not None:
        if args.config or args.set:
            raise ConfigError("popgrpo eval RUN_DIR uses the run's own config.yaml; drop --config/--set")
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
        config = load_config(run_dir / "config.yaml")
    elif args.config:
        config = load_config(resolve_config_path(args.config), args.set or [])
    else:
        raise ConfigError("popgrpo eval: give a run directory, or --config for the base model alone")
    kind = env_kind(config.env.kind)
    if not kind.problems:
        raise ConfigError(
            f"env.kind={config.env.kind}: popgrpo eval scores runs on problems with tests (env.kind=code)"
        )
    kind.check_inputs(config)
    samples = args.samples or max(args.k)
    if samples < max(args.k):
        raise ConfigError(f"--samples {samples}: pass@{max(args.k)} needs at least {max(args.k)} samples per problem")
    import torch

    torch.set_num_threads(args.threads)
    result = evaluate(config, _members(run_dir, config), args.split, args.k, samples)
    out = Path(args.out) if args.out else (run_dir / f"eval_{args.split}.json" if run_dir else None)
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    if out is not None:
        print(f"popgrpo: written to {out}", file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "eval",
        help="pass@k of a code run's members on its held-out problems (env.kind=code)",
        description="Samples completions of every problem of a split from each member of a code run's newest "
        "checkpoint, runs their tests in the sandbox and prints pass@k per member and for the population.",
    )
    ev.add_argument(
        "run_dir", nargs="?", help="a code run's directory (omit it and give --config to score the base model)"
    )
    ev.add_argument(
        "--split", choices=("heldout", "train", "all"), default="heldout", help="which problems (default heldout)"
    )
    ev.add_argument("--k", type=_k_list, default=(1, 10), help="comma-separated k of pass@k (default 1,10)")
    ev.add_argument("--samples", type=int, help="completions per problem and member (default: the largest k)")
    ev.add_argument("--config", help="without RUN_DIR: a code preset or YAML file whose base model is scored")
    ev.add_argument("--set", action="append", metavar="KEY=VALUE", help="without RUN_DIR: override a config field")
    ev.add_argument("--out", help="where the JSON table goes (default RUN_DIR/eval_<split>.json)")
    ev.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ev.set_defaults(func=_cmd_eval)
