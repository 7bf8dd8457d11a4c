"""``popgrpo reproduce``, ``popgrpo report`` and ``popgrpo calibrate``: argument handling over
:mod:`popgrpo.research.study`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from popgrpo.registry import STUDIES
from popgrpo.research.study.kinds import OPTIONS, report_kind, study_kind

__all__ = ["add_parsers"]


def _positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1 (argparse turns the ValueError into exit 2 and one error line)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {value})")
    return value


def _seed_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integer seeds, at least one, no repeats."""
    try:
        seeds = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed is repeated in {text!r}")
    return seeds


def _given_options(args: argparse.Namespace) -> list[str]:
    """The study-specific options of ``popgrpo reproduce`` given on the command line (not at their defaults)."""
    given = {
        "landscape": args.landscape != "collapse",
        "model": bool(args.model),
        "seeds": args.seeds is not None,
        "epochs": args.epochs is not None,
        "address": bool(args.address),
        "num_cpus": args.num_cpus is not None,
    }
    return [name for name in OPTIONS if given[name]]


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from popgrpo.config import ConfigError

    kind = study_kind(args.study)
    unused = kind.unused(_given_options(args))
    if unused:
        takers = [n for n in STUDIES.names() if study_kind(n).reproducible and not study_kind(n).unused(unused)]
        flags = ", ".join("--" + name.replace("_", "-") for name in unused)
        where = f" (it is for --study {' or '.join(takers)})" if takers else ""
        raise ConfigError(f"--study {args.study} does not take {flags}{where}: drop it")
    out = Path(args.out or kind.default_out(args.quick, args.landscape))
    if kind.run is not None:  # a study with its own plan, run in this process
        result = kind.run_here(out, args.quick, progress=args.verbose > 0)
        print(f"{args.study} study in {result['seconds']:.0f} s; tables and figures in {out}/:")
        for path in result["written"]:
            print(f"  {path}")
        return 0
    from popgrpo.research.study.run import reproduce

    try:
        result = reproduce(
            out,
            quick=args.quick,
            epochs=args.epochs,
            address=args.address,
            num_cpus=args.num_cpus,
            verbose=args.verbose,
            landscape=args.landscape,
            study=args.study,
            model=args.model or "runs/program-lm",
            seeds=args.seeds,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if result["unfinished"]:  # interrupted (Ctrl-C): Tune saved where it was
        done = result["trials"] - result["unfinished"]
        print(f"interrupted: {done} of {result['trials']} trials finished; run the same command again to resume")
        return 130
    with (out / "wall.jsonl").open("a") as log:  # every invocation's share: a resumed study sums them
        log.write(json.dumps({"seconds": result["seconds"], "trials": result["trials"], "cpus": args.num_cpus}) + "\n")
    written = kind.redraw(out)
    print(f"{result['trials']} trials in {result['seconds']:.0f} s on {args.num_cpus or os.cpu_count()} CPUs")
    print(f"tables and figures in {out}/:")
    for path in written:
        print(f"  {path}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from popgrpo.research.study.warm_report import WarmStudyError

    try:
        written = report_kind(args.dir).redraw(args.dir)
    except (FileNotFoundError, WarmStudyError) as exc:
        print(f"popgrpo: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from popgrpo.config import PRESET_DIR
    from popgrpo.research.study.calibrate import calibrate

    if args.holdout:
        from popgrpo.config import ConfigError
        from popgrpo.research.study.calibrate import HOLDOUT_SEEDS, holdout_check

        fit_path = Path(args.holdout)
        if not fit_path.is_file():
            raise ConfigError(f"--holdout {fit_path}: no such fit.json (the --out of a `popgrpo calibrate` run)")
        try:
            check = holdout_check(fit_path, HOLDOUT_SEEDS[:2] if args.quick else HOLDOUT_SEEDS, args.epochs or 120)
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"--holdout {fit_path}: {exc}") from None
        target = fit_path.with_name("holdout.json")
        target.write_text(json.dumps(check, indent=1) + "\n")
        print(
            json.dumps({k: check[k] for k in ("measured", "fitted", "paper", "errors", "within_tolerance")}, indent=2)
        )
        print(f"held-out check on seeds {check['seeds']}: {target}")
        return 0
    out = Path(args.out or ("runs/calibrate-quick" if args.quick else "runs/calibrate"))
    seeds = (42,) if args.quick else tuple(args.seeds)
    fit = calibrate(
        out,
        num_samples=args.num_samples if args.num_samples else (4 if args.quick else 48),
        seeds=seeds,
        epochs=args.epochs or (20 if args.quick else 120),
        search_seed=args.search_seed,
        num_cpus=args.num_cpus,
        presets_dir=None if args.no_presets else Path(args.presets_dir or PRESET_DIR),
        verbose=args.verbose,
    )
    print(
        json.dumps({k: fit[k] for k in ("point", "loss", "measured", "paper", "errors", "within_tolerance")}, indent=2)
    )
    print(f"{fit['search']['trials_finished']} trials in {fit['search']['wall_seconds']:.0f} s; study in {out}/")
    for path in fit["presets"]:
        print(f"  wrote {path}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="fit the environment's open choices to the paper's GRPO row (Ray Tune + Optuna), write the paper_* presets",
        description="A pre-registered search (popgrpo.research.study.calibrate) over the landscape's open choices, fitted to "
        "GRPO's Table 1 row only; the chosen point becomes the paper_* presets.",
    )
    cal.add_argument("--out", help="study directory (default runs/calibrate, or runs/calibrate-quick)")
    cal.add_argument("--num-samples", type=_positive_int, help="search trials (default 48; 4 with --quick)")
    cal.add_argument(
        "--seeds", type=int, nargs="+", default=[42, 142, 242, 342, 442], help="seeds each point is run with"
    )
    cal.add_argument("--epochs", type=_positive_int, help="epochs per run (default 120; 20 with --quick)")
    cal.add_argument("--search-seed", type=int, default=0, help="the search's own seed (Optuna's sampler)")
    cal.add_argument("--num-cpus", type=_positive_int, help="CPUs of the embedded Ray (default: all)")
    cal.add_argument("--presets-dir", help="where the paper_* presets are written (default: the package's presets)")
    cal.add_argument("--no-presets", action="store_true", help="write the study only, no presets")
    cal.add_argument("--quick", action="store_true", help="4 trials, seed 42, 20 epochs: a smoke test, not a fit")
    cal.add_argument(
        "--holdout",
        metavar="FIT_JSON",
        help="no search: re-measure the chosen point of FIT_JSON on 10 held-out seeds (2 with --quick) and write "
        "holdout.json beside it",
    )
    cal.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2), help="Tune's progress output")
    cal.set_defaults(func=_cmd_calibrate)

    rep = sub.add_parser(
        "reproduce",
        help="run the main paper's studies (Table 1, multi-seed, ablations) as a Ray Tune experiment",
        description="Trains every trial of the paper's §5–6 studies and writes tables and figures. "
        "Run it again with the same --out to resume: finished trials are kept.",
    )
    rep.add_argument(
        "--out",
        help="study directory (default runs/reproduce, or runs/reproduce-quick; --study lm: runs/lm-study[-quick])",
    )
    rep.add_argument(
        "--quick",
        action="store_true",
        help="30 epochs, seeds 42 and 142: a first look, and what CI runs (--study lm: 2 epochs of one step, seeds 42 "
        "and 142, 12-token programs: a smoke test for any model)",
    )
    rep.add_argument(
        "--epochs",
        type=_positive_int,
        help="epochs per trial (default 120; 30 with --quick; --study lm: 8, 2 with --quick)",
    )
    rep.add_argument("--address", help="Ray cluster to run the trials on (default: embedded local Ray)")
    rep.add_argument("--num-cpus", type=_positive_int, help="CPUs of the embedded Ray (default: all)")
    rep.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2), help="Tune's progress output")
    rep.add_argument(
        "--landscape",
        choices=("collapse", "paper"),
        default="collapse",
        help="collapse: today's presets (default); paper: the calibrated paper_* presets of `popgrpo calibrate`",
    )
    studies = [name for name in STUDIES.names() if study_kind(name).reproducible]
    rep.add_argument(
        "--study",
        choices=studies,
        default="paper",
        help="; ".join(f"{name}: {study_kind(name).help}" for name in studies) + " (default paper)",
    )
    rep.add_argument(
        "--seeds",
        type=_seed_list,
        help="--study discovery[-tuning]: train exactly these seeds, comma-separated (default: the design's)",
    )
    rep.add_argument(
        "--model",
        help="--study lm: the pre-trained causal LM (default runs/program-lm, made by `popgrpo lm pretrain`)",
    )
    rep.set_defaults(func=_cmd_reproduce)

    report = sub.add_parser("report", help="re-render a study's tables and figures from its Parquet files")
    report.add_argument(
        "dir",
        help="the --out of a popgrpo reproduce run (any --study), a committed copy such as docs/results/warm, "
        "or a code run's directory (env.kind=code: its pass@k curves)",
    )
    report.set_defaults(func=_cmd_report)
