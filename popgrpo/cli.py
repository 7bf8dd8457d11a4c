"""The ``popgrpo`` command.

Exit codes: 0 success (``popgrpo`` alone prints the usage); 2 bad input (config, overrides,
a missing file, model or reward function), one line on stderr naming the field, found before
the run directory exists; 1 runtime failure (message on stderr, traceback in the run
directory's ``error.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from popgrpo.config import (
    ConfigError,
    config_markdown,
    list_presets,
    load_args_config,
    load_config,
    preset_path,
    resolve_config_path,
)

if TYPE_CHECKING:
    from popgrpo.config import Config
    from popgrpo.runtime.executor import Executor


def _process_age_s() -> float:
    """Seconds since this process started (Linux's /proc: the interpreter's own start-up counts
    too); 0 where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # fields[19]: starttime, in ticks
    except (OSError, ValueError, IndexError):
        return 0.0


# When ``popgrpo`` started, for the elapsed seconds of the start-up lines.
_STARTED = time.monotonic() - _process_age_s()


def _say(message: str) -> None:
    """One start-up line on stderr, with the seconds since ``popgrpo`` started."""
    print(f"popgrpo: {message} ({time.monotonic() - _STARTED:.1f} s)", file=sys.stderr, flush=True)


def _cmd_train(args: argparse.Namespace) -> int:
    from popgrpo.preflight import check_run, find_inputs, load_inputs

    say = None if args.quiet else _say
    # In this process or an embedded Ray: the run's workers import what they need here.
    workers_here = args.executor == "local" or (args.address is None and not os.environ.get("RAY_ADDRESS"))
    if args.resume:
        if args.config or args.set or args.seed is not None or args.out:
            raise ConfigError(
                "--resume continues a run with its own config.yaml; drop --config/--set/--seed/--out "
                "(--epochs N extends it)"
            )
        run_dir = Path(args.resume)
        if (run_dir / "config.yaml").is_file():  # resume() itself says what is wrong with a directory
            own = load_config(run_dir / "config.yaml")
            check_run(own, workers_here=workers_here)
            if args.epochs is not None and args.epochs < own.run.epochs:
                raise ConfigError(
                    f"--epochs {args.epochs}: the run is set for {own.run.epochs} epochs; --epochs extends a run, "
                    "it cannot shorten one"
                )
        config: Config | None = None
    else:
        if args.epochs is not None:
            raise ConfigError(f"--epochs extends a run with --resume; for a new run use --set run.epochs={args.epochs}")
        config = load_args_config(args)
        config_file = Path(args.config) if args.config and Path(args.config).is_file() else None
        _check_env_inputs(config)
        find_inputs(config, config_file, workers_here=workers_here)  # typos first: nothing heavy imported yet
        from popgrpo.telemetry.loggers import check_available

        check_available(config.run.loggers)  # a tracker's missing client: exit 2 before anything starts
        _check_proxy(config)
        load_inputs(config)
    from popgrpo.telemetry.run_dir import default_run_dir, writable_directory

    if config is None:
        run_dir = Path(args.resume)
    else:
        _check_executor(config, args.executor)
        run_dir = writable_directory(Path(args.out) if args.out else default_run_dir(config), "run directory")
        if say is not None:  # every check passed: the first line, before torch loads
            say(
                f"run {config.run.name}: {config.population.size} member(s) × {config.run.epochs} epochs, into {run_dir}"
            )
    # Imported after the checks so that bad input fails fast, before torch loads.
    from popgrpo.telemetry.watching import watch_lines
    from popgrpo.train import ResumeError, resume, train

    if args.executor == "local":
        from popgrpo.runtime.executor import LocalExecutor

        def local_factory(cfg: Config, run_dir: Path) -> Executor:
            _check_executor(cfg, "local")  # a resumed run's own config
            if say is not None:
                say(f"building {cfg.population.size} member(s) in this process (--executor local: no Ray)")
            executor = LocalExecutor(cfg, run_dir)
            if say is not None:
                _print_watch_lines(watch_lines(run_dir, cfg.run, ray_connected=False))
            return executor

        factory = local_factory
    else:
        from popgrpo.ops.monitor import charts_hint
        from popgrpo.runtime.cluster import SetupError, embeds_ray
        from popgrpo.runtime.ray_executor import RayExecutor
        from popgrpo.telemetry.watching import ray_session_dir

        def ray_factory(cfg: Config, run_dir: Path) -> Executor:
            embedded = embeds_ray(args.address)
            if say is not None:
                say(
                    "starting Ray (embedded, on 127.0.0.1 only; Ray's own lines follow)"
                    if embedded
                    else f"connecting to Ray at {args.address or 'RAY_ADDRESS'}"
                )
            try:
                executor = RayExecutor(cfg, run_dir=run_dir, address=args.address, say=say, count_epochs=not args.quiet)
            except SetupError as exc:
                raise ConfigError(str(exc)) from None
            if say is not None:
                lines = watch_lines(run_dir, cfg.run, ray_connected=True)
                if embedded:  # a cluster's charts are its operator's business (docs/guides/grafana.md)
                    lines.append(charts_hint(ray_session_dir()))
                _print_watch_lines(lines)
            return executor

        factory = ray_factory

    from popgrpo.runtime.stopping import StopOnSignal, exit_status

    again = resume_command(run_dir, args.executor, args.address, typed_program())
    # SIGTERM / SIGINT: the first abandons the round in progress and stops cleanly (the
    # handling below runs with the handlers still set); a second exits at once.
    with StopOnSignal(
        lambda signum: f"popgrpo: second {_signal_name(signum)}: stopped at once; continue with: {again}"
    ) as stop:
        try:
            if config is None:
                summary = resume(
                    run_dir, executor_factory=factory, progress=not args.quiet, epochs=args.epochs, say=say
                )
            else:
                summary = train(config, run_dir, executor_factory=factory, progress=not args.quiet, say=say)
        except KeyboardInterrupt:  # RunInterrupted, or the plain one Ray turns it into
            signum = stop.received or signal.SIGINT
            _disconnect_ray()  # when the stop came before the executor could close it
            print(f"popgrpo: {stopped_line(run_dir, _signal_name(signum), again)}", file=sys.stderr, flush=True)
            return exit_status(signum)
        except (FileExistsError, ConfigError, ResumeError) as exc:
            raise ConfigError(str(exc)) from None
        except Exception as exc:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.log").write_text(traceback.format_exc())
            print(f"popgrpo: run failed: {exc} (traceback in {run_dir / 'error.log'})", file=sys.stderr)
            return 1
    # An earlier failed run in this directory left its traceback: this run succeeded.
    (run_dir / "error.log").unlink(missing_ok=True)
    print(json.dumps(summary, indent=2))
    print(f"run directory: {run_dir}")
    return 0


