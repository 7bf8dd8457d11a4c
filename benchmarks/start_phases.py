"""How long a run takes to start, phase by phase; how long a lost member actor takes to be replaced;
and how long ``make run`` takes to begin and to finish, two trees side by side.

``python -m benchmarks.start_phases [--quick] [--members 5,16,64] [--repeats 2] [--before TREE] [--json PATH] [--write BENCHMARKS.md]``
``python -m benchmarks.start_phases --e2e BEFORE_TREE AFTER_TREE [--order ABBA] --json PATH``
``python -m benchmarks.start_phases --render PHASES.json [E2E.json] --write BENCHMARKS.md``

**Phases** (each K in a fresh process, ``--repeats`` times, the default preset ``pop_grpo`` with
``population.size=K`` on an embedded Ray started as ``popgrpo train`` starts one, dashboard included):

* *Ray start*: :func:`~popgrpo.runtime.cluster.start_local_ray`.
* *executor built*: :class:`~popgrpo.runtime.ray_executor.RayExecutor` from its call to its return
  (every member actor constructed and answering, the evaluator actor sent off).
* per member actor (:meth:`~popgrpo.runtime.actors.MemberGroup.start_times`), counted from when the
  executor began: *process* (its worker process started; 0 for a worker Ray had started before),
  *Ray worker* (process start to the first popgrpo import: Ray's own worker start-up), *imports*
  (popgrpo, torch and what the actor class needs, up to its constructor), *constructor* (policy,
  optimiser, archive, metrics), and *first epoch* (the first ``train`` call of one epoch, in the actor).
* *floor*: as many bare actors (one CPU each, as members reserve) that import torch and do nothing,
  on a Ray of their own started the same way, from their creation to all answering.
* *restart*: after one epoch, member actor 0's process is killed (SIGKILL); the next ``train`` call
  sees the loss, replaces the actor and trains. ``replaced in``: the executor's own measure (its
  ``member_actor_restarted`` event: from the loss seen to the new actor brought to where the lost one
  was); ``train call``: the whole call's wall time. Against it, *a fresh actor alone*: one more
  member actor like actor 0, created on the idle cluster after that, to its first answer.

With ``--before TREE`` each K also runs with that checkout's popgrpo (first on ``PYTHONPATH``), the
two side by side (AB, then BA, …), sharing one floor measurement; a tree whose member actors do not
tell their phases gets its totals only.

K = 64 packs 4 members per actor (16 actors): 64 processes of torch do not fit this machine's 24 GiB.

**make run** (``--e2e``): ``python -m popgrpo train`` (the default preset on an embedded Ray) run in
each tree in the order given (``ABBA``: before, after, after, before), with that tree first on
``PYTHONPATH``; from each run's start-up lines the seconds at "Ray is up" and "round 0 begins" (since
the process started), and the whole run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import local_ray, write_between
from popgrpo.markdown import md_table

BEGIN, END = "<!-- start-phases:begin -->", "<!-- start-phases:end -->"
PHASES = ("process", "ray_worker", "imports", "constructor")
REPO = Path(__file__).resolve().parents[1]


def _per_actor() -> dict[int, int]:
    return {64: 4}


def _child_executor(k: int, per_actor: int) -> dict[str, Any]:
    """One K: Ray's start, the executor's construction with each actor's phases, the first epoch,
    then one member actor killed and replaced."""
    import ray

    from popgrpo.config import load_config, preset_path
    from popgrpo.runtime.ray_executor import RayExecutor

    config = load_config(preset_path("pop_grpo"), [f"population.size={k}", f"population.members_per_actor={per_actor}"])
    actors = -(-k // per_actor)
    started = time.time()
    with local_ray(embedded_cpus(actors, config.population.resources.num_cpus), prefix="pgstart-", as_train=True):
        ray_start = time.time() - started
        with tempfile.TemporaryDirectory(prefix="pgstart-run-") as run_dir:
            begun = time.time()
            executor = RayExecutor(config, run_dir, count_epochs=True)
            built = time.time() - begun
            try:
                # A tree before MemberGroup.start_times has no phases to tell: only its totals are measured.
                timed = hasattr(executor._actors[0], "start_times")
                times = ray.get([a.start_times.remote() for a in executor._actors]) if timed else []
                t0 = time.time()
                executor.train(1, 0)
                first_epoch = time.time() - t0
                firsts = (
                    [t["first_train_s"] for t in ray.get([a.start_times.remote() for a in executor._actors])]
                    if timed
                    else []
                )
                pid = ray.get(executor._actors[0].pid.remote())
                os.kill(pid, signal.SIGKILL)
                t0 = time.time()
                executor.train(1, 1)
                restart_call = time.time() - t0
                restarted = [e for e in executor.events if e["event"] == "member_actor_restarted"]
                fresh = _fresh_actor_s(executor)
            finally:
                executor.close()
    phases = (
        {
            "process": [max(0.0, t["process"] - begun) for t in times],
            "ray_worker": [t["import_started"] - max(t["process"], begun) for t in times],
            "imports": [t["init_started"] - t["import_started"] for t in times],
            "constructor": [t["init_ended"] - t["init_started"] for t in times],
        }
        if times
        else None
    )
    return {
        "k": k,
        "actors": actors,
        "members_per_actor": per_actor,
        "ray_start_s": ray_start,
        "executor_s": built,
        "phases": phases,
        "ready_s": [t["init_ended"] - begun for t in times],
        "first_epoch_call_s": first_epoch,
        "first_epoch_s": firsts,
        "restart_call_s": restart_call,
        "replaced_in_s": restarted[0].get("seconds") if restarted else None,
        "fresh_actor_s": fresh,
        "restarts": len(restarted),
    }


def _fresh_actor_s(executor: Any) -> float:
    """Seconds from creating one more member actor like actor 0 (its members, its own archives,
    no name) to its first answer, on the idle cluster after training: what a fresh actor's
    start costs, to hold a restart against."""
    import ray

    from popgrpo.runtime.actors import MemberGroup

    t0 = time.time()
    actor = MemberGroup.remote(executor._config_json, list(executor._groups[0]), None, "start-phases-fresh")
    ray.get(actor.placement.remote())
    seconds = time.time() - t0
    ray.kill(actor)
    return seconds


def _child_floor(n_actors: int) -> dict[str, Any]:
    """``n_actors`` bare actors that import torch, on a Ray started as for a run."""
    import ray

    @ray.remote(num_cpus=1)
    class Bare:
        def __init__(self) -> None:
            import torch  # noqa: F401

        def ready(self) -> bool:
            return True

    with local_ray(embedded_cpus(n_actors, 1.0), prefix="pgfloor-", as_train=True):
        t0 = time.time()
        actors = [Bare.remote() for _ in range(n_actors)]
        ray.get([a.ready.remote() for a in actors])
        return {"actors": n_actors, "floor_s": time.time() - t0}


def embedded_cpus(n_actors: int, cpus_each: float) -> int:
    """The logical CPUs of the embedded Ray ``popgrpo train`` starts for ``n_actors`` member actors
    (:func:`popgrpo.runtime.cluster.embedded_cpus`, here too for a tree that predates it)."""
    try:
        from popgrpo.runtime.cluster import embedded_cpus as of_tree
    except ImportError:
        return max(os.cpu_count() or 1, -(-int(n_actors * cpus_each * 1000) // 1000))
    return of_tree(n_actors, cpus_each)


def _run_child(kind: str, *args: str, tree: Path = REPO) -> dict[str, Any]:
    """One measurement in a fresh interpreter, with ``tree``'s popgrpo (first on ``PYTHONPATH``)."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind, *args],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {kind} {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(members: list[int], repeats: int, before: Path | None = None) -> dict[str, Any]:
    """Each K ``repeats`` times in fresh processes, with the floor; with ``before``, that tree's run
    of each K beside this one's, in the order AB, BA, AB… (A: before, B: this tree)."""
    trees = {"A": before, "B": REPO} if before is not None else {"B": REPO}
    runs = []
    for repeat in range(repeats):
        for k in members:
            per_actor = _per_actor().get(k, 1)
            order = "".join(trees) if repeat % 2 == 0 else "".join(reversed(list(trees)))
            floor = None
            for letter in order:
                result = _run_child("executor", str(k), str(per_actor), tree=trees[letter])
                if floor is None:
                    floor = _run_child("floor", str(result["actors"]))["floor_s"]
                result.update(floor=floor, repeat=repeat, tree=letter)
                runs.append(result)
                print(_row(result), file=sys.stderr, flush=True)
    labels = {letter: _tree_of(path) for letter, path in trees.items()}
    return {
        "tree": labels["B"].split()[0],
        "trees": labels,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": runs,
    }


