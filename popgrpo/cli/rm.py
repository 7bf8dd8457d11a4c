"""``popgrpo rm train`` and ``popgrpo rm bon``: argument handling over :mod:`popgrpo.reward_models`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from popgrpo.config import ConfigError

__all__ = ["add_parsers"]


def _cmd_train(args: argparse.Namespace) -> int:
    from popgrpo.reward_models.config import load_rm_config, rm_config_markdown

    if args.markdown:
        sys.stdout.write(rm_config_markdown())
        return 0
    if not args.out:
        raise ConfigError("rm train: --out DIR is required (the RM directory to write)")
    rm_cfg = load_rm_config(args.config, args.set or [])
    from popgrpo.reward_models.reference import load_base

    base = load_base(rm_cfg)
    out = Path(args.out)
    if (out / "rms.json").exists() and not args.force:
        raise ConfigError(f"RM directory {out} already holds RMs (rms.json); --force overwrites it")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"RM directory {out}: cannot create it: {exc.strerror or exc}") from None
    from popgrpo.reward_models.tune import train_rms

    manifest = train_rms(rm_cfg, base, out, address=args.address, num_cpus=args.num_cpus, progress=not args.quiet)
    table = {
        **{f"rm_{e['rm_index']}": e["accuracy"] for e in manifest["models"]},
        "ens": manifest["ens"]["accuracy"],
        "warm": manifest["warm"]["accuracy"],
    }
    print(json.dumps(table, indent=2))
    print(f"RM directory: {out}")
    return 0


def _cmd_bon(args: argparse.Namespace) -> int:
    from popgrpo.reward_models.reference import best_of_n_curve
    from popgrpo.reward_models.store import RMDirError

    ns = sorted(set(args.n))
    if any(n < 1 for n in ns):
        raise ConfigError("rm bon: every N must be >= 1")
    try:
        curve = best_of_n_curve(args.dir, args.combine, args.n_models, ns, args.groups, args.seed, args.index)
    except RMDirError as exc:
        raise ConfigError(str(exc)) from None
    print(json.dumps(curve, indent=2))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    rm = sub.add_parser("rm", help="reward models: train M RMs and their WARM on Ray Tune, best-of-N by a proxy")
    rm_sub = rm.add_subparsers(dest="rm_command", required=True)
    train = rm_sub.add_parser(
        "train",
        help="fine-tune M RMs as Ray Tune trials; write every RM, their weight average (WARM), ENS and accuracies",
    )
    train.add_argument("--config", help="YAML of the RM recipe (`popgrpo rm train --markdown` lists its fields)")
    train.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a field, e.g. --set finetune.n_models=4"
    )
    train.add_argument("--out", help="the RM directory to write")
    train.add_argument("--force", action="store_true", help="overwrite an RM directory that already holds RMs")
    train.add_argument("--address", help="Ray cluster address (default: embedded loopback-only Ray)")
    train.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray (default: all)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--markdown", action="store_true", help="print the RM config reference and exit")
    train.set_defaults(func=_cmd_train)

    bon = rm_sub.add_parser("bon", help="best-of-N re-ranking of the reference policy's ideas by a proxy")
    bon.add_argument("dir", help="RM directory of `popgrpo rm train`")
    bon.add_argument("--combine", choices=("single", "ens", "warm"), default="warm")
    bon.add_argument("--n-models", type=int, help="RMs combined by ens / warm (default: all)")
    bon.add_argument("--index", type=int, default=0, help="the RM of --combine single")
    bon.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128], help="values of N")
    bon.add_argument("--groups", type=int, default=2000, help="draws of N ideas averaged per N")
    bon.add_argument("--seed", type=int, default=0, help="seed of the candidate ideas")
    bon.set_defaults(func=_cmd_bon)
