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
from popgrpo.runtime.async_loop import AsyncExecutor, AsyncState, AsyncStateError, parse_async_state, run_async
from popgrpo.runtime.executor import Executor, LocalExecutor
from popgrpo.runtime.scheduler import FrontierStore, PopulationRounds, frontier_store, round_lengths, run_rounds
from popgrpo.runtime.stopping import deferred, deferring
from popgrpo.telemetry.checkpoint import Checkpointer
from popgrpo.telemetry.loggers import Loggers, RoundReport, archive_heatmaps, make_loggers
from popgrpo.telemetry.plots import plot_training_dynamics
from popgrpo.telemetry.run_dir import RunDirectory, default_run_dir
from popgrpo.telemetry.summary import RewardWindow, summarise
from popgrpo.telemetry.writer import BackgroundWriter

__all__ = ["ResumeError", "default_run_dir", "resume", "train"]

ExecutorFactory = Callable[[Config, Path], Executor]  # (config, run_dir) -> executor
Say = Callable[[str], None]  # prints one start-up line (the CLI's, with the seconds since it started)


class ResumeError(ValueError):
    """The directory cannot be resumed (not a run directory, or already finished)."""


def train(
    config: Config,
    run_dir: str | Path,
    executor_factory: ExecutorFactory = LocalExecutor,
    progress: bool = True,
    say: Say | None = None,
) -> dict:
    """Train ``config`` and write its run directory; return the summary.

    After every round the metrics, the lineage line and a checkpoint are written (by a
    background thread, in that order, while the next round trains), so an interrupted run
    keeps what it finished and :func:`resume` can continue it. ``say``: told when the first
    round begins.
    """
    out = RunDirectory(run_dir).create()
    out.write_config(config)
    return _run(config, out, executor_factory, progress, start_round=0, rows=[], restore=None, say=say)


def resume(
    run_dir: str | Path,
    executor_factory: ExecutorFactory = LocalExecutor,
    progress: bool = True,
    epochs: int | None = None,
    say: Say | None = None,
) -> dict:
    """Continue an interrupted run from its last complete round; finish with the same epochs.

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
        executor_factory,
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


class _BarFollower:
    """A thread that moves the progress bar as member epochs finish, between the rows of two
    rounds (:mod:`popgrpo.runtime.progress`): every ``every_s`` seconds it sets the bar to
    ``start + member_epochs() / members`` epochs per member, capped at ``total``, through
    ``move``, which never moves it back."""

    def __init__(
        self,
        member_epochs: Callable[[], int | None],
        members: int,
        start: int,
        total: int,
        move: Callable[[int], None],
        every_s: float = 1.0,
    ) -> None:
        self.member_epochs, self.members, self.start, self.total = member_epochs, members, start, total
        self.move, self.every_s = move, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="popgrpo-progress", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.wait(self.every_s):
            done = self.member_epochs()
            if done is not None:
                self.move(min(self.total, self.start + done // self.members))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


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
    executor_factory: ExecutorFactory,
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
        executor = executor_factory(config, out.path)  # before the progress bar: start-up may fail
    except BaseException:
        loggers.close(failed=True)
        raise
    if say is not None:
        say(f"round {start_round} begins (epoch {done} of {config.run.epochs})")
    bar = tqdm(
        total=config.run.epochs, initial=done, desc=config.run.name, unit="epoch", disable=not progress, mininterval=0.5
    )
    bar_lock = threading.Lock()  # the round ends and the follower below move the bar

    def move_bar(epochs: int) -> None:
        with bar_lock:
            if epochs > bar.n:
                bar.update(epochs - bar.n)

    # Between rounds the bar follows the member epochs as they finish (executors that count them).
    follower = (
        _BarFollower(executor.member_epochs, config.population.size, done, config.run.epochs, move_bar)
        if progress
        else None
    )
    rewards = RewardWindow(config.run.summary_window)  # the bar's numbers are the summary's, so far
    rewards.add(rows)
    synchronous = config.scheduler.mode == "sync"

    writer = BackgroundWriter()  # the round's files and logger events, written while the next round trains

    @deferring  # a stop signal that comes while a round is handed over waits for it
    def on_round(
        round_index: int, epoch_end: int, member_rows: list[list[dict]], record: dict | None, state: dict | None = None
    ) -> None:
        new = [row for per_member in member_rows for row in per_member]
        rows.extend(new)
        # Asynchronous rounds: members still training are mid-round, and asking their actors
        # for their states would wait for them; the checkpoint holds every member's restore
        # point (its state when it last adopted a merge) and where each actor is, so that a
        # resumed run redoes those rounds. At the end everyone is idle: their states.
        if synchronous or record is None:
            member_states, archive_states = executor.snapshot()
        else:
            member_states, archive_states = cast(AsyncExecutor, executor).restore_points()
        # The state's lists are the loop's own, which it goes on changing: the writer gets a copy.
        extra = None if state is None else {"async": {**copy.deepcopy(state), "rows": len(rows)}}
        events = list(executor.events)
        executor.events.clear()
        checkpoint = checkpoint_due(round_index, config.run.checkpoint_every, last=epoch_end >= config.run.epochs)
        # An extended run's first round end replaces the checkpoint its round left before the
        # merge: that one would not do for a later resume, which reads the lineage line as "merged".
        checkpoint = checkpoint or (pending is not None and round_index == start_round - 1)
        writer.submit(
            _write_round,
            out,
            checkpointer,
            loggers,
            config,
            RoundReport(round_index, epoch_end, new, record),
            member_states,
            archive_states,
            extra,
            rounds.state_dict(),
            events,
            checkpoint,
        )
        for event in events:
            tqdm.write(f"popgrpo: round {round_index}: {event['event']}: {event.get('reason', '')}")
        rewards.add(new)
        last = [r for r in new if r["epoch"] == epoch_end - 1]
        move_bar(len(rows) // len(member_rows))  # epochs per member, on average
        if last:  # a replayed async merge may find its reporters' rows written with the one before
            diversity = sum(r["diversity"] for r in last) / len(last)
            window = rewards.values()
            with bar_lock:
                bar.set_postfix(
                    max_reward=f"{window['max_reward']:.3f}",
                    population_max_reward=f"{window['population_max_reward']:.3f}",
                    diversity=f"{diversity:.3f}",
                    round=round_index,
                )

    failed = True
    try:
        rounds = PopulationRounds(config, executor, store)  # carries out round ends; its state is checkpointed
        if restore is not None:
            executor.load_member_states(restore[0])
            executor.load_archive_states(restore[1])
        if synchronous:
            run_rounds(config, executor, on_round, start_round=start_round, rounds=rounds, pending=pending)
        else:
            try:
                run_async(
                    config,
                    cast(AsyncExecutor, executor),
                    on_round,
                    state=async_state,
                    decided=out.append_merge,
                    replay=replay,
                    rounds=rounds,
                )
            except AsyncStateError as exc:
                raise ResumeError(f"{out.path}: {exc}") from None
        failed = False
    finally:
        # A stop signal waits until what the finished rounds wrote is on disk (a second one
        # ends the process at once; every file is replaced atomically, so none is half written).
        with deferred():
            if follower is not None:
                follower.close()
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
