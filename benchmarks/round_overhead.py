"""Section 3: the share of a Pop-GRPO round spent outside member training, at the default config.

A real run (:func:`popgrpo.train.train`, pop_grpo preset: K = 5, one member per actor,
T = 10 epochs per round) goes through :class:`TimedExecutor`, which only timestamps the calls
the round loop makes: ``train`` (the actors' epochs), ``get_weights`` (the top-M fetch),
``adopt`` (``ray.put`` of the soup, broadcast, perturbation) and ``snapshot`` (member and
archive states for the checkpoint). A round runs from one ``train`` call to the next, so it
also holds what the driver does in between: selection, the soup, the held-out evaluation of
the merged model, writing metrics, lineage and the checkpoint, and logging the round
(``run.loggers``: TensorBoard by default), which is timed as a part of its own. The first round
(first calls) and the last (no merge) are not counted.

The members' own training is the CPU time the actors' threads spent inside the members'
epochs in that round (``MemberGroup.train_cpu_seconds``), summed over actors and spread over
the cores they can use: ``Σ CPU s / min(cores, actors)``. Measured in the actors, on the same
loaded machine, it already holds what running next to each other costs the members (shared
caches, a busier machine); what is left of the round is outside member training: Ray's own
processes and calls, cores left idle, the round's driver work, and per-step archive round
trips where there are any (a shared archive, or Redis write-through; the default private
archives live in the member actors and make none). The same round in this process, by the
in-process executor, is shown beside it.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time

from benchmarks.common import md_table, met
from popgrpo.config import Config, load_config, preset_path

CORES = os.cpu_count() or 1
TARGET = 0.05
TIMED = ("train", "get_weights", "adopt", "snapshot")
PARTS = (*TIMED, "logging")  # logging: the driver's run.loggers work (timed in _train)


class TimedExecutor:
    """Wraps an executor; records ``(round, call, seconds)`` for the calls in :data:`TIMED`."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.round_starts: list[float] = []
        self.calls: list[tuple[int, str, float]] = []
        self.train_cpu: list[float] = []  # per round, summed over the actors (Ray only)

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if name not in TIMED:
            return attr
        timed = self.time_part(name, attr)
        if name != "train":
            return timed

        def train(*args, **kwargs):  # a round starts with its train call
            self.round_starts.append(time.perf_counter())
            return timed(*args, **kwargs)

        return train

    def time_part(self, name: str, fn):
        """``fn`` wrapped to record its seconds as part ``name`` of the current round."""

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append((len(self.round_starts) - 1, name, time.perf_counter() - start))

        return timed

    def close(self) -> None:
        self.round_starts.append(time.perf_counter())  # the end of the last round
        actors = getattr(self.inner, "_actors", None)
        if actors:  # Ray: the CPU time each actor's members spent training, per train call
            import ray

            self.train_cpu = [
                sum(per) for per in zip(*ray.get([a.train_cpu_seconds.remote() for a in actors]), strict=True)
            ]
        self.inner.close()

    def per_round(self, rounds: list[int]) -> dict[str, float]:
        """Mean seconds per round of each timed call, of ``other`` (the rest) and ``round``."""
        out = {}
        for name in PARTS:
            out[name] = statistics.mean(sum(s for r, n, s in self.calls if r == i and n == name) for i in rounds)
        out["round"] = statistics.mean(self.round_starts[i + 1] - self.round_starts[i] for i in rounds)
        out["other"] = out["round"] - sum(out[name] for name in PARTS)
        return out


def default_config(quick: bool) -> tuple[Config, list[int]]:
    """The pop_grpo preset for 4 rounds; the rounds measured.

    Quick: 3 rounds of T = 2 epochs, the 5 members packed into one actor (each actor's
    start-up is a few CPU-seconds); the numbers then say little, the full run's do.
    """
    overrides = ["run.epochs=40"]
    if quick:
        overrides = ["run.epochs=6", "scheduler.interval_epochs=2", "population.members_per_actor=5"]
    cfg = load_config(preset_path("pop_grpo"), overrides)
    n_rounds = cfg.run.epochs // cfg.scheduler.interval_epochs
    return cfg, list(range(1, n_rounds - 1))


def _train(cfg: Config, factory) -> TimedExecutor:
    """One run through :class:`TimedExecutor`; the driver's logging (``run.loggers``: the archive
    heatmaps and every logger's ``log_round``) is timed as the part ``logging``."""
    from unittest import mock

    import popgrpo.train as train_module

    holder = {}

    def make(config, run_dir):
        holder["executor"] = TimedExecutor(factory(config, run_dir))
        return holder["executor"]

    def logging_part(fn):  # made before the executor exists: looked up at call time
        return lambda *a, **kw: holder["executor"].time_part("logging", fn)(*a, **kw)

    original_make_loggers = train_module.make_loggers

    def make_loggers(*args, **kwargs):
        loggers = original_make_loggers(*args, **kwargs)
        loggers.log_round = logging_part(loggers.log_round)
        return loggers

    run_dir = tempfile.mkdtemp(prefix="pgb-round-", dir="/tmp")
    try:
        with (
            mock.patch.object(train_module, "make_loggers", make_loggers),
            mock.patch.object(train_module, "archive_heatmaps", logging_part(train_module.archive_heatmaps)),
        ):
            train_module.train(cfg, os.path.join(run_dir, "run"), executor_factory=make, progress=False)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return holder["executor"]


