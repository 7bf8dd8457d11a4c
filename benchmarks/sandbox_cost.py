"""What bubblewrap + seccomp add to one sandboxed program: ``python -m benchmarks.sandbox_cost``.

Runs the smallest program (``score = 0.5``) one at a time, with and without the kernel layer
(``isolation="bwrap"`` vs the opt-out ``"none"``), with and without site-packages, and prints
the median wall time per program. The difference is bubblewrap's start (namespaces, mounts,
the filter) on top of the interpreter's own start.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from popgrpo.envs.sandbox import Sandbox, SandboxLimits


def per_program_ms(isolation: str, site_packages: bool, runs: int) -> float:
    with Sandbox(SandboxLimits(), max_workers=1, site_packages=site_packages, isolation=isolation) as sandbox:
        sandbox.run("score = 0.5")  # the pool's thread and the page cache
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            result = sandbox.run("score = 0.5")
            times.append(time.perf_counter() - start)
            if result.reason != "ok":
                raise RuntimeError(f"the probe program failed: {result}")
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)  # isolation="none" warns, as it should
    print("| site-packages | none (audit hook only) ms | bwrap + seccomp ms | added ms |")
    print("| --- | --- | --- | --- |")
    for site_packages in (False, True):
        bare = per_program_ms("none", site_packages, args.runs)
        isolated = per_program_ms("bwrap", site_packages, args.runs)
        print(f"| {'yes' if site_packages else 'no (-S)'} | {bare:.0f} | {isolated:.0f} | {isolated - bare:.0f} |")


if __name__ == "__main__":
    main()
