"""``popgrpo train`` and ``popgrpo config``.

``train`` checks its input with :func:`popgrpo.preflight.check_run` (exit 2, one line, before
the run directory exists and before Ray starts), then hands the config to
:func:`popgrpo.train.train` (or ``resume``); a runtime failure exits 1 with its traceback in
the run directory's ``error.log``.
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
from popgrpo.preflight import check_run
from popgrpo.runtime.executor_spec import ExecutorSpec

if TYPE_CHECKING:
    from popgrpo.config import Config


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
    say = None if args.quiet else _say
    executor = ExecutorSpec(args.executor, args.address)
    # In this process or an embedded Ray: the run's workers import what they need here.
    workers_here = args.executor == "local" or (args.address is None and not os.environ.get("RAY_ADDRESS"))
    if args.resume:
        if args.config or args.set or args.seed is not None or args.out:
            raise ConfigError(
                "--resume continues a run with its own config.yaml; drop --config/--set/--seed/--out "
                "(--epochs N extends it)"
            )
        run_dir = Path(args.resume)
        own = None
        if (run_dir / "config.yaml").is_file():  # resume() itself says what is wrong with a directory
            own = load_config(run_dir / "config.yaml")
            if args.epochs is not None and args.epochs < own.run.epochs:
                raise ConfigError(
                    f"--epochs {args.epochs}: the run is set for {own.run.epochs} epochs; --epochs extends a run, "
                    "it cannot shorten one"
                )
            check_run(own, None, executor, workers_here)
        config: Config | None = None
    else:
        if args.epochs is not None:
            raise ConfigError(f"--epochs extends a run with --resume; for a new run use --set run.epochs={args.epochs}")
        own = None
        config = load_args_config(args)
        config_file = Path(args.config) if args.config and Path(args.config).is_file() else None
        check_run(config, config_file, executor, workers_here)
    from popgrpo.telemetry.run_dir import default_run_dir, writable_directory

    if config is None:
        run_dir = Path(args.resume)
    else:
        run_dir = writable_directory(Path(args.out) if args.out else default_run_dir(config), "run directory")
        if say is not None:  # every check passed: the first line, before torch loads
            say(
                f"run {config.run.name}: {config.population.size} member(s) × {config.run.epochs} epochs, into {run_dir}"
            )
    from popgrpo.runtime.stopping import StopOnSignal, exit_status

    again = resume_command(run_dir, args.executor, args.address, typed_program())
    ahead = False  # whether an embedded Ray was started before the trainer was imported
    # SIGTERM / SIGINT: the first abandons the round in progress and stops cleanly (the
    # handling below runs with the handlers still set); a second exits at once.
    with StopOnSignal(
        lambda signum: f"popgrpo: second {_signal_name(signum)}: stopped at once; continue with: {again}"
    ) as stop:
        try:
            # The trainer is imported after the checks so that bad input fails fast, before
            # torch loads; an embedded Ray starts meanwhile.
            ahead = args.executor == "ray" and _start_ray_ahead(config or own, args, say)
            from popgrpo.train import resume, train

            if config is None:
                summary = resume(run_dir, executor, progress=not args.quiet, epochs=args.epochs, say=say)
            else:
                summary = train(config, run_dir, executor, progress=not args.quiet, say=say)
        except KeyboardInterrupt:  # RunInterrupted, or the plain one Ray turns it into
            signum = stop.received or signal.SIGINT
            _disconnect_ray()  # when the stop came before the executor could close it
            print(f"popgrpo: {stopped_line(run_dir, _signal_name(signum), again)}", file=sys.stderr, flush=True)
            return exit_status(signum)
        except (FileExistsError, ConfigError) as exc:
            raise ConfigError(str(exc)) from None
        except Exception as exc:
            if _is_resume_error(exc):
                raise ConfigError(str(exc)) from None
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.log").write_text(traceback.format_exc())
            print(f"popgrpo: run failed: {exc} (traceback in {run_dir / 'error.log'})", file=sys.stderr)
            return 1
        finally:
            if ahead:  # shut it down if no executor took it over (the run stopped before one was built)
                from popgrpo.runtime.cluster import release_ahead

                release_ahead()
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


def _start_ray_ahead(config: Config | None, args: argparse.Namespace, say) -> bool:
    """Start the run's embedded Ray now, importing the trainer (torch, the policies: seconds of
    one core) in a thread meanwhile, so that the two overlap: Ray's start is mostly its own
    processes starting, with a core to spare. False (nothing started) when the run attaches to a
    cluster, or its config is not known here (a resume of a directory that is no run: resume()
    says why)."""
    import threading

    from popgrpo.runtime.cluster import embedded_cpus, embeds_ray, start_ahead

    if config is None or not embeds_ray(args.address):
        return False
    population = config.population
    importing = threading.Thread(target=_import_trainer, name="popgrpo-import", daemon=True)
    importing.start()
    if say is not None:
        say("starting Ray (embedded, on 127.0.0.1 only; Ray's own lines follow)")
    start_ahead(embedded_cpus(population.n_actors, population.resources.num_cpus))
    importing.join()
    return True


def _is_resume_error(exc: Exception) -> bool:
    """Whether ``exc`` is the trainer's ResumeError (bad input: the directory cannot be resumed)."""
    trainer = sys.modules.get("popgrpo.train")
    return trainer is not None and isinstance(exc, trainer.ResumeError)


def _import_trainer() -> None:
    import popgrpo.train  # noqa: F401


def _disconnect_ray() -> None:
    """Shut an embedded Ray down (disconnect from an attached one) if the run left it up."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` and ``config`` to the ``popgrpo`` sub-commands."""
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