def _row(r: dict[str, Any]) -> str:
    return (
        f"{r.get('tree', 'B')} K={r['k']} actors={r['actors']} ray={r['ray_start_s']:.1f}s executor={r['executor_s']:.1f}s "
        f"floor={r['floor']:.1f}s restart={r['restart_call_s']:.1f}s replaced_in={r['replaced_in_s']}"
    )


# ---- make run, two trees ----------------------------------------------------------------------
SAID = re.compile(r"^popgrpo: (.*) \((\d+\.\d) s\)$")


def parse_start(stderr: str) -> dict[str, float | None]:
    """The seconds at "Ray is up" and at "round 0 begins" in a run's start-up lines (None if absent)."""
    found: dict[str, float | None] = {"ray_up_s": None, "round0_s": None}
    for line in stderr.splitlines():
        m = SAID.match(line.strip())
        if not m:
            continue
        if m.group(1).startswith("Ray is up"):
            found["ray_up_s"] = float(m.group(2))
        elif m.group(1).startswith("round 0 begins"):
            found["round0_s"] = float(m.group(2))
    return found


def e2e(trees: list[Path], order: str) -> dict[str, Any]:
    runs = []
    for i, letter in enumerate(order):
        tree = trees["AB".index(letter)].resolve()
        with tempfile.TemporaryDirectory(prefix="pge2e-") as out:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            t0 = time.time()
            res = subprocess.run(
                [sys.executable, "-m", "popgrpo", "train", "--out", f"{out}/run"],
                capture_output=True,
                text=True,
                cwd=tree,
                env=env,
                timeout=600,
            )
            wall = time.time() - t0
        if res.returncode != 0:
            raise RuntimeError(f"popgrpo train in {tree} failed:\n{res.stderr[-3000:]}")
        run = {"tree": letter, "position": i, **parse_start(res.stderr), "total_s": wall}
        print(run, file=sys.stderr, flush=True)
        runs.append(run)
    labels = {letter: _tree_of(t) for letter, t in zip("AB", trees, strict=False)}
    return {"order": order, "trees": labels, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs}