def resume_command(run_dir: Path, executor: str = "ray", address: str | None = None, program: str = "popgrpo") -> str:
    """The ``popgrpo train --resume`` command that continues the run in ``run_dir`` the same way;
    ``program``: how to type ``popgrpo`` (:func:`typed_program`)."""
    words = [program, "train", "--resume", str(run_dir)]
    if executor != "ray":
        words += ["--executor", executor]
    if address:
        words += ["--address", address]
    return shlex.join(words)


def typed_program(argv0: str | None = None) -> str:
    """How the user can type this command again: ``popgrpo`` when the shell finds this very
    script on the PATH (an activated virtualenv, an installed package), else the script's path
    as it was typed (``.venv/bin/popgrpo``). ``python -m popgrpo`` and the job entry point give
    ``popgrpo``."""
    script = Path(argv0 if argv0 is not None else sys.argv[0])
    if script.name != "popgrpo":
        return "popgrpo"
    found = shutil.which("popgrpo")
    return "popgrpo" if found and Path(found).resolve() == script.resolve() else str(script)


def stopped_line(run_dir: Path, signal_name: str, again: str) -> str:
    """What a stopped run says: its last complete round (the newest intact checkpoint) and
    the command that continues it."""
    from popgrpo.telemetry.checkpoint import Checkpointer

    if (run_dir / "summary.json").exists():
        return f"stopped by {signal_name} after the last round; the run is complete ({run_dir / 'summary.json'})"
    info = Checkpointer(run_dir).latest()
    if info is None:
        done = "before its first round was complete (no checkpoint yet)"
    else:
        done = (
            f"round {info['round']} is the last complete round ({info['epoch_end']} epochs, checkpointed); "
            "the round in progress, if any, was abandoned"
        )
    return f"stopped by {signal_name}: {done}; continue with: {again}"


