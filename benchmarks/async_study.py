"""Asynchronous vs synchronous rounds at equal wall time under seeded stragglers, on the idea landscape.

    python -m benchmarks.async_study [--quick] [--out docs/benchmarks/async.md] [--data DIR] [--figure PNG] [--seeds N]

Every run is the ``pop_grpo`` preset (the collapse landscape of ``envs/landscape``) with
K = 8 members, one Ray actor each, on one embedded Ray, with seeded log-normal stragglers
(``population.straggler``: median ``scale_s`` = 1 s, σ = 1), so that a member's round is
mostly its delay, not its 10 epochs of compute. The arms: sync rounds, and async rounds with
(B, S) = (K/2, 1) and (2, 2) (``scheduler.order=arrival``: reports taken as they come, which is
what the wall time of a real run is). Every arm trains the same ``run.epochs`` per member;
runs go seed by seed and, within a seed, arm after arm (sync, async, async, sync, …), so the
load of a shared machine falls on every arm alike. Runs of one seed are paired: the same
initial weights, landscape and per-(member, round) delays.

**Equal wall time.** No run is cut: every call each member actor answers is logged (which
actor, when it started and when the driver had its answer), and a row of ``metrics.parquet``
(member k, epoch e) counts as reached at the time the call that trained it was answered.
The budget ``W`` is the wall time of the study's fastest run (from its first ``train`` call
to its last answer), so every run was still training at ``W``; each run is then judged on
what it had by ``W`` after its first call: member-epochs per second, the utilisation of its
member actors, the best reward, and the noise-free discovery summary
(:func:`popgrpo.research.study.discovery.trial_summary` on the rows reached by then).

**Utilisation.** A member actor is busy from the start of a ``train`` call to the driver's
receipt of its answer (its epochs, its straggler sleep, the call's latency); it is idle
otherwise: waiting at the barrier or for a merge's buffer, adopting a merge, and while the
driver selects, merges and writes. ``busy = compute + delay``, the delay part being the
seeded sleep at the end of each call (known from :func:`straggler_delay`).

**Equal epochs.** The same runs to their end: what the population reached after every member
trained ``run.epochs`` epochs, whatever the wall time; the cost of training from stale bases.

Writes ``--data``/async_study.json, the section between ``<!-- async-study:begin -->`` and
``<!-- async-study:end -->`` in ``--out`` and the figure ``--figure``; with ``--tag NAME``,
``async_study_NAME.json`` and the markers ``async-study-NAME`` (a second study beside the first). ``--quick`` is a smoke
run (K = 4, short rounds, one seed): its numbers say nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import local_ray, write_between
from popgrpo.markdown import md_table


def markers(tag: str = "") -> tuple[str, str]:
    """The comments around a study's section in ``--out``; ``tag`` tells several studies apart."""
    name = f"async-study-{tag}" if tag else "async-study"
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


ROOT = Path(__file__).resolve().parents[1]
OUTCOMES = ("best_reward", "best_quality", "best_expected", "peaks", "peak_fraction_mean")


# ---- the pure parts: intervals, utilisation, what was reached by a time ----------------------
@dataclass(frozen=True)
class Call:
    """One answered ``train`` call: actor ``actor`` trained ``epochs`` epochs of its round
    ``round_index`` from ``start`` to ``end`` (seconds, the driver's monotonic clock); the last
    ``delay`` seconds of it were its members' seeded straggler sleep."""

    actor: int
    round_index: int
    epochs: int
    start: float
    end: float
    delay: float = 0.0


def overlap(start: float, end: float, lo: float, hi: float) -> float:
    """Length of ``[start, end] ∩ [lo, hi]`` (0 when they do not meet)."""
    return max(0.0, min(end, hi) - max(start, lo))


def utilisation(calls: Sequence[Call], n_actors: int, t0: float, budget: float) -> dict[str, float]:
    """Shares of the actors' time in ``[t0, t0 + budget]``: ``busy`` (inside a train call),
    of it ``delay`` (the straggler sleep, the last ``delay`` seconds of a call) and ``compute``
    (the rest of the call: epochs and call latency), and ``idle`` = 1 − busy.

    Calls of one actor never overlap (an actor answers one call before the next is made), so
    the shares are sums of clipped intervals over ``n_actors · budget``.
    """
    if n_actors <= 0 or budget <= 0:
        raise ValueError("n_actors and budget must be positive")
    hi = t0 + budget
    busy = sum(overlap(c.start, c.end, t0, hi) for c in calls)
    delay = sum(overlap(c.end - c.delay, c.end, t0, hi) for c in calls)
    total = n_actors * budget
    return {"busy": busy / total, "delay": delay / total, "compute": (busy - delay) / total, "idle": 1 - busy / total}