def _tree_of(path: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=path)
    dirty = subprocess.run(["git", "status", "--porcelain", "popgrpo"], capture_output=True, text=True, cwd=path)
    return (out.stdout.strip() or str(path)) + (" + changes" if dirty.stdout.strip() else "")


# ---- tables ------------------------------------------------------------------------------------
def _spread(values: list[float]) -> str:
    """Median (minimum–maximum) of ``values``, one decimal."""
    if not values:
        return "–"
    med = statistics.median(values)
    return f"{med:.1f}" if len(values) == 1 else f"{med:.1f} ({min(values):.1f}–{max(values):.1f})"


def phases_table(data: dict[str, Any]) -> str:
    """One row per K and tree: medians over repeats (range), each actor phase the median over
    actors ("–" for a tree that does not tell them)."""
    rows = []
    trees = data.get("trees", {"B": data["tree"]})
    for k in sorted({r["k"] for r in data["runs"]}):
        for letter in sorted(trees):
            runs = [r for r in data["runs"] if r["k"] == k and r.get("tree", "B") == letter]
            if not runs:
                continue
            timed = [r for r in runs if r["phases"] is not None]
            per_phase = {p: [statistics.median(r["phases"][p]) for r in timed] for p in PHASES}
            rows.append(
                [
                    str(k),
                    str(runs[0]["actors"]),
                    f"{'before' if letter == 'A' else 'after'} ({trees[letter]})" if len(trees) > 1 else trees[letter],
                    _spread([r["ray_start_s"] for r in runs]),
                    _spread([r["executor_s"] for r in runs]),
                    _spread([r["floor"] for r in runs]),
                    *(_spread(per_phase[p]) for p in PHASES),
                    _spread([statistics.median(r["first_epoch_s"]) for r in timed]),
                    _spread([r["fresh_actor_s"] for r in runs if r.get("fresh_actor_s") is not None]),
                    _spread([r["replaced_in_s"] for r in runs if r["replaced_in_s"] is not None]),
                    _spread([r["restart_call_s"] for r in runs]),
                ]
            )
    header = [
        "K",
        "actors",
        "tree",
        "Ray start",
        "executor built",
        "floor: bare torch actors",
        "process",
        "Ray worker",
        "imports",
        "constructor",
        "first epoch",
        "a fresh actor alone",
        "restart: replaced in",
        "restart: train call",
    ]
    return md_table(header, rows)


