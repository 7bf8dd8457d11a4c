"""Section 3: the share of a Pop-GRPO run's wall time spent outside member training, sync and async rounds.

Real runs (:func:`popgrpo.train.train`, pop_grpo preset: K = 5, one member per Ray actor,
T = 10 epochs per round) in each scheduler mode (:data:`ARMS`): ``sync`` (every round waits for
every member), ``async`` at its defaults (B = K, S = 0: the sync schedule, driven by the event
loop) and async with B = 2, S = 2 (a merge as soon as two members have reported; the others go on
training). The arms alternate run by run, ``--repeats`` times.

**Training time** is the CPU time the actors' threads spent inside the members' epochs
(``MemberGroup.train_cpu_seconds``), summed over every train call and spread over the cores
the actors can use: ``Σ CPU s / min(cores, actors)``. Measured in the actors, on the same
loaded machine, it already holds what running next to each other costs the members. The
**wall time** runs from the first train call to the last report. What is left, ``1 − training
÷ wall``, is outside member training: cores left idle while members wait (the barrier, the
driver's work between rounds, Ray's calls) and CPU taken by anything else (Ray's processes,
the driver and its background writer, other processes on the machine).

Where the driver's time goes is timed per merge: :class:`TimedExecutor` (a
:class:`popgrpo.runtime.round_timer.RoundTimer`) timestamps the calls
the round loop makes (``get_weights``, the top-M fetch; ``adopt``, ``ray.put`` of the merge
and its broadcast; ``snapshot`` / ``restore_points``, the states the checkpoint holds), the
hand-over of a round's results to the background writer (``train.RoundEnd`` less those calls) and
the rest of the driver's time outside training calls (selection, the merge, the held-out
evaluation). The background writer's own time (metrics part, lineage, loggers, checkpoint:
:func:`popgrpo.train._write_round`) runs in its thread, beside the next round's training:
its wall time and the CPU time its thread used are shown, and the loggers' part of it.

**At rest** (:func:`at_rest`): before the runs, the same Ray with the run's archive and member
actors is watched for :data:`REST_S` seconds without a call. What it takes of the cores then
(Ray's processes and threads, the idle actors' own threads) is there whatever the rounds do;
the share outside member training less it is what the rounds themselves add.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import met, write_between
from benchmarks.overhead_budget import DEFAULT_JSON, TARGET, load_sizes, rest_share, spread
from popgrpo.config import Config, load_config, preset_path
from popgrpo.markdown import md_table
from popgrpo.runtime.round_timer import RoundTimer
from popgrpo.telemetry.cpu import DRIVER_THREADS, CpuSample, split

CORES = os.cpu_count() or 1
# label → config overrides
ARMS = {
    "sync": [],
    "async (B = K, S = 0)": ["scheduler.mode=async"],
    "async (B = 2, S = 2)": ["scheduler.mode=async", "scheduler.buffer=2", "scheduler.max_staleness=2"],
}
TIMED = ("train", "wait_train", "get_weights", "adopt", "snapshot", "restore_points")
TRAINING = ("train", "wait_train")  # the driver waits for members inside these
PARTS = ("get_weights", "adopt", "states", "handover", "driver")  # the driver's time outside training calls
SECTION = "### 3. Round overhead at the default config"
NEXT_SECTION = "### 4. Multi-node layout"
HEADLINE = re.compile(r"^\| 3 \| round time outside member training.*$", re.MULTILINE)


class TimedExecutor(RoundTimer):
    """A :class:`RoundTimer` of the calls in :data:`TIMED` whose first round is the first train
    or submit_train call; on Ray a :class:`CpuSample` is taken right before that call (its own
    cost is not in the window) and at close, into :attr:`cpu`."""

    def __init__(self, inner) -> None:
        super().__init__(inner, timed=TIMED, round_start=("train", "submit_train"), mark=self._sample_cpu)
        self.cpu: list[CpuSample] = []

    def _sample_cpu(self, round_index: int | None) -> None:
        pids = self.worker_pids()
        if pids and round_index in (0, None):
            self.cpu.append(CpuSample.take(set(pids)))


class WriterTimes:
    """The background writer's tasks: wall and thread CPU seconds, and the loggers' wall seconds."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.logging = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - start
                self.cpu += time.thread_time() - cpu

        return timed

    def wrap_logging(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.logging += time.perf_counter() - start

        return timed


# The training between merges, as a multiple of the preset's: the preset's member with 4× and 16×
# the steps per epoch (the same weights, the same rounds of T epochs), with fewer epochs so that a
# run stays under a minute: how the share falls as the training per merge grows, and where it ends.
SIZES: dict[int, list[str]] = {
    1: [],
    4: ["grpo.steps_per_epoch=32", "run.epochs=100"],
    16: ["grpo.steps_per_epoch=128", "run.epochs=80"],
}


def default_config(quick: bool, overrides: list[str] | None = None) -> Config:
    """The pop_grpo preset for 20 rounds, 19 merges (quick: 3 rounds of T = 2 epochs, the 5 members
    packed into one actor, whose start-up is a few CPU-seconds; the numbers then say little)."""
    base = ["run.epochs=200"]
    if quick:
        base = ["run.epochs=6", "scheduler.interval_epochs=2", "population.members_per_actor=5"]
    return load_config(preset_path("pop_grpo"), [*base, *(overrides or [])])


def _train(cfg: Config, factory) -> tuple[TimedExecutor, WriterTimes]:
    """One run through :class:`TimedExecutor`; the hand-over to the writer (``train.RoundEnd``) and the
    writer's tasks are timed too."""
    from unittest import mock

    import popgrpo.train as train_module

    holder: dict[str, TimedExecutor] = {}
    writer = WriterTimes()

    def make(config, run_dir) -> Any:
        holder["executor"] = TimedExecutor(factory(config, run_dir))
        return holder["executor"]

    round_end = train_module.RoundEnd.__call__

    def timed_round_end(self, *args, **kwargs):  # the executor is made after RoundEnd: looked up at call time
        return holder["executor"].time("round_end", round_end)(self, *args, **kwargs)

    def make_loggers(*args, **kwargs):
        loggers = original_make_loggers(*args, **kwargs)
        loggers.log_round = writer.wrap_logging(loggers.log_round)
        return loggers

    original_make_loggers = train_module.make_loggers
    run_dir = tempfile.mkdtemp(prefix="pgb-round-", dir="/tmp")
    try:
        with (
            mock.patch.object(train_module.RoundEnd, "__call__", timed_round_end),
            mock.patch.object(train_module, "make_loggers", make_loggers),
            mock.patch.object(train_module, "_write_round", writer.wrap(train_module._write_round)),
        ):
            train_module.train(cfg, os.path.join(run_dir, "run"), executor_factory=make, progress=False)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return holder["executor"], writer


def measure(timed: TimedExecutor, writer: WriterTimes, cores: int) -> dict:
    """Seconds of the run's window, its members' training and each part (whole run, not per merge)."""
    calls = timed.calls
    first = timed.starts[0]
    end = max(c.end for c in calls if c.name in TRAINING)
    window = end - first
    merges = sum(1 for c in calls if c.name == "adopt")

    def total(name: str) -> float:  # inside the window only (not the start-up's or the last round's states)
        return timed.total(name, first, end)

    training_calls = total("train") + total("wait_train")
    states = total("snapshot") + total("restore_points")
    parts = {
        "get_weights": total("get_weights"),
        "adopt": total("adopt"),
        "states": states,
        "handover": total("round_end") - states,  # the states are asked for inside the round end
    }
    # The driver's time in the window outside training calls, less the parts above: selection, merge, eval.
    outside_calls = window - training_calls
    parts["driver"] = outside_calls - sum(parts.values())
    train_cpu = sum(s for per_actor in timed.epoch_cpu for s in per_actor)
    members = train_cpu / min(cores, max(len(timed.epoch_cpu), 1))
    return {
        "window": window,
        "members": members,
        "merges": merges,
        "parts": parts,
        "busy": outside_calls,
        "writer_wall": writer.wall,
        "writer_cpu": writer.cpu,
        "logging": writer.logging,
        "outside_share": 1 - members / window,
        # first train call to the executor's close (the last round's files and states included)
        "cpu_split": split(timed.cpu[0], timed.cpu[1], train_cpu, cores) if len(timed.cpu) == 2 else None,
    }


REST_S = 15.0  # seconds the run's Ray and actors are watched at rest


def at_rest(cfg: Config, cores: int, seconds: float = REST_S) -> dict[str, float]:
    """The split of the cores (:func:`popgrpo.telemetry.cpu.split`) while the run's Ray, its evaluator
    actor and its member actors are up with nothing to do: a :class:`RayExecutor` of ``cfg``
    built, its evaluator actor asked for θ_0 once (so that its start is over), and left without a
    call for ``seconds`` (after 2 s for its start-up to settle)."""

    from popgrpo.runtime.ray_executor import RayExecutor

    run_dir = tempfile.mkdtemp(prefix="pgb-rest-", dir="/tmp")
    executor = RayExecutor(cfg, run_dir=os.path.join(run_dir, "run"))
    try:
        pids = set(executor.worker_pids())
        executor.round0_weights([0])
        time.sleep(2.0)
        before = CpuSample.take(pids)
        time.sleep(seconds)
        after = CpuSample.take(pids)
    finally:
        executor.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return split(before, after, 0.0, cores)


def run(
    quick: bool = False, cores: int = CORES, repeats: int = 1, extra: list[str] | None = None, warm_up: bool = True
) -> dict:
    """Needs a connected single-node Ray with at least ``population.size`` logical CPUs.

    ``extra``: overrides applied to every mode (a size of :data:`SIZES`). ``warm_up``: one untimed
    run first (the first on a fresh Ray; a later call on the same Ray passes False)."""
    extra = list(extra or [])
    from popgrpo.runtime.ray_executor import RayExecutor

    results: dict[str, list[dict]] = {label: [] for label in ARMS}
    loads = [os.getloadavg()[0]]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if warm_up:
        # The first run on a fresh Ray shares the cores with the worker processes Ray starts
        # ahead (their imports), which made it about twice as slow: it is not timed.
        _train(default_config(quick, [] if quick else ["run.epochs=30"]), lambda c, d: RayExecutor(c, run_dir=d))
    rest = at_rest(default_config(quick, extra), cores, 3.0 if quick else REST_S)
    loads.append(os.getloadavg()[0])
    for _ in range(repeats):
        for label, overrides in ARMS.items():  # alternated: a drift in the machine's speed falls on every arm
            cfg = default_config(quick, [*overrides, *extra])
            timed, writer = _train(cfg, lambda c, d: RayExecutor(c, run_dir=d))
            results[label].append(measure(timed, writer, cores))
            loads.append(os.getloadavg()[0])
    cfg = default_config(quick, extra)
    shares = {label: statistics.median(r["outside_share"] for r in runs) for label, runs in results.items()}
    return {
        "k": cfg.population.size,
        "actors": -(-cfg.population.size // cfg.population.members_per_actor),
        "per_actor": cfg.population.members_per_actor,
        "interval": cfg.scheduler.interval_epochs,
        "epochs": cfg.run.epochs,
        "steps": cfg.grpo.steps_per_epoch,
        "cores": cores,
        "repeats": repeats,
        "extra": extra,
        "arms": results,
        "shares": shares,
        "at_rest": rest,
        "loads": loads,
        "started": started,
        "ended": time.strftime("%H:%M UTC", time.gmtime()),
        "niceness": os.environ.get("RAY_worker_niceness", "15 (Ray's default)"),  # noqa: SIM112 - Ray's own name
        # The headline: the worst mode's median share.
        "outside_share": max(shares.values()),
    }


def markdown(r: dict) -> str:
    arms: dict[str, list[dict]] = r["arms"]

    def pct(x: float) -> str:
        return f"{x:.1%}"

    def ms(x: float) -> str:
        return f"{x * 1e3:,.0f}"

    rest = rest_share(r)
    summary_rows = []
    for label, runs in arms.items():
        share = r["shares"][label]
        per_merge = [x["window"] / max(x["merges"], 1) for x in runs]
        summary_rows.append(
            [
                f"Ray, K = {r['k']}, {label}",
                runs[0]["merges"],
                spread([x["window"] for x in runs], lambda v: f"{v:.2f}"),
                spread([x["members"] for x in runs], lambda v: f"{v:.2f}"),
                spread(per_merge, ms),
                spread([x["outside_share"] for x in runs], pct),
                *([] if rest is None else [spread([x["outside_share"] - rest for x in runs], pct)]),
                f"≤ {TARGET:.0%}",
                met(share <= TARGET, _largest(runs)),
            ]
        )
    rest_column = [] if rest is None else ["of it beyond the run's Ray and actors at rest"]
    summary = md_table(
        ["mode", "merges", "wall s", "members' training s", "wall ms per merge", "outside member training",
         *rest_column, "target", "status"],
        summary_rows,
    )  # fmt: skip

    labels = list(arms)

    def row(name: str, value) -> list[str]:
        cells = []
        for label in labels:
            runs = arms[label]
            cells.append(spread([value(x) / max(x["merges"], 1) for x in runs], ms))
        return [name, *cells]

    parts_rows = [
        row("whole run ÷ merges (wall)", lambda x: x["window"]),
        row(f"members' own training (actors' CPU s ÷ {min(r['cores'], r['actors'])} cores)", lambda x: x["members"]),
        row("outside member training", lambda x: x["window"] - x["members"]),
        row("driver outside training calls (critical path in sync rounds):", lambda x: x["busy"]),
        row("… `get_weights` (top-M fetch)", lambda x: x["parts"]["get_weights"]),
        row("… `adopt` (`ray.put` of the merge, broadcast, perturb; states back)", lambda x: x["parts"]["adopt"]),
        row("… `snapshot` / `restore_points` (states for the checkpoint)", lambda x: x["parts"]["states"]),
        row("… hand-over of the round to the background writer", lambda x: x["parts"]["handover"]),
        row("… selection, merge, held-out eval, loop", lambda x: x["parts"]["driver"]),
        row("background writer, wall (beside training)", lambda x: x["writer_wall"]),
        row("… its thread's CPU", lambda x: x["writer_cpu"]),
        row("… of it the loggers (TensorBoard), wall", lambda x: x["logging"]),
    ]
    parts = md_table(["ms per merge", *labels], parts_rows)
    tables = [summary, parts]
    if rest is not None:
        tables.insert(1, rest_note(r))
    if _has_split(arms):
        tables += [
            f"Where the {r['cores']} cores went, from the first train call to the executor's close (the last "
            f"round's files included): % of {r['cores']} cores × that time, per process and, in the driver, per "
            "thread (psutil; `popgrpo/telemetry/cpu.py`):",
            split_table(arms),
        ]
    loads = ", ".join(f"{x:.1f}" for x in r["loads"])
    return "\n\n".join(
        [
            f"`python -m benchmarks.round_overhead --repeats {r['repeats']}`, {r['started']} to {r['ended']}: "
            "`popgrpo.train.train` on the pop_grpo "
            f"preset{_with(r)}, K = {r['k']}, {r['per_actor']} member(s) per actor ({r['actors']} actor(s) on {r['cores']} "
            f"cores), {r['epochs']} epochs in rounds of T = {r['interval']} epochs of {r['steps']} steps; each mode "
            f"{r['repeats']} run(s), alternated; median (min–max). Ray workers at nice {r['niceness']}; load "
            f"average (1 min) at the start, after the rest measurement and after each run: {loads}. Training time: the actors' CPU seconds inside "
            "their members' epochs ÷ the cores they can use; wall: first train call to last report "
            "(module docstring). Ray as `benchmarks.common.local_ray` starts it: no dashboard, the workers' logs "
            "not forwarded to the driver (the Ray `popgrpo train` embeds has both; what the dashboard adds at "
            "rest: the call-cost table below).",
            *tables,
        ]
    )


def rest_note(r: dict) -> str:
    """What the run's Ray and actors take of the cores with nothing to do, measured before the runs."""
    rest = r["at_rest"]

    def share(keys: tuple[str, ...]) -> float:
        return sum(rest[k] for k in keys)

    return (
        f"At rest: the same Ray, evaluator actor and {r['actors']} member actor(s), started and left without a "
        f"call for {REST_S:.0f} s before the runs (`at_rest`), took {rest_share(r):.1%} of the {r['cores']} cores: "
        f"the member actors {share(('member actors, outside epochs',)):.1%}, Ray's own processes "
        f"{share(RAY_PROCESSES):.1%}, the driver {share(DRIVER_PARTS):.1%}; the machine's other processes "
        f"{rest['other processes']:.1%}. That much of the share outside member training is there before "
        'any round; the column "of it beyond …" is what is left: the rounds\' own cost (calls, merges, '
        "writes, waiting) and what running them adds to Ray's work."
    )


def _has_split(arms: dict[str, list[dict]]) -> bool:
    """Whether every run holds the split of the cores (runs saved before it was measured do not)."""
    return all(x.get("cpu_split") for runs in arms.values() for x in runs)


SPLIT_ROWS = {
    "members' epochs": "members' epochs (the training)",
    "member actors, outside epochs": "member actors outside their epochs (Ray's task handling, adopt, weights out)",
    "driver: writer": "driver: background writer thread (metrics, loggers, checkpoint)",
    "driver: main": "driver: main thread (round loop, selection, merge, eval, Ray calls)",
    "driver: other python": "driver: other Python threads (TensorBoard's event writers)",
    "driver: ray (native)": "driver: Ray's native threads (core worker, gRPC)",
    "driver: threads that ended": "driver: threads that ended in the span",
    "raylet": "raylet",
    "gcs": "GCS",
    "ray agents": "Ray's agents (log monitor, runtime-env and dashboard agents)",
    "other ray workers": "Ray's other workers (the evaluator actor, idle workers)",
    "other processes": "other processes on the machine",
    "idle cores": "idle cores",
    "unaccounted": "unaccounted (processes that started or ended in the span)",
}


def split_table(arms: dict[str, list[dict]]) -> str:
    """The rows of :data:`SPLIT_ROWS` per mode: median (min–max) share of the cores."""
    rows = []
    for key, name in SPLIT_ROWS.items():
        rows.append(
            [name, *(spread([x["cpu_split"][key] for x in runs], lambda v: f"{v:.1%}") for runs in arms.values())]
        )
    return md_table(["share of the cores", *arms], rows)


RAY_PROCESSES = ("raylet", "gcs", "ray agents", "other ray workers")
DRIVER_PARTS = tuple(f"driver: {kind}" for kind in (*DRIVER_THREADS, "threads that ended"))


def ray_floor(r: dict, label: str) -> float:
    """One mode's median share of the cores taken by Ray's own processes and its threads in the driver."""
    keys = (*RAY_PROCESSES, "driver: ray (native)")
    return statistics.median(sum(x["cpu_split"][k] for k in keys) for x in r["arms"][label])


def split_summary(r: dict, label: str) -> str:
    """One mode's cores outside the members' epochs in a sentence (medians)."""
    runs = r["arms"][label]

    def med(keys: tuple[str, ...]) -> float:
        return statistics.median(sum(x["cpu_split"][k] for k in keys) for x in runs)

    return (
        f"{label}: Ray's own processes {med(RAY_PROCESSES):.1%}, the member actors outside their epochs "
        f"{med(('member actors, outside epochs',)):.1%}, the driver {med(DRIVER_PARTS):.1%} (its background "
        f"writer {med(('driver: writer',)):.1%}, Ray's threads in it {med(('driver: ray (native)',)):.1%}), "
        f"idle cores {med(('idle cores',)):.1%}"
    )


def _with(r: dict) -> str:
    """The overrides every mode ran with, as the header says them."""
    extra = r.get("extra") or []
    return f" with {', '.join(f'`{o}`' for o in extra)}" if extra else ""


def _largest(runs: list[dict]) -> str:
    """The largest part of the driver's time outside training calls, per merge (median over runs)."""
    names = {
        "get_weights": "`get_weights`",
        "adopt": "`adopt`",
        "states": "states for the checkpoint",
        "handover": "hand-over to the writer",
        "driver": "selection, merge, eval",
    }
    per = {name: statistics.median(x["parts"][name] / max(x["merges"], 1) for x in runs) for name in names}
    name = max(per, key=lambda n: per[n])
    return f"driver's largest part: {names[name]}, {per[name] * 1e3:,.0f} ms per merge"


def headline_row(sizes: dict[int, dict]) -> str:
    """The summary table's row 3 (also written by the suite): each mode's median share at every
    size of training per merge (the preset first)."""

    def said(result: dict) -> str:
        text = " / ".join(f"{s:.1%}" for s in result["shares"].values())
        rest = rest_share(result)
        if rest is not None:
            text += " (" + " / ".join(f"{s - rest:.1%}" for s in result["shares"].values()) + " beyond Ray at rest)"
        return text

    factors = sorted(sizes)
    first = sizes[factors[0]]
    modes = " / ".join(first["shares"])
    shares = said(first) + (" at the preset" if len(factors) > 1 else "")
    for factor in factors[1:]:
        shares += f"; {said(sizes[factor])} with {factor}× the training per merge"
    ok = all(sizes[f]["outside_share"] <= TARGET for f in factors)
    return f"| 3 | round time outside member training ({modes}) | {shares} | ≤ {TARGET:.0%} | {'met' if ok else 'not met'} |"


TRANSPORT_HEADING = "#### Moving states through the object store (`popgrpo/runtime/transport.py`)"


def size_heading(factor: int) -> str:
    return f"#### The same with {factor}× the training per merge"


def _points(result: dict, label: str) -> tuple[float, float]:
    """One mode's (training, outside) seconds per merge: medians over its runs."""
    runs = result["arms"][label]
    training = statistics.median(x["members"] / max(x["merges"], 1) for x in runs)
    outside = statistics.median((x["window"] - x["members"]) / max(x["merges"], 1) for x in runs)
    return training, outside


def fixed_and_proportional(results: list[dict]) -> dict[str, tuple[float, float]]:
    """Per mode, ``(a, b)`` of the least-squares line ``outside = a + b · training`` (seconds per
    merge, each size's medians) through every size of training per merge: ``a`` the fixed part of a
    merge, ``b`` the part that grows with the training between merges."""
    import numpy as np

    out = {}
    for label in results[0]["arms"]:
        training, outside = zip(*(_points(result, label) for result in results), strict=True)
        b, a = np.polyfit(np.asarray(training), np.asarray(outside), 1) if len(set(training)) > 1 else (0.0, outside[0])
        out[label] = (float(a), float(b))
    return out


def predicted_share(a: float, b: float, training: float) -> float:
    """The share outside member training the line ``outside = a + b · training`` gives for
    ``training`` seconds of training per merge."""
    outside = a + b * training
    return outside / (outside + training)


def crossing(a: float, b: float, target: float = TARGET) -> float | None:
    """The training per merge (s) from which the line's share is at most ``target``: the ``t`` of
    ``(a + b·t) / (a + (1 + b)·t) = target``; 0 when it is already there, None when it never gets there."""
    if a <= 0:
        return 0.0 if b / (1 + b) <= target else None
    slope = target * (1 + b) - b
    return None if slope <= 0 else a * (1 - target) / slope


def fit_note(results: list[dict], factors: list[int]) -> str:
    """What the sizes say together: the fixed and the proportional part per mode, the share the
    line predicts at each measured size against the share measured, and the share as rounds grow
    long (``b / (1 + b)``)."""
    fits = fixed_and_proportional(results)
    limits = [b / (1 + b) for _, b in fits.values()]
    preset = [_points(results[0], label)[0] for label in fits]
    crossings = "; ".join(
        f"{label}: never (it tends to {b / (1 + b):.1%})"
        if (t := crossing(a, b)) is None
        else f"{label}: {t:.1f} s of training per merge, {t / p:.0f}× the preset's"
        for (label, (a, b)), p in zip(fits.items(), preset, strict=True)
    )
    parts = []
    for label, (a, b) in fits.items():
        checks = ", ".join(
            f"{factor}×: {predicted_share(a, b, _points(result, label)[0]):.1%} vs {result['shares'][label]:.1%}"
            for factor, result in zip(factors, results, strict=True)
        )
        parts.append(f"{label}: {a * 1e3:.0f} ms + {b:.1%} of the training, tending to {b / (1 + b):.1%} (line vs "
                     f"measured, {checks})")  # fmt: skip
    rest = [rest_share(result) for result in results]
    rest_said = (
        f" The run's Ray and actors at rest took {min(rest):.1%}–{max(rest):.1%} of the cores in these runs' "
        "measurements of it (`at_rest`): that much of the proportional part is there before any round."
        if all(x is not None for x in rest)
        else ""
    )
    last = results[-1]
    return (
        f"Outside member training per merge, as a least-squares line through the {len(results)} sizes (medians; "
        f"`outside = a + b · training`): {'; '.join(parts)}.{rest_said} So on this "
        f"{last['cores']}-core machine the share outside member training tends to "
        f"{min(limits):.1%}–{max(limits):.1%} as the rounds grow long; most of that limit is Ray and the idle "
        f"actors, not the rounds. The lines cross the {TARGET:.0%} target at {crossings}."
        + (
            f" Where those cores go, with {factors[-1]}× the training per merge (tables above; % of the cores): "
            + "; ".join(split_summary(last, label) for label in last["arms"])
            + ". Ray's own processes (raylet, GCS, agents, idle workers) and Ray's native threads in "
            "the driver run whatever popgrpo does: "
            + "; ".join(f"{label} {ray_floor(last, label):.1%}" for label in last["arms"])
            + " of the cores, before the actors' calls (Ray's task handling and popgrpo's adopt and "
            "weight calls, not split here) and the driver's round loop, writer and loggers."
            if _has_split(last["arms"])
            else ""
        )
    )


def plot(sizes: dict[int, dict], path: Path) -> None:
    """The share outside member training against the training per merge, per mode (median and
    min–max of the runs at each size), the least-squares line's prediction, the run's Ray and
    actors at rest and the 5% target: a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    results = list(sizes.values())
    fits = fixed_and_proportional(results)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    lo = min(_points(r, label)[0] for r in results for label in r["arms"])
    hi = max(_points(r, label)[0] for r in results for label in r["arms"])
    grid = np.geomspace(lo * 0.9, hi * 8, 200)
    for i, label in enumerate(results[0]["arms"]):
        colour = f"C{i}"
        xs, med, low, high = [], [], [], []
        for r in results:
            runs = r["arms"][label]
            shares = [x["outside_share"] for x in runs]
            xs.append(_points(r, label)[0] * 1e3)
            med.append(statistics.median(shares) * 100)
            low.append((statistics.median(shares) - min(shares)) * 100)
            high.append((max(shares) - statistics.median(shares)) * 100)
        ax.errorbar(xs, med, yerr=[low, high], fmt="o", color=colour, capsize=3, label=label)
        a, b = fits[label]
        ax.plot(grid * 1e3, [predicted_share(a, b, t) * 100 for t in grid], "-", color=colour, alpha=0.5, lw=1)
    rest = [x for x in (rest_share(r) for r in results) if x is not None]
    if rest:
        ax.axhspan(min(rest) * 100, max(rest) * 100, color="grey", alpha=0.25, label="Ray and actors at rest")
    ax.axhline(TARGET * 100, color="black", ls="--", lw=1, label=f"target {TARGET:.0%}")
    ax.set_xscale("log")
    ax.set_xlabel("members' training per merge, ms (actors' CPU ÷ cores)")
    ax.set_ylabel("wall time outside member training, %")
    last = results[-1]
    ax.set_title(
        f"Round overhead, pop_grpo K = {last['k']} on {last['cores']} cores: 1×, 4×, 16× the preset's training"
    )
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


FIGURE = Path(__file__).resolve().parent.parent / "docs" / "img" / "round_overhead.png"
CALL_COST_HEADING = "#### What one Ray call costs, against the budget (`benchmarks/ray_call_cost.py`)"


def section(sizes: dict[int, dict]) -> str:
    """Section 3's text: the preset's tables, then every larger size's, then the fit across sizes."""
    factors = sorted(sizes)
    text = markdown(sizes[factors[0]])
    for factor in factors[1:]:
        text += f"\n\n{size_heading(factor)}\n\n{markdown(sizes[factor])}"
    if len(factors) > 1:
        text += (
            "\n\n#### All sizes together\n\nThe shares against the training per merge as a figure: "
            f"`docs/img/{FIGURE.name}` (shown in docs/guides/scale.md)."
        )
        text += f"\n\n{fit_note([sizes[f] for f in factors], factors)}"
    return text


def write(path: Path, sizes: dict[int, dict]) -> None:
    """Section 3 of ``path`` (between its heading and section 4's) and its headline row, replaced."""
    text = section(sizes)
    from benchmarks import ray_call_cost, transport_cost

    moved = json.loads(transport_cost.DEFAULT_OUT.read_text()) if transport_cost.DEFAULT_OUT.is_file() else None
    if ray_call_cost.DEFAULT_OUT.is_file():  # the least a merge's calls cost, against the budget
        calls = json.loads(ray_call_cost.DEFAULT_OUT.read_text())
        overhead = {"sizes": {str(k): v for k, v in sizes.items()}}
        text += f"\n\n{CALL_COST_HEADING}\n\n{ray_call_cost.markdown(calls, overhead, moved)}"
    if moved is not None:  # how the states and weights of a round travel
        text += f"\n\n{TRANSPORT_HEADING}\n\n{transport_cost.markdown(moved)}"
    write_between(path, text, SECTION + "\n", "\n" + NEXT_SECTION)
    doc = path.read_text()
    path.write_text(HEADLINE.sub(lambda _: headline_row(sizes), doc, count=1))


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.round_overhead [--quick] [--repeats N] [--write]``: section 3, printed as
    Markdown: the preset, then (not with ``--quick``) each larger size of :data:`SIZES`."""
    import argparse

    from benchmarks.common import local_ray

    parser = argparse.ArgumentParser(prog="python -m benchmarks.round_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 short rounds, the members packed into one actor")
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode, alternated (default 1)")
    parser.add_argument("--write", type=Path, metavar="MD", help="replace section 3 and its headline row in MD")
    parser.add_argument(
        "--json", type=Path, metavar="JSON", help="save the results (default: benchmarks/data/round_overhead.json)"
    )
    parser.add_argument("--render", type=Path, metavar="JSON", help="the tables from a saved --json, run nothing")
    args = parser.parse_args(argv)
    if args.render:
        sizes = load_sizes(json.loads(args.render.read_text()))
    else:
        cfg = default_config(args.quick)
        factors = [1] if args.quick else sorted(SIZES)
        sizes = {}
        # As the suite starts Ray for this section: 3 × cores logical CPUs, at least one per member.
        with local_ray(num_cpus=max(3 * CORES, cfg.population.size)):
            for factor in factors:
                sizes[factor] = run(args.quick, CORES, args.repeats, extra=SIZES[factor], warm_up=not sizes)
                print(f"{factor}×: {' / '.join(f'{s:.1%}' for s in sizes[factor]['shares'].values())}", flush=True)
        json_path = args.json or DEFAULT_JSON
        json_path.write_text(json.dumps({"sizes": {str(k): v for k, v in sizes.items()}}, indent=1) + "\n")
    print(section(sizes))
    print(headline_row(sizes))
    if len(sizes) > 1 and (args.write or not args.render):
        plot(sizes, FIGURE)
    if args.write:
        write(args.write, sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
