"""What bubblewrap + seccomp add to one sandboxed program: ``python -m benchmarks.sandbox_cost``.

Runs the smallest program (``score = 0.5``) one at a time, alternately with and without the
kernel layer (``isolation="bwrap"`` vs the opt-out ``"none"``), with and without site-packages,
and prints the median wall time per program and the median of the paired differences. The
difference is bubblewrap's start (namespaces, mounts, the filter) on top of the interpreter's.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from popgrpo.envs.sandbox import Sandbox, SandboxLimits


def _time_one(sandbox: Sandbox) -> float:
    start = time.perf_counter()
    result = sandbox.run("score = 0.5")
    elapsed = time.perf_counter() - start
    if result.reason != "ok":
        raise RuntimeError(f"the probe program failed: {result}")
    return 1000 * elapsed


def per_program_ms(site_packages: bool, runs: int) -> tuple[float, float, float]:
    """Median ms per program without and with bubblewrap, and the median of paired differences.

    The two are interleaved run by run, so a machine whose speed drifts (other work on it)
    affects both alike; the paired difference is the figure to quote.
    """
    limits = SandboxLimits()
    with (
        Sandbox(limits, max_workers=1, site_packages=site_packages, isolation="none") as bare,
        Sandbox(limits, max_workers=1, site_packages=site_packages, isolation="bwrap") as isolated,
    ):
        _time_one(bare), _time_one(isolated)  # the pools' threads and the page cache
        pairs = [(_time_one(bare), _time_one(isolated)) for _ in range(runs)]
    return (
        statistics.median(p[0] for p in pairs),
        statistics.median(p[1] for p in pairs),
        statistics.median(p[1] - p[0] for p in pairs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)  # isolation="none" warns, as it should
    print("| site-packages | none (audit hook only) ms | bwrap + seccomp ms | added ms (median of pairs) |")
    print("| --- | --- | --- | --- |")
    for site_packages in (False, True):
        bare, isolated, added = per_program_ms(site_packages, args.runs)
        print(f"| {'yes' if site_packages else 'no (-S)'} | {bare:.0f} | {isolated:.0f} | {added:.0f} |")


if __name__ == "__main__":
    main()
