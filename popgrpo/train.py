"""Run one training job end to end, or resume one: executor → rounds → run directory."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

from tqdm import tqdm

from popgrpo.algorithms.archive_service import LocalArchiveState
from popgrpo.config import Config, checkpoint_due, load_config
from popgrpo.runtime.async_loop import AsyncExecutor, AsyncRounds, AsyncState, AsyncStateError, parse_async_state
from popgrpo.runtime.executor import Executor
from popgrpo.runtime.executor_spec import LOCAL, ExecutorSpec, build_executor
from popgrpo.runtime.scheduler import FrontierStore, PopulationRounds, frontier_store, round_lengths, run_rounds
from popgrpo.runtime.stopping import deferred, deferring
from popgrpo.telemetry.checkpoint import Checkpointer
from popgrpo.telemetry.loggers import Loggers, RoundReport, archive_heatmaps, make_loggers
from popgrpo.telemetry.plots import plot_training_dynamics
from popgrpo.telemetry.run_dir import RunDirectory, default_run_dir
from popgrpo.telemetry.summary import RewardWindow, summarise
from popgrpo.telemetry.writer import BackgroundWriter

__all__ = ["ExecutorSpec", "ResumeError", "default_run_dir", "resume", "train"]

# (config, run_dir) -> executor: a test's or benchmark's own executor (a fault injector, a
# timer), in place of the one ``executor`` names.
ExecutorFactory = Callable[[Config, Path], Executor]
Say = Callable[[str], None]  # prints one start-up line (the CLI's, with the seconds since it started)


class ResumeError(ValueError):
    """The directory cannot be resumed (not a run directory, or already finished)."""


def train(
    config: Config,
    run_dir: str | Path,
    executor: ExecutorSpec = LOCAL,
    progress: bool = True,
    say: Say | None = None,
    executor_factory: ExecutorFactory | None = None,
) -> dict:
    """Train ``config`` and write its run directory; return the summary.

    ``executor``: which executor the members train on (:func:`~popgrpo.runtime.executor_spec.build_executor`
    builds it); ``executor_factory``, when given, builds it instead.

    After every round the metrics, the lineage line and a checkpoint are written (by a
    background thread, in that order, while the next round trains), so an interrupted run
    keeps what it finished and :func:`resume` can continue it. ``say``: told when the first
    round begins.
    """
    out = RunDirectory(run_dir).create()
    out.write_config(config)
    executors = (executor, executor_factory)
    return _run(config, out, executors, progress, start_round=0, rows=[], restore=None, say=say)


def resume(
    run_dir: str | Path,
    executor: ExecutorSpec = LOCAL,
    progress: bool = True,
    epochs: int | None = None,
    say: Say | None = None,
    executor_factory: ExecutorFactory | None = None,
) -> dict:
    """Continue an interrupted run from its last complete round; finish with the same epochs.
    ``executor``, ``executor_factory``: as for :func:`train`.

    Metrics and lineage written after that round (by the run that died) are dropped and
    recomputed, so the finished run equals an uninterrupted one with the same seed.

    ``epochs``: train to this many epochs in all (at least the run's own ``run.epochs``), which
    also continues a finished run. The run's ``config.yaml`` is rewritten with the new
    ``run.epochs`` and its ``summary.json`` removed first, so a run stopped while it is being
    extended resumes with a plain :func:`resume`. The end of the old last round, which the
    finished run skipped (nothing is merged once training is over), is carried out first, so
    a synchronous run extended from E to N epochs equals one asked for N epochs from the
    start, bit for bit (tested), when E is a multiple of ``scheduler.interval_epochs``. A run
    whose last round was shorter than the others, or with asynchronous rounds, cannot be
    extended (:class:`ResumeError`).
    """
    out = RunDirectory(run_dir)
    if not (out.path / "config.yaml").is_file():
        raise ResumeError(f"{out.path} is not a popgrpo run directory (no config.yaml)")
    config = load_config(out.path / "config.yaml")
    if epochs is not None and epochs != config.run.epochs:
        config = _extended(out, config, epochs)
    if (out.path / "summary.json").exists():
        raise ResumeError(
            f"{out.path} has already finished (summary.json exists); "
            f"--epochs N with N above its {config.run.epochs} continues it"
        )
    checkpointer = Checkpointer(out.path, config.run.checkpoint_keep)
    info = checkpointer.latest()
    if checkpointer.fallback is not None:
        event = {
            "round": info["round"] if info else -1,
            "event": "checkpoint_fallback",
            "reason": checkpointer.fallback,
        }
        out.append_event(event)
        tqdm.write(f"popgrpo: resume: checkpoint_fallback: {checkpointer.fallback}")
    rows: list[dict] = []
    start_round, restore, async_state, store = 0, None, None, None
    if info is not None:
        start_round, restore = info["round"] + 1, checkpointer.load(info)
        extra = info.get("extra", {})
        raw = extra.get("async") if isinstance(extra, dict) else None
        if config.scheduler.mode == "async":
            try:
                async_state = parse_async_state(raw)
            except AsyncStateError as exc:
                raise ResumeError(f"{checkpointer.root / 'latest.json'}: {exc}") from None
            if async_state.merges not in (info["round"], info["round"] + 1):  # after merge m: m + 1; at the end: m
                raise ResumeError(
                    f"{checkpointer.root / 'latest.json'}: extra.async.merges: {async_state.merges} "
                    f"does not follow the checkpoint's round {info['round']}"
                )
        store = _frontier_store(out.path, info, checkpointer.load_driver(info), config, restore[0])
        if out.has_metrics():
            written = out.read_metrics().to_dict("records")
            if async_state is not None and async_state.rows > len(written):
                raise ResumeError(
                    f"{checkpointer.root / 'latest.json'}: extra.async.rows: {async_state.rows} rows, "
                    f"but metrics.parquet holds {len(written)}"
                )
            # Async rounds: the rows written up to the checkpoint's merge, in the order written.
            rows = (
                written[: async_state.rows]
                if async_state is not None
                else [r for r in written if r["epoch"] < info["epoch_end"]]
            )
    if out.has_metrics():
        out.write_metrics(rows)  # the rows after the checkpoint are recomputed: dropped now
    out.truncate_lineage(max_round=info["round"] if info else -1)
    pending = None
    if info is not None and _round_end_pending(out, config, info["round"]):
        ended = info["epoch_end"] - round_lengths(config.run.epochs, config.scheduler.interval_epochs)[info["round"]]
        pending = [
            sorted((r for r in rows if r["member"] == k and r["epoch"] >= ended), key=lambda r: r["epoch"])
            for k in range(config.population.size)
        ]
    replay: dict[int, list[int]] = {}
    if config.scheduler.mode == "async":
        try:  # merges decided after the checkpoint: the resumed run makes the same ones
            replay = out.take_merges(first=async_state.merges if async_state is not None else 0)
        except ValueError as exc:
            raise ResumeError(f"{out.path}: {exc}") from None
    return _run(
        config,
        out,
        (executor, executor_factory),
        progress,
        start_round=start_round,
        rows=rows,
        restore=restore,
        async_state=async_state,
        replay=replay,
        store=store,
        pending=pending,
        say=say,
    )


def _extended(out: RunDirectory, config: Config, epochs: int) -> Config:
    """``config`` with ``run.epochs = epochs``, written to the run's config.yaml, its summary.json
    removed (see :func:`resume`); ResumeError where the run cannot be continued that way."""
    old, interval = config.run.epochs, config.scheduler.interval_epochs
    if epochs < old:
        raise ResumeError(f"--epochs {epochs}: the run is set for {old} epochs; a run can be extended, not shortened")
    if config.scheduler.mode == "async":
        raise ResumeError(
            "--epochs: a run with asynchronous rounds (scheduler.mode=async) cannot be extended: its last merges "
            "depend on which members reported last; start a new run with --set run.epochs=N"
        )
    if old % interval:
        raise ResumeError(
            f"--epochs: the run's {old} epochs are not a multiple of scheduler.interval_epochs ({interval}), so its "
            f"last round was shorter than a round of a longer run; start a new run with --set run.epochs={epochs}"
        )
    config = config.model_copy(deep=True)
    config.run.epochs = epochs  # validated on assignment
    (out.path / "summary.json").unlink(missing_ok=True)  # before the config: see resume()
    out.write_config(config)
    return config


def _round_end_pending(out: RunDirectory, config: Config, round_index: int) -> bool:
    """Whether the end of round ``round_index`` (its merge) is still to be carried out: it was
    the last round of a run since extended. Every other round's end is written to the lineage
    before that round's checkpoint, so a checkpointed round without a lineage line is one."""
    if not config.scheduler.enabled or config.scheduler.mode != "sync":
        return False
    if round_index + 1 >= len(round_lengths(config.run.epochs, config.scheduler.interval_epochs)):
        return False  # the last round: nothing is merged after it
    path = out.path / "lineage.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return not any(json.loads(line)["round"] == round_index for line in lines if line)


def _frontier_store(
    run_dir: Path, info: dict, driver: object, config: Config, members: list[dict]
) -> FrontierStore | None:
    """The frontier store saved with checkpoint ``info`` (None: the round loop saved none), checked
    against the run's config and its members' weights; ResumeError names what is wrong."""
    if driver is None:
        return None
    reference = members[0].get("policy") if members and isinstance(members[0], dict) else None
    try:
        if not isinstance(reference, dict):
            raise ValueError("no member weights to check the frontier store against")
        return frontier_store(driver, config, reference, int(info["round"]))
    except ValueError as exc:
        raise ResumeError(f"{run_dir}: checkpoint round {info['round']}: {exc}") from None


class _Progress:
    """The progress bar of one run: it moves per epoch, never back, and shows the summary's reward
    window so far (:class:`~popgrpo.telemetry.summary.RewardWindow`). Between the rows of two
    rounds a thread follows the member epochs the executor counts (every ``every_s`` seconds:
    ``done + member_epochs() / members`` epochs per member, capped at the run's)."""

    def __init__(
        self, config: Config, executor: Executor, rows: list[dict], done: int, show: bool, every_s: float = 1.0
    ) -> None:
        self.done = done  # epochs per member in ``rows``
        self.total, self.members = config.run.epochs, config.population.size
        self.bar = tqdm(
            total=self.total, initial=self.done, desc=config.run.name, unit="epoch", disable=not show, mininterval=0.5
        )
        self.lock = threading.Lock()  # the round ends and the follower move the bar
        self.rewards = RewardWindow(config.run.summary_window)
        self.rewards.add(rows)
        self.member_epochs, self.every_s = executor.member_epochs, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="popgrpo-progress", daemon=True) if show else None
        if self._thread is not None:
            self._thread.start()

    def move(self, epochs: int) -> None:
        with self.lock:
            if epochs > self.bar.n:
                self.bar.update(epochs - self.bar.n)

    def _follow(self) -> None:
        while not self._stop.wait(self.every_s):
            done = self.member_epochs()
            if done is not None:
                self.move(min(self.total, self.done + done // self.members))

    def round_ended(self, round_index: int, epoch_end: int, new: list[dict], epochs_per_member: int) -> None:
        """The rows of a round's end are in: the bar goes to ``epochs_per_member``, with the window's rewards."""
        self.rewards.add(new)
        self.move(epochs_per_member)
        last = [r for r in new if r["epoch"] == epoch_end - 1]
        if last:  # a replayed async merge may find its reporters' rows written with the one before
            diversity = sum(r["diversity"] for r in last) / len(last)
            window = self.rewards.values()
            with self.lock:
                self.bar.set_postfix(
                    max_reward=f"{window['max_reward']:.3f}",
                    population_max_reward=f"{window['population_max_reward']:.3f}",
                    diversity=f"{diversity:.3f}",
                    round=round_index,
                )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.bar.close()


class RoundEnd:
    """What the driver does with a finished round, called by the round loop
    (:func:`~popgrpo.runtime.scheduler.run_rounds`, :class:`~popgrpo.runtime.async_loop.AsyncRounds`)
    as ``round_end(round_index, epoch_end, rows_per_member, record, state)``. Its steps, in order:
    keep the rows, take the members' and archives' states, take the executor's events, decide
    whether to checkpoint, hand all of it to the background writer, and move the progress bar.
    A stop signal that comes meanwhile waits until the round is handed over."""

    def __init__(
        self,
        config: Config,
        out: RunDirectory,
        executor: Executor,
        rounds: PopulationRounds,
        writer: BackgroundWriter,
        checkpointer: Checkpointer,
        loggers: Loggers,
        progress: _Progress,
        rows: list[dict],
        replaced_checkpoint: int | None,
    ) -> None:
        self.config, self.out, self.executor, self.rounds = config, out, executor, rounds
        self.writer, self.checkpointer, self.loggers, self.progress = writer, checkpointer, loggers, progress
        self.rows = rows  # every row so far (a resumed run's too)
        self.synchronous = config.scheduler.mode == "sync"
        # An extended run's first round end replaces the checkpoint its round left before the
        # merge: that one would not do for a later resume, which reads the lineage line as "merged".
        self.replaced_checkpoint = replaced_checkpoint

    @deferring
    def __call__(
        self,
        round_index: int,
        epoch_end: int,
        member_rows: list[list[dict]],
        record: dict | None,
        state: dict | None = None,
    ) -> None:
        new = [row for per_member in member_rows for row in per_member]
        self.rows.extend(new)
        member_states, archive_states = self.states(record)
        events = self.take_events()
        self.writer.submit(
            _write_round,
            self.out,
            self.checkpointer,
            self.loggers,
            self.config,
            RoundReport(round_index, epoch_end, new, record),
            member_states,
            archive_states,
            self.loop_state(state),
            self.rounds.state_dict(),
            events,
            self.checkpoint_due(round_index, epoch_end),
        )
        for event in events:
            tqdm.write(f"popgrpo: round {round_index}: {event['event']}: {event.get('reason', '')}")
        self.progress.round_ended(round_index, epoch_end, new, len(self.rows) // len(member_rows))

    def states(self, record: dict | None) -> tuple[list[dict], list[LocalArchiveState]]:
        """The members' and archives' states for the checkpoint. Asynchronous rounds: members
        still training are mid-round, and asking their actors for their states would wait for
        them; the checkpoint holds every member's restore point (its state when it last adopted
        a merge) and where each actor is, so that a resumed run redoes those rounds. At the end
        everyone is idle: their states."""
        if self.synchronous or record is None:
            return self.executor.snapshot()
        return cast(AsyncExecutor, self.executor).restore_points()

    def take_events(self) -> list[dict]:
        """The failures and recoveries the executor noted since the last round end."""
        events = list(self.executor.events)
        self.executor.events.clear()
        return events

    def loop_state(self, state: dict | None) -> dict | None:
        """The asynchronous loop's state for the checkpoint: a copy (the loop goes on changing its lists)."""
        return None if state is None else {"async": {**copy.deepcopy(state), "rows": len(self.rows)}}

    def checkpoint_due(self, round_index: int, epoch_end: int) -> bool:
        """``run.checkpoint_every`` rounds, the last round, and an extended run's first round end."""
        last = epoch_end >= self.config.run.epochs
        return checkpoint_due(round_index, self.config.run.checkpoint_every, last=last) or (
            round_index == self.replaced_checkpoint
        )


def _write_round(
    out: RunDirectory,
    checkpointer: Checkpointer,
    loggers: Loggers,
    config: Config,
    report: RoundReport,
    member_states: list[dict],
    archive_states: list[LocalArchiveState],
    extra: dict | None,
    driver: dict | None,
    events: list[dict],
    checkpoint: bool = True,
) -> None:
    """A round's files, in the background writer (:mod:`popgrpo.telemetry.writer`).

    In this order: the metrics part and the lineage line, the loggers (flushed), the
    checkpoint (when ``checkpoint``: ``run.checkpoint_every``), then the events. ``latest.json`` is written last of the checkpoint, so a run
    killed anywhere in between resumes from a round whose rows are on disk and recomputes the
    rest (TensorBoard purges what it logged of those epochs, so no epoch goes missing or twice).
    """
    if report.rows:
        out.append_metrics(report.rows)
    if report.lineage is not None:
        out.append_lineage(report.lineage)
    if loggers.loggers:
        cap = config.run.logged_members
        heatmaps = archive_heatmaps(archive_states, shared=config.archive.shared, members=cap)
        loggers.log_round(RoundReport(report.round, report.epoch_end, report.rows, report.lineage, heatmaps, cap))
    if checkpoint:
        checkpointer.save(report.round, report.epoch_end, member_states, archive_states, extra, driver)
    for event in events:
        out.append_event({"round": report.round, **event})


def _run(
    config: Config,
    out: RunDirectory,
    executors: tuple[ExecutorSpec, ExecutorFactory | None],
    progress: bool,
    start_round: int,
    rows: list[dict],
    restore: tuple[list[dict], list[LocalArchiveState]] | None,
    async_state: AsyncState | None = None,
    replay: dict[int, list[int]] | None = None,
    store: FrontierStore | None = None,
    pending: list[list[dict]] | None = None,
    say: Say | None = None,
) -> dict:
    checkpointer = Checkpointer(out.path, config.run.checkpoint_keep)
    done = len({r["epoch"] for r in rows})
    # Before the executor: a tracker whose client is missing stops the run before Ray starts.
    loggers = make_loggers(config, out.path, resume_epoch=done if start_round > 0 else None)
    try:
        spec, factory = executors  # before the progress bar: start-up may fail
        if factory is not None:
            executor = factory(config, out.path)
        else:
            executor = build_executor(spec, config, out.path, say=say, count_epochs=progress)
    except BaseException:
        loggers.close(failed=True)
        raise
    if say is not None:
        say(f"round {start_round} begins (epoch {done} of {config.run.epochs})")
    bar = _Progress(config, executor, rows, done, show=progress)
    writer = BackgroundWriter()  # the round's files and logger events, written while the next round trains
    failed = True
    try:
        rounds = PopulationRounds(config, executor, store)  # carries out round ends; its state is checkpointed
        replaced = start_round - 1 if pending is not None else None
        round_end = RoundEnd(config, out, executor, rounds, writer, checkpointer, loggers, bar, rows, replaced)
        if restore is not None:
            executor.load_member_states(restore[0])
            executor.load_archive_states(restore[1])
        if config.scheduler.mode == "sync":
            run_rounds(config, executor, round_end, start_round=start_round, rounds=rounds, pending=pending)
        else:
            try:
                AsyncRounds(
                    config,
                    cast(AsyncExecutor, executor),
                    round_end,
                    state=async_state,
                    decided=out.append_merge,
                    replay=replay,
                    rounds=rounds,
                ).run()
            except AsyncStateError as exc:
                raise ResumeError(f"{out.path}: {exc}") from None
        failed = False
    finally:
        # A stop signal waits until what the finished rounds wrote is on disk (a second one
        # ends the process at once; every file is replaced atomically, so none is half written).
        with deferred():
            bar.close()
            try:
                executor.close()
            finally:
                try:
                    writer.close(raise_error=not failed)  # every round handed over is written
                    if not writer.failed:
                        out.compact_metrics()
                finally:
                    loggers.close(failed=failed or writer.failed)
    metrics = out.read_metrics()
    summary = summarise(metrics, config.run.summary_window)
    summary["restarts"] = out.count_events("member_actor_restarted")
    summary["restarts_hung"] = out.count_events("member_actor_restarted", cause="hung")  # of those, hung ones
    out.write_summary(summary)
    plot_training_dynamics(metrics, out.path / "training_dynamics.png", title=config.run.name)
    return summary