def _signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _disconnect_ray() -> None:
    """Shut an embedded Ray down (disconnect from an attached one) if the run left it up."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def _check_executor(config: Config, executor: str) -> None:
    if executor == "local" and config.archive.redis_url:
        raise ConfigError(
            "archive.redis_url: Redis write-through is done by the Ray executor's archive actor; "
            "drop --executor local or unset archive.redis_url"
        )


def _check_env_inputs(config: Config) -> None:
    """What the environment reads besides its config (env.kind=code: its problem set), checked by
    its registered kind: a missing file or a bad row is bad input (exit 2, one line)."""
    from popgrpo.envs.kinds import env_kind

    env_kind(config.env.kind).check_inputs(config)


def _check_proxy(config: Config) -> None:
    """reward.source=proxy: a missing or bad RM directory is bad input (exit 2), found before anything starts."""
    if config.reward.source == "proxy":
        from popgrpo.reward_models.proxy import check_proxy
        from popgrpo.reward_models.store import RMDirError

        try:
            check_proxy(config)
        except RMDirError as exc:
            raise ConfigError(str(exc)) from None


def _print_watch_lines(lines: list[str]) -> None:
    """Where to watch the run, on stderr (stdout carries the summary JSON); --quiet leaves them out."""
    for line in lines:
        print(f"popgrpo: {line}", file=sys.stderr, flush=True)


def _cmd_config(args: argparse.Namespace) -> int:
    if args.list:
        presets = list_presets()
        width = max(len(name) for name, _ in presets)
        for name, what in presets:
            cfg = load_config(preset_path(name))
            size = f"{cfg.population.size} member{'s' if cfg.population.size > 1 else ''} × {cfg.run.epochs} epochs"
            sys.stdout.write(f"{name:<{width}}  {size:<26}  {what}\n")
        return 0
    if args.markdown:
        sys.stdout.write(config_markdown())
        return 0
    path = resolve_config_path(args.config) if args.config else None
    sys.stdout.write(load_config(path, args.set or []).to_yaml())
    return 0


def _cmd_lm_tiny(args: argparse.Namespace) -> int:
    from popgrpo.policies.causal_lm import build_tiny_causal_lm

    out = Path(args.out)
    if (out / "config.json").exists() and not args.force:
        print(f"popgrpo: {out} already holds a model (--force overwrites it)", file=sys.stderr)
        return 2
    build_tiny_causal_lm(out, hidden_size=args.hidden, layers=args.layers, seed=args.seed)
    print(f"popgrpo: toy causal LM written to {out} (use --set policy.causal_lm.model={out})")
    return 0


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


# Sub-commands whose parsers this module builds itself; the others' come from their modules,
# imported only when the command line asks for one of them (or for the usage): a `popgrpo
# train` mistake is reported before they load (ray_jobs, study, sim, ...).
_OWN_COMMANDS = ("train", "config", "lm")


def _command_of(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names, if any: its first word (the top level takes no option but ``-h``)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``popgrpo`` parser; with ``command`` one of :data:`_OWN_COMMANDS`, without the other
    sub-commands (their modules are not imported)."""
    parser = argparse.ArgumentParser(prog="popgrpo", description="Population GRPO against diversity collapse.")
    sub = parser.add_subparsers(dest="command")

    train = sub.add_parser("train", help="train a run (default: the Pop-GRPO preset)")
    train.add_argument(
        "--config", help="YAML file or preset name; default pop_grpo (`popgrpo config --list` lists the presets)"
    )
    train.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a field, e.g. --set grpo.lr=1e-3 (repeatable)"
    )
    train.add_argument("--out", help="run directory (default runs/<run.name>-<timestamp>)")
    train.add_argument("--seed", type=int, help="shorthand for --set run.seed=N")
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue an interrupted run from its last complete round, or extend one"
    )
    train.add_argument(
        "--epochs",
        type=int,
        metavar="N",
        help="with --resume: train the run to N epochs in all, continuing a finished run (docs/guides/resume.md)",
    )
    train.add_argument(
        "--quiet", action="store_true", help="no progress bar and no start-up lines; errors and the summary only"
    )
    train.add_argument(
        "--executor",
        choices=("ray", "local"),
        default="ray",
        help="ray (default): members on Ray actors, embedded local Ray unless --address or RAY_ADDRESS; "
        "local: every member in this process, no Ray",
    )
    train.add_argument(
        "--address", help="Ray cluster address to attach to (default: embedded local Ray, or the job's cluster)"
    )
    train.set_defaults(func=_cmd_train)

    cfg = sub.add_parser("config", help="print the resolved config, list the presets, or the field reference")
    cfg.add_argument("--config", help="YAML file or preset name; default: built-in defaults")
    cfg.add_argument("--list", action="store_true", help="list the presets, one line each: name, size, what it is")
    cfg.add_argument("--set", action="append", metavar="KEY=VALUE")
    cfg.add_argument("--markdown", action="store_true", help="print the config reference table")
    cfg.set_defaults(func=_cmd_config)

    lm = sub.add_parser("lm", help="language-model helpers").add_subparsers(dest="lm_command", required=True)
    tiny = lm.add_parser(
        "tiny", help="write a randomly initialised toy causal LM + character tokenizer (offline tests, examples)"
    )
    tiny.add_argument("--out", required=True, help="directory to write (save_pretrained layout)")
    tiny.add_argument("--hidden", type=int, default=32, help="hidden size (default 32)")
    tiny.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    tiny.add_argument("--seed", type=int, default=0, help="weight-initialisation seed")
    tiny.add_argument("--force", action="store_true", help="overwrite a model already in --out")
    tiny.set_defaults(func=_cmd_lm_tiny)
    from popgrpo.lm_commands import add_lm_parsers

    add_lm_parsers(lm)
    if command in _OWN_COMMANDS:
        return parser

    from popgrpo.ops import dashboards, monitor, ray_jobs
    from popgrpo.reward_models import cli as rm_cli
    from popgrpo.research.sim import cli as sim_cli
    from popgrpo.research.study import cli as study_cli
    from popgrpo.research.study import code_eval

    ray_jobs.add_parsers(sub)
    dashboards.add_parsers(sub)
    monitor.add_parsers(sub)
    study_cli.add_parsers(sub)
    code_eval.add_parsers(sub)
    rm_cli.add_parsers(sub)
    sim_cli.add_parsers(sub)
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