def run(quick: bool = False, cores: int = CORES) -> dict:
    """Needs a connected single-node Ray with at least ``population.size`` logical CPUs."""
    from popgrpo.runtime.actors import archives_in_groups
    from popgrpo.runtime.executor import LocalExecutor
    from popgrpo.runtime.ray_executor import RayExecutor

    cfg, rounds = default_config(quick)
    remote = _train(cfg, lambda c, d: RayExecutor(c, run_dir=d))
    local = _train(cfg, lambda c, d: LocalExecutor(c))
    actors = math.ceil(cfg.population.size / cfg.population.members_per_actor)
    ray_parts, local_parts = remote.per_round(rounds), local.per_round(rounds)
    members = statistics.mean(remote.train_cpu[i] for i in rounds) / min(cores, actors)
    return {
        "k": cfg.population.size,
        "actors": actors,
        "per_actor": cfg.population.members_per_actor,
        "interval": cfg.scheduler.interval_epochs,
        "steps": cfg.grpo.steps_per_epoch,
        "rounds": rounds,
        "cores": cores,
        "ray": ray_parts,
        "local": local_parts,
        "members": members,
        "outside_share": 1 - members / ray_parts["round"],
        # Per round: one call per step and one for the epoch's stats, per member; none when the
        # private archives live in the member actors.
        "archive_calls": 0
        if archives_in_groups(cfg)
        else cfg.population.size * cfg.scheduler.interval_epochs * (cfg.grpo.steps_per_epoch + 1),
    }


def markdown(r: dict) -> str:
    ray_p, local_p, members = r["ray"], r["local"], r["members"]
    share = r["outside_share"]
    in_train = ray_p["train"] - members

    def ms(x: float) -> str:
        return f"{x * 1e3:,.0f}"

    def pct(x: float, of: float) -> str:
        return f"{x / of:.1%}"

    rows = [
        [
            f"members' own training (the actors' CPU s in their epochs ÷ {min(r['cores'], r['actors'])} core(s))",
            ms(members),
            pct(members, ray_p["round"]),
            ms(local_p["train"]),
            pct(local_p["train"], local_p["round"]),
        ],
        [
            (
                f"rest of the `train` call: {r['archive_calls']} archive round trips, Ray's processes and calls, idle cores"
                if r["archive_calls"]
                else "rest of the `train` call: Ray's processes and calls, idle cores (no archive calls: "
                "private archives in the member actors)"
            ),
            ms(in_train),
            pct(in_train, ray_p["round"]),
            "—",
            "—",
        ],
        ["`get_weights` (top-M fetch)", ms(ray_p["get_weights"]), pct(ray_p["get_weights"], ray_p["round"]),
         ms(local_p["get_weights"]), pct(local_p["get_weights"], local_p["round"])],
        ["`adopt` (`ray.put` soup, broadcast, perturb)", ms(ray_p["adopt"]), pct(ray_p["adopt"], ray_p["round"]),
         ms(local_p["adopt"]), pct(local_p["adopt"], local_p["round"])],
        ["`snapshot` (member + archive states)", ms(ray_p["snapshot"]), pct(ray_p["snapshot"], ray_p["round"]),
         ms(local_p["snapshot"]), pct(local_p["snapshot"], local_p["round"])],
        ["driver: `run.loggers` (TensorBoard scalars, histograms, archive heatmaps)", ms(ray_p["logging"]),
         pct(ray_p["logging"], ray_p["round"]), ms(local_p["logging"]), pct(local_p["logging"], local_p["round"])],
        ["driver: selection, soup, held-out eval, metrics/lineage/checkpoint files", ms(ray_p["other"]),
         pct(ray_p["other"], ray_p["round"]), ms(local_p["other"]), pct(local_p["other"], local_p["round"])],
        ["**whole round**", ms(ray_p["round"]), "100%", ms(local_p["round"]), "100%"],
    ]  # fmt: skip
    breakdown = md_table(["part of a round", "Ray ms", "share", "in-process ms", "share"], rows)
    biggest = max(
        [("the rest of the train call", in_train)]
        + [(f"`{n}`", ray_p[n]) for n in ("get_weights", "adopt", "snapshot")]
        + [("the driver's logging", ray_p["logging"]), ("the driver's own work", ray_p["other"])],
        key=lambda kv: kv[1],
    )
    summary = md_table(
        ["executor", "round ms", "outside member training", "target", "status"],
        [
            [
                f"Ray, K = {r['k']} ({r['actors']} actor(s))",
                ms(ray_p["round"]),
                f"{share:.1%}",
                f"≤ {TARGET:.0%}",
                met(share <= TARGET, f"largest part: {biggest[0]}, {biggest[1] * 1e3:,.0f} ms per round"),
            ],
            [
                "in-process (same round, for comparison)",
                ms(local_p["round"]),
                f"{1 - local_p['train'] / local_p['round']:.1%}",
                "",
                "",
            ],
        ],
    )
    rounds = ", ".join(str(i) for i in r["rounds"])
    return "\n\n".join(
        [
            f"`popgrpo.train.train` on the pop_grpo preset: K = {r['k']}, {r['per_actor']} member(s) per actor, "
            f"T = {r['interval']} epochs of {r['steps']} steps per round; mean of round(s) {rounds} (the first and "
            f"the last are not counted). {r['actors']} actor(s) on {r['cores']} cores"
            + (", as `popgrpo train` runs this preset here." if r["per_actor"] == 1 else " (quick mode: packed)."),
            summary,
            breakdown,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.round_overhead [--quick]``: section 3 alone, printed as Markdown."""
    import argparse

    from benchmarks.common import local_ray

    parser = argparse.ArgumentParser(prog="python -m benchmarks.round_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 short rounds, the members packed into one actor")
    args = parser.parse_args(argv)
    cfg, _ = default_config(args.quick)
    # As the suite starts Ray for this section: 3 × cores logical CPUs, at least one per member.
    with local_ray(num_cpus=max(3 * CORES, cfg.population.size)):
        result = run(args.quick, CORES)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