def e2e_table(data: dict[str, Any]) -> str:
    """Per tree: median (range) of "Ray is up", "round 0 begins" and the whole run, in seconds."""
    rows = []
    for letter in "AB":
        runs = [r for r in data["runs"] if r["tree"] == letter]
        if not runs:
            continue
        rows.append(
            [
                f"{'before' if letter == 'A' else 'after'} ({data['trees'][letter]})",
                str(len(runs)),
                _spread([r["ray_up_s"] for r in runs if r["ray_up_s"] is not None]),
                _spread([r["round0_s"] for r in runs if r["round0_s"] is not None]),
                _spread([r["total_s"] for r in runs]),
            ]
        )
    return md_table(["tree", "runs", "Ray is up (s)", "round 0 begins (s)", "whole run (s)"], rows)


def render(phases: dict[str, Any], e2e_data: dict[str, Any] | None = None, e2e_file: str = "") -> str:
    """The section: the phases table, and with ``e2e_data`` (saved as ``e2e_file``) make run's table."""
    parts = [
        f"`python -m benchmarks.start_phases` at `{phases['tree']}`, {phases['date']} "
        f"(`benchmarks/data/start_phases_{phases['tree']}.json`); seconds, median over "
        f"{len({r['repeat'] for r in phases['runs']})} fresh processes (range); each actor phase the median over its actors:",
        "",
        phases_table(phases),
    ]
    if e2e_data is not None:
        parts += [
            "",
            f"`make run`'s start and whole run, the trees side by side in the order {e2e_data['order']} "
            f"({e2e_data['date']}; `python -m benchmarks.start_phases --e2e`, `{e2e_file}`):",
            "",
            e2e_table(e2e_data),
        ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="K = 5 once (about a minute)")
    parser.add_argument("--members", default="5,16,64")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--e2e", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--before", type=Path, metavar="TREE", help="measure this tree's start beside this one's")
    parser.add_argument("--order", default="ABBA")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--render", nargs="+", type=Path, metavar="JSON")
    parser.add_argument("--write", type=Path, metavar="BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        result = _child_executor(int(rest[0]), int(rest[1])) if kind == "executor" else _child_floor(int(rest[0]))
        print(json.dumps(result))
        return 0
    if args.e2e:
        if set(args.order) - set("AB"):
            print("start_phases: --order takes the letters A (before) and B (after)", file=sys.stderr)
            return 2
        data = e2e(list(args.e2e), args.order)
        if args.json:
            args.json.write_text(json.dumps(data, indent=1))
        print(e2e_table(data))
        return 0
    if args.render:
        loaded = [json.loads(p.read_text()) for p in args.render]
        e2e_file = f"benchmarks/data/{args.render[1].name}" if len(loaded) > 1 else ""
        text = render(loaded[0], loaded[1] if len(loaded) > 1 else None, e2e_file)
    else:
        members = [5] if args.quick else [int(k) for k in args.members.split(",")]
        data = measure(members, 1 if args.quick else args.repeats, args.before)
        if args.json:
            args.json.write_text(json.dumps(data, indent=1))
        text = render(data)
        if args.quick:
            text = "**--quick: one K, one process; not a result.**\n\n" + text
    print(text)
    if args.write:
        write_between(args.write, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
