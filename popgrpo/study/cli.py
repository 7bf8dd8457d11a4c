"""``popgrpo reproduce`` and ``popgrpo report``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["add_parsers"]


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from popgrpo.study.report import render
    from popgrpo.study.run import reproduce

    out = Path(args.out or ("runs/reproduce-quick" if args.quick else "runs/reproduce"))
    try:
        result = reproduce(out, quick=args.quick, address=args.address, num_cpus=args.num_cpus, verbose=args.verbose)
    except ValueError as exc:
        from popgrpo.config import ConfigError

        raise ConfigError(str(exc)) from None
    if result["unfinished"]:  # interrupted (Ctrl-C): Tune saved where it was
        done = result["trials"] - result["unfinished"]
        print(f"interrupted: {done} of {result['trials']} trials finished; run the same command again to resume")
        return 130
    written = render(out)
    print(f"{result['trials']} trials in {result['seconds']:.0f} s on {args.num_cpus or os.cpu_count()} CPUs")
    print(f"tables and figures in {out}/:")
    for path in written:
        print(f"  {path}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from popgrpo.study.report import render

    try:
        written = render(args.dir)
    except FileNotFoundError as exc:
        print(f"popgrpo: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser(
        "reproduce",
        help="run the main paper's studies (Table 1, multi-seed, ablations) as a Ray Tune experiment",
        description="Trains every trial of the paper's §5–6 studies and writes tables and figures. "
        "Run it again with the same --out to resume: finished trials are kept.",
    )
    rep.add_argument("--out", help="study directory (default runs/reproduce, or runs/reproduce-quick)")
    rep.add_argument("--quick", action="store_true", help="30 epochs, seeds 42 and 142 (about a minute on 2 cores)")
    rep.add_argument("--address", help="Ray cluster to run the trials on (default: embedded local Ray)")
    rep.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray (default: all)")
    rep.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2), help="Tune's progress output")
    rep.set_defaults(func=_cmd_reproduce)

    report = sub.add_parser("report", help="re-render a study's tables and figures from its Parquet files")
    report.add_argument("dir", help="the --out of a popgrpo reproduce run")
    report.set_defaults(func=_cmd_report)
