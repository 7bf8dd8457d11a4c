"""What one sandboxed program costs: ``python -m benchmarks.sandbox_cost``.

Two tables, each from measurements interleaved round by round (a machine whose speed drifts,
other work on it, affects every column alike):

1. **Per program, one at a time** (the smallest program, ``score = 0.5``): bubblewrap's bare
   start (``bwrap`` with the sandbox's namespaces, mounts and seccomp filter running
   ``/bin/true``), the one-shot cold path (:class:`popgrpo.envs.sandbox.Sandbox`: a new
   bubblewrap and interpreter per program) and the warm pool
   (:class:`popgrpo.envs.sandbox.pool.SandboxPool`, a warm sandbox waiting when the program
   comes), with the ratio cold / pool of each round.
2. **Per program in a batch** of ``--batch`` programs (a GRPO step's rewards): the one-shot path
   (``max_workers`` = cores) and a pool of ``--batch`` sandboxes refilled before the batch, as
   it is while a trainer generates; time per batch divided by its size. The refill row is the
   wall time until the pool is warm again after a batch, per program: the start cost the pool
   moves off the critical path (it still costs CPU, beside whatever the trainer does then).

Medians with the interquartile range (p25–p75). ``--overhead`` adds the older table: the
interpreter with and without bubblewrap + seccomp (the audit hook only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence

from popgrpo.envs.sandbox import Sandbox, SandboxLimits, child_env, seccomp_program
from popgrpo.envs.sandbox.bwrap import bwrap_command, interpreter_roots
from popgrpo.envs.sandbox.pool import SandboxPool
from popgrpo.envs.sandbox.seccomp import memfd
from popgrpo.markdown import md_table

PROBE = "score = 0.5"


def _ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


def _check(results: Sequence[object]) -> None:
    for result in results:
        if getattr(result, "reason", None) != "ok":
            raise RuntimeError(f"the probe program failed: {result}")


def bare_bwrap(python_roots: list[str]) -> Callable[[], None]:
    """One start of bubblewrap exactly as a sandbox starts it, running ``/bin/true``."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SystemExit("bubblewrap is not installed")

    def run() -> None:
        with tempfile.TemporaryDirectory(prefix="popgrpo-sandbox-bench-") as work:
            fd = memfd("popgrpo-seccomp", seccomp_program())
            try:
                cmd = [*bwrap_command(bwrap, work, fd, python_roots), "/bin/true"]
                subprocess.run(cmd, pass_fds=(fd,), check=True, env=child_env("/sandbox"))
            finally:
                os.close(fd)

    return run


