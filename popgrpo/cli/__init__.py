"""The ``popgrpo`` command: one module per command group.

``train`` (train, config), ``lm`` (every ``lm`` sub-command), ``study`` (reproduce, report,
calibrate), ``eval``, ``sim`` (simulate), ``rm``, ``ops`` (submit, jobs, dashboards, monitor),
and ``job``, the Ray job entry point (``python -m popgrpo.cli.job``). Each module holds its
parsers and their handlers; the work itself is done by the library modules they call.

Exit codes: 0 success (``popgrpo`` alone prints the usage); 2 bad input (config, overrides,
a missing file, model or reward function), one line on stderr naming the field, found before
the run directory exists; 1 runtime failure (message on stderr, traceback in the run
directory's ``error.log``).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from popgrpo.cli.train import resume_command, stopped_line, typed_program
from popgrpo.config import ConfigError

__all__ = ["build_parser", "main", "resume_command", "stopped_line", "typed_program"]

# What transformers warns of on every language-model run, about a call peft makes (not ours to change).
_PEFT_DEPRECATION = "`is_gradient_checkpointing` is deprecated"


def _quiet_hugging_face() -> None:
    """Hugging Face's weight-loading and shard-writing bars, its info and warning logs and the
    deprecation warning above drown a run's own lines: off in this process and, through the
    environment, in the processes an embedded Ray starts for the members. A variable the user
    set is left as it is."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ignore = f"ignore:{_PEFT_DEPRECATION}:FutureWarning"
    if ignore not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), ignore]))
    warnings.filterwarnings("ignore", message=_PEFT_DEPRECATION, category=FutureWarning)


# Sub-commands whose parsers are built without the other groups' modules, which are imported
# only when the command line asks for one of them (or for the usage): a `popgrpo train`
# mistake is reported before they load (ray_jobs, study, sim, ...).
_OWN_COMMANDS = ("train", "config", "lm")


def _command_of(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names, if any: its first word (the top level takes no option but ``-h``)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``popgrpo`` parser; with ``command`` one of :data:`_OWN_COMMANDS`, without the other
    sub-commands (their modules are not imported)."""
    from popgrpo.cli import lm, train

    parser = argparse.ArgumentParser(prog="popgrpo", description="Population GRPO against diversity collapse.")
    sub = parser.add_subparsers(dest="command")
    train.add_parsers(sub)
    lm.add_parsers(sub)
    if command in _OWN_COMMANDS:
        return parser

    from popgrpo.cli import eval as eval_cli
    from popgrpo.cli import ops, rm, sim, study

    ops.add_parsers(sub)
    study.add_parsers(sub)
    eval_cli.add_parsers(sub)
    rm.add_parsers(sub)
    sim.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if args.command is None:  # `popgrpo` alone: the usage, nothing started (training is `popgrpo train`)
        parser.print_help()
        return 0
    if args.command in ("train", "lm"):
        _quiet_hugging_face()
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"popgrpo: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