def epochs_by(calls: Sequence[Call], deadline: float) -> int:
    """Member-epochs answered by ``deadline`` (each call trains ``epochs`` for each member of its actor: one here)."""
    return sum(c.epochs for c in calls if c.end <= deadline)


def reached_rows(calls: Sequence[Call], groups: Sequence[Sequence[int]], deadline: float) -> set[tuple[int, int]]:
    """The (member, round) pairs whose rows were answered by ``deadline``: an actor's round's
    rows belong to every member of the actor."""
    return {(k, c.round_index) for c in calls if c.end <= deadline for k in groups[c.actor]}


def round_of_epoch(epoch: int, interval: int) -> int:
    """The round an epoch (0-based) falls in, with rounds of ``interval`` epochs."""
    return epoch // interval


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN sd for fewer than two values); NaNs dropped."""
    xs = [float(v) for v in values if not math.isnan(float(v))]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else math.nan)


# ---- recording a real run ---------------------------------------------------------------------
@dataclass
class CallLog:
    """Every ``train`` call a :class:`~popgrpo.runtime.ray_executor.RayExecutor` has answered.

    Installed on an executor by :meth:`attach`: its deadline keeper (which every answered call
    reports to, with the call's duration) is wrapped to time the answers, and the two places
    that make train calls name the actor of each answer: the synchronous ``_call`` (its
    answers come in the order its result dict is filled) and the asynchronous ``wait_train``
    (its handle).
    """

    answers: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, epochs), answer order
    calls: list[Call] = field(default_factory=list)
    rounds: dict[int, int] = field(default_factory=dict)  # actor -> train calls answered

    def _add(self, actor: int, start: float, end: float, epochs: int, delay_of: Callable[[int, int], float]) -> None:
        r = self.rounds.get(actor, 0)
        self.rounds[actor] = r + 1
        self.calls.append(Call(actor, r, epochs, start, end, delay_of(actor, r)))

    def attach(self, executor: Any, delay_of: Callable[[int, int], float]) -> Any:
        log = self
        deadlines = executor._deadlines
        inner_answered = deadlines.answered

        def answered(method: str, seconds: float, n_epochs: int = 1) -> None:
            if method == "train":
                now = time.monotonic()
                log.answers.append((now - seconds, now, n_epochs))
            inner_answered(method, seconds, n_epochs)

        deadlines.answered = answered
        inner_call = executor._call

        def call(method: str, args_for: Any, groups: Any = None, replayable: bool = False) -> dict[int, Any]:
            before = len(log.answers)
            results = inner_call(method, args_for, groups, replayable)
            if method == "train":  # one answer per actor, in the order results were filled
                for g, (start, end, n) in zip(results, log.answers[before:], strict=True):
                    log._add(g, start, end, n, delay_of)
            return results

        executor._call = call
        inner_wait = executor.wait_train

        def wait_train(handles: list[Any]) -> tuple[Any, dict[int, list[dict]]]:
            handle, rows = inner_wait(handles)
            start, end, n = log.answers[-1]  # wait_train reports its answer just before returning
            log._add(handle[0], start, end, n, delay_of)
            return handle, rows

        executor.wait_train = wait_train
        return executor


# ---- the study ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    name: str
    mode: str
    buffer: int | None = None
    staleness: int | None = None

    def overrides(self) -> list[str]:
        if self.mode == "sync":
            return ["scheduler.mode=sync"]
        return [
            "scheduler.mode=async",
            f"scheduler.buffer={self.buffer}",
            f"scheduler.max_staleness={self.staleness}",
            "scheduler.order=arrival",
        ]


@dataclass(frozen=True)
class Design:
    members: int
    interval: int
    rounds: int
    scale_s: float
    sigma: float
    seeds: tuple[int, ...]
    arms: tuple[Arm, ...]


def design(quick: bool, n_seeds: int, scale_s: float = 1.0) -> Design:
    if quick:
        return Design(4, 2, 3, 0.2, 1.0, (0,), (Arm("sync", "sync"), Arm("async B=2 S=1", "async", 2, 1)))
    k = 8
    return Design(
        members=k,
        interval=10,
        rounds=8,
        scale_s=scale_s,
        sigma=1.0,
        seeds=tuple(range(n_seeds)),
        arms=(
            Arm("sync", "sync"),
            Arm(f"async B={k // 2} S=1", "async", k // 2, 1),
            Arm("async B=2 S=2", "async", 2, 2),
        ),
    )


def config_of(d: Design, arm: Arm, seed: int):
    from popgrpo.config import load_config, preset_path

    return load_config(
        preset_path("pop_grpo"),
        [
            f"population.size={d.members}",
            "population.members_per_actor=1",
            f"scheduler.interval_epochs={d.interval}",
            f"run.epochs={d.rounds * d.interval}",
            f"population.straggler.scale_s={d.scale_s}",
            f"population.straggler.sigma={d.sigma}",
            "run.loggers=[]",
            f"run.seed={seed}",
            *arm.overrides(),
        ],
    )


def run_one(d: Design, arm: Arm, seed: int) -> dict[str, Any]:
    """Train one arm for one seed on the running Ray; its calls, metrics and wall time."""
    import pandas as pd

    from popgrpo.algorithms.async_rounds import straggler_delay
    from popgrpo.runtime.ray_executor import RayExecutor
    from popgrpo.train import train

    cfg = config_of(d, arm, seed)
    log = CallLog()
    holder: dict[str, Any] = {}

    def delay_of(actor: int, r: int) -> float:
        groups = holder["executor"].groups
        return sum(straggler_delay(seed, k, r, d.scale_s, d.sigma) for k in groups[actor])

    def make(c: Any, run_dir: Path) -> Any:
        holder["executor"] = log.attach(RayExecutor(c, run_dir=run_dir), delay_of)
        return holder["executor"]

    with tempfile.TemporaryDirectory(prefix="pgasync-") as tmp:
        started = time.monotonic()
        train(cfg, Path(tmp) / "run", executor_factory=make, progress=False)
        total = time.monotonic() - started
        metrics = pd.read_parquet(Path(tmp) / "run" / "metrics.parquet")
    groups = [list(g) for g in holder["executor"].groups]
    return {"arm": arm.name, "seed": seed, "calls": log.calls, "groups": groups, "metrics": metrics, "run_s": total}


def summarise(run: dict[str, Any], budget: float | None, interval: int, reach: frozenset[int]) -> dict[str, Any]:
    """A run's numbers by ``budget`` seconds after its first train call (None: to its end)."""
    from popgrpo.research.study.discovery import trial_summary

    calls: list[Call] = run["calls"]
    t0 = min(c.start for c in calls)
    span = max(c.end for c in calls) - t0
    window = span if budget is None else budget
    deadline = t0 + window
    reached = reached_rows(calls, run["groups"], deadline)
    m = run["metrics"]
    keep = [(int(k), round_of_epoch(int(e), interval)) in reached for k, e in zip(m["member"], m["epoch"], strict=True)]
    frame = m[keep]
    found, _ = trial_summary(frame, reach)
    epochs = epochs_by(calls, deadline)
    return {
        "window_s": window,
        "member_epochs": epochs,
        "epochs_per_s": epochs / window,
        **{f"util_{k}": v for k, v in utilisation(calls, len(run["groups"]), t0, window).items()},
        "best_reward": float(frame["reward_max"].max()),
        **{k: float(found[k]) for k in OUTCOMES if k != "best_reward"},
    }


def compare(rows: list[dict[str, Any]], arms: Sequence[str], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per (async arm, key): mean ± sd of each arm and the paired difference (arm − sync) by seed,
    with its percentile bootstrap 95% CI and paired t-test p."""
    from popgrpo.research.study.stats import bootstrap_ci, paired_test

    by = {(r["arm"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    out = []
    for arm in arms[1:]:
        for key in keys:
            a = [by[arm, s][key] for s in seeds]
            b = [by[arms[0], s][key] for s in seeds]
            test = paired_test(a, b)
            lo, hi = bootstrap_ci(a, b) if len(seeds) > 1 else (math.nan, math.nan)
            out.append(
                {
                    "arm": arm,
                    "key": key,
                    "arm_mean_sd": mean_sd(a),
                    "sync_mean_sd": mean_sd(b),
                    "diff": test.mean,
                    "ci": [lo, hi],
                    "t_p": test.t_p,
                    "ratio": statistics.fmean(a) / statistics.fmean(b) if statistics.fmean(b) else math.nan,
                }
            )
    return out


def _ms(pair: Sequence[float], fmt: str) -> str:
    mean, sd = pair
    return f"{format(mean, fmt)} ± {format(sd, fmt)}" if not math.isnan(sd) else format(mean, fmt)


def markdown(result: dict[str, Any], command: str, section: str = "8", data: str = "async_study.json") -> str:
    d = result["design"]
    arms = [a["name"] for a in d["arms"]]
    rows_t, rows_e = result["at_budget"], result["at_epochs"]

    def table(rows: list[dict[str, Any]], keys: list[tuple[str, str, str]]) -> str:
        body = []
        for arm in arms:
            mine = [r for r in rows if r["arm"] == arm]
            body.append([arm, *(_ms(mean_sd([r[k] for r in mine]), fmt) for k, _, fmt in keys)])
        return md_table(["arm", *(label for _, label, _ in keys)], body)

    def diffs(cmp: list[dict[str, Any]], keys: list[tuple[str, str, str]]) -> str:
        body = []
        for c in cmp:
            label, fmt = next((lab, f) for k, lab, f in keys if k == c["key"])
            body.append(
                [
                    c["arm"],
                    label,
                    f"{format(c['diff'], fmt)} [{format(c['ci'][0], fmt)}, {format(c['ci'][1], fmt)}]",
                    f"{c['ratio']:.2f}×",
                    "–" if math.isnan(c["t_p"]) else f"{c['t_p']:.3f}",
                ]
            )
        return md_table(["arm", "measure", "arm − sync, mean [95% CI]", "ratio of means", "paired t p"], body)

    speed = [
        ("epochs_per_s", "member-epochs / s", ".2f"),
        ("util_busy", "busy", ".1%"),
        ("util_delay", "of it straggler sleep", ".1%"),
        ("util_idle", "idle", ".1%"),
    ]
    reach = [
        ("best_reward", "best reward", ".3f"),
        ("best_quality", "best Q", ".3f"),
        ("best_expected", "best E[R]", ".3f"),
        ("peaks", "peaks", ".2f"),
        ("peak_fraction_mean", "peak fraction", ".3f"),
    ]
    n = len(d["seeds"])
    per_call = md_table(
        ["arm", "compute s per call, median (epochs and call latency)", "straggler sleep s per call, median"],
        [
            [
                arm,
                f"{statistics.median(c['end'] - c['start'] - c['delay'] for r in mine for c in r['calls']):.2f}",
                f"{statistics.median(c['delay'] for r in mine for c in r['calls']):.2f}",
            ]
            for arm in arms
            if (mine := [r for r in result["calls"] if r["arm"] == arm])
        ],
    )
    return "\n".join(
        [
            f"### {section}. Async vs sync rounds at equal wall time under stragglers of median "
            f"{d['scale_s']:g} s (issue 28)",
            "",
            f"`{command}` (module docstring: the method). pop_grpo preset on the collapse landscape, "
            f"K = {d['members']} members (one Ray actor each), rounds of T = {d['interval']} epochs, "
            f"{d['rounds'] * d['interval']} epochs per member, seeded log-normal stragglers "
            f"(median {d['scale_s']:g} s, σ = {d['sigma']:g}) slept by each member after its epochs; "
            f"{n} seeds per arm, paired by seed (same weights, landscape and delays), arms alternated "
            f"within each seed. Mean ± sd over seeds; differences are arm − sync by seed with a "
            f"percentile bootstrap 95% CI (`popgrpo.research.study.stats`; with {n} seeds the CI is coarse).",
            "",
            f"Machine: {result['machine']}. What a member's call spent its time on (every call of every seed):",
            "",
            per_call,
            "",
            f"**Equal wall time**: a budget of {result['budget_s']:.1f} s after each run's first train call "
            "(the fastest run's whole length, so every run was still training); a metrics row counts "
            "once the call that trained it was answered. No run was cut: the same runs give the "
            "equal-epochs numbers below.",
            "",
            table(rows_t, speed + reach),
            "",
            diffs(result["compare_budget"], speed + reach),
            "",
            "**Equal epochs** (each run to its end; what staleness costs per epoch trained):",
            "",
            table(rows_e, [("window_s", "wall s", ".1f"), *reach]),
            "",
            diffs(result["compare_epochs"], [("window_s", "wall s", ".1f"), *reach]),
            "",
            f"Data: `benchmarks/data/{data}`; figure: `{result['figure']}` (shown in docs/guides/async.md).",
        ]
    )


def figure(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a["name"] for a in result["design"]["arms"]]
    panels = [
        ("at_budget", "epochs_per_s", "member-epochs per second by the budget"),
        ("at_budget", "util_busy", "member utilisation by the budget"),
        ("at_budget", "best_expected", "best expected reward E[R] by the budget"),
        ("at_epochs", "best_expected", "best E[R] at equal epochs"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(14, 3.6))
    for ax, (part, key, title) in zip(axes, panels, strict=True):
        for i, arm in enumerate(arms):
            values = [r[key] for r in result[part] if r["arm"] == arm]
            ax.scatter([i] * len(values), values, color="tab:red" if i == 0 else "tab:blue", alpha=0.6)
            ax.errorbar([i + 0.15], [statistics.fmean(values)], yerr=[[mean_sd(values)[1] or 0]], fmt="k_", capsize=4)
        ax.set_xticks(range(len(arms)), arms, rotation=15, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"K = {result['design']['members']}, stragglers log-normal (median {result['design']['scale_s']:g} s, "
        f"σ = {result['design']['sigma']:g}), budget {result['budget_s']:.1f} s; dots: seeds, bars: mean ± sd",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_study(d: Design, progress: Callable[[str], None] = print) -> dict[str, Any]:
    from popgrpo.config import load_config, preset_path
    from popgrpo.envs import make_env
    from popgrpo.research.study.discovery import reachable

    env = make_env(load_config(preset_path("pop_grpo")).env)
    reach = reachable(env, env.peak_centres)
    runs = []
    with local_ray(num_cpus=max(os.cpu_count() or 1, d.members), prefix="pgas-"):
        for seed in d.seeds:
            for arm in d.arms:
                run = run_one(d, arm, seed)
                span = max(c.end for c in run["calls"]) - min(c.start for c in run["calls"])
                progress(f"seed {seed} {arm.name}: {span:.1f} s training, {run['run_s']:.1f} s in all")
                runs.append(run)
    spans = [max(c.end for c in r["calls"]) - min(c.start for c in r["calls"]) for r in runs]
    budget = min(spans)
    names = [a.name for a in d.arms]
    at_budget = [{"arm": r["arm"], "seed": r["seed"], **summarise(r, budget, d.interval, reach)} for r in runs]
    at_epochs = [{"arm": r["arm"], "seed": r["seed"], **summarise(r, None, d.interval, reach)} for r in runs]
    speed = ["epochs_per_s", "util_busy", "util_delay", "util_idle"]
    return {
        "design": {**asdict(d), "arms": [asdict(a) for a in d.arms]},
        "reachable_peaks": len(reach),
        "budget_s": budget,
        "at_budget": at_budget,
        "at_epochs": at_epochs,
        "compare_budget": compare(at_budget, names, [*speed, *OUTCOMES]),
        "compare_epochs": compare(at_epochs, names, ["window_s", *OUTCOMES]),
        "calls": [
            {"arm": r["arm"], "seed": r["seed"], "calls": [asdict(c) for c in r["calls"]], "run_s": r["run_s"]}
            for r in runs
        ],
    }


def write_region(path: Path, region: str, tag: str = "") -> None:
    write_between(path, region, *markers(tag))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 4, short rounds, one seed: a smoke run")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm (default 3)")
    parser.add_argument("--scale-s", type=float, default=1.0, help="median straggler delay, seconds (default 1)")
    parser.add_argument(
        "--render", action="store_true", help="no runs: rewrite the section and the figure from --data's JSON"
    )
    parser.add_argument("--tag", default="", help="name of a second study beside the first (its markers and JSON)")
    parser.add_argument("--section", default="8", help="the section's number in --out (default 8)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "async.md")
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "async_study.png")
    parser.add_argument(
        "--machine",
        default=f"{os.cpu_count()} cores",
        help="how the machine was shared while the study ran (printed in the report)",
    )
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.scale_s <= 0:
        parser.error("--seeds must be at least 1 and --scale-s positive")
    if args.tag and not args.tag.replace("_", "").isalnum():
        parser.error(f"--tag must be letters, digits and _, got {args.tag!r}")
    data = args.data / (f"async_study_{args.tag}.json" if args.tag else "async_study.json")
    if args.render:
        if not data.is_file():
            parser.error(f"--render: no {data}")
        result = json.loads(data.read_text())
        figure(result, args.figure)
        write_region(args.out, markdown(result, result["command"], args.section, data.name), args.tag)
        print(f"wrote {args.out}, {args.figure}")
        return 0
    # Ray's workers start at nice 15 unless told otherwise: give them this process's niceness,
    # so that members and driver compete for the cores on the same terms.
    os.environ.setdefault("RAY_worker_niceness", str(os.nice(0)))
    d = design(args.quick, args.seeds, args.scale_s)
    result = run_study(d)
    result["machine"] = args.machine
    try:
        result["figure"] = str(args.figure.resolve().relative_to(ROOT))
    except ValueError:
        result["figure"] = str(args.figure)
    result["command"] = "python -m benchmarks.async_study" + (
        " --quick" if args.quick else f" --seeds {args.seeds} --scale-s {args.scale_s:g}"
    )
    args.data.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps(result, indent=1, default=float) + "\n")
    figure(result, args.figure)
    write_region(args.out, markdown(result, result["command"], args.section, data.name), args.tag)
    print(f"wrote {args.out}, {data}, {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