def _summary(values: Sequence[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "p25": q[0], "p75": q[2], "n": len(values)}


def _fmt(s: dict[str, float], unit: str = "", digits: int = 0) -> str:
    return f"{s['median']:.{digits}f}{unit} ({s['p25']:.{digits}f}–{s['p75']:.{digits}f})"


def one_at_a_time(runs: int, site_packages: bool) -> dict[str, dict[str, float]]:
    """Table 1: ms per program for bare bwrap, the one-shot path and the warm pool, and cold/pool."""
    limits = SandboxLimits()
    bare = bare_bwrap(interpreter_roots(sys.executable, site_packages))
    rows: dict[str, list[float]] = {"bwrap /bin/true": [], "one-shot": [], "pool": [], "one-shot / pool": []}
    with (
        Sandbox(limits, max_workers=1, site_packages=site_packages) as cold,
        SandboxPool(limits, size=2, max_workers=1, site_packages=site_packages) as pool,
    ):
        for _ in range(2):  # page cache, threads, the filter's compilation
            bare()
            _check([cold.run(PROBE)])
            _check([pool.run(PROBE)])
        for _ in range(runs):
            rows["bwrap /bin/true"].append(_ms(bare))
            c = _ms(lambda: _check([cold.run(PROBE)]))
            pool.wait_warm(timeout=60)  # not timed: the trainer's other work refills the pool
            p = _ms(lambda: _check([pool.run(PROBE)]))
            rows["one-shot"].append(c)
            rows["pool"].append(p)
            rows["one-shot / pool"].append(c / p)
    return {k: _summary(v) for k, v in rows.items()}


def batched(batch: int, rounds: int, site_packages: bool) -> dict[str, dict[str, float]]:
    """Table 2: ms per program in a batch of ``batch``, one-shot vs a pool refilled before it."""
    limits = SandboxLimits()
    codes = [PROBE] * batch
    rows: dict[str, list[float]] = {
        "one-shot": [],
        "pool": [],
        "one-shot / pool": [],
        "pool refill (background)": [],
    }
    with (
        Sandbox(limits, site_packages=site_packages) as cold,
        SandboxPool(limits, size=batch, site_packages=site_packages) as pool,
    ):
        _check(cold.run_many(codes))
        _check(pool.run_many(codes))
        pool.wait_warm(timeout=120)
        for _ in range(rounds):
            c = _ms(lambda: _check(cold.run_many(codes))) / batch
            p = _ms(lambda: _check(pool.run_many(codes))) / batch
            # The start cost the pool moved off the critical path: how long the pool thread
            # takes to have every sandbox warm again (the trainer generates meanwhile).
            rows["pool refill (background)"].append(_ms(lambda: pool.wait_warm(timeout=120)) / batch)
            rows["one-shot"].append(c)
            rows["pool"].append(p)
            rows["one-shot / pool"].append(c / p)
    return {k: _summary(v) for k, v in rows.items()}


def overhead(site_packages: bool, runs: int) -> tuple[float, float, float]:
    """Median ms per program without and with bubblewrap, and the median of paired differences."""
    limits = SandboxLimits()
    with (
        Sandbox(limits, max_workers=1, site_packages=site_packages, isolation="none") as bare,
        Sandbox(limits, max_workers=1, site_packages=site_packages, isolation="bwrap") as isolated,
    ):
        bare.run(PROBE)
        isolated.run(PROBE)
        pairs = [(_ms(lambda: bare.run(PROBE)), _ms(lambda: isolated.run(PROBE))) for _ in range(runs)]
    return (
        statistics.median(p[0] for p in pairs),
        statistics.median(p[1] for p in pairs),
        statistics.median(p[1] - p[0] for p in pairs),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="rounds of table 1 (one program per column each)")
    parser.add_argument("--batch", type=int, default=16, help="programs per batch in table 2 (0: skip it)")
    parser.add_argument("--rounds", type=int, default=8, help="batches per column in table 2")
    parser.add_argument("--site-packages", action="store_true", help="programs see site-packages (default: -S)")
    parser.add_argument("--overhead", action="store_true", help="also the bwrap-vs-audit-hook-only table")
    parser.add_argument("--out", help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    if args.runs < 2 or args.rounds < 2:
        parser.error("--runs and --rounds must be at least 2 (a spread needs two values)")
    warnings.simplefilter("ignore", RuntimeWarning)  # isolation="none" warns, as it should
    sp = "with site-packages" if args.site_packages else "standard library only (-S)"
    load = os.getloadavg()[0]
    out: dict[str, object] = {"site_packages": args.site_packages, "cores": os.cpu_count(), "load_before": load}
    print(f"# one sandboxed `score = 0.5`, {sp}; {os.cpu_count()} cores, load average {load:.1f} before")
    single = one_at_a_time(args.runs, args.site_packages)
    out["one_at_a_time_ms"] = single
    rows = [[name, _fmt(s, "x", 1) if " / " in name else _fmt(s, " ms")] for name, s in single.items()]
    print("\n" + md_table([f"one at a time, {args.runs} rounds", "median (p25–p75)"], rows))
    if args.batch:
        batch = batched(args.batch, args.rounds, args.site_packages)
        out["batch"] = args.batch
        out["batched_ms_per_program"] = batch
        rows = [[name, _fmt(s, "x", 1) if " / " in name else _fmt(s, " ms", 1)] for name, s in batch.items()]
        header = [f"per program in a batch of {args.batch}, {args.rounds} batches", "median (p25–p75)"]
        print("\n" + md_table(header, rows))
    if args.overhead:
        rows = []
        for site_packages in (False, True):
            bare, isolated, added = overhead(site_packages, args.runs)
            rows.append(["yes" if site_packages else "no (-S)", f"{bare:.0f}", f"{isolated:.0f}", f"{added:.0f}"])
        header = ["site-packages", "none (audit hook only) ms", "bwrap + seccomp ms", "added ms (median of pairs)"]
        print("\n" + md_table(header, rows))
    out["load_after"] = os.getloadavg()[0]
    print(f"\nload average {out['load_after']:.1f} after")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
