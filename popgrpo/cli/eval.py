"""``popgrpo eval``: argument handling over :mod:`popgrpo.research.study.code_eval` (what it computes)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from popgrpo.config import ConfigError
from popgrpo.envs.kinds import env_kind

__all__ = ["add_parsers"]


def _k_list(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"every k must be >= 1, got {text!r}")
    return ks


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
    from popgrpo.research.study.code_eval import evaluate, markdown, run_members

    result = evaluate(config, run_members(run_dir, config), args.split, args.k, samples)
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
