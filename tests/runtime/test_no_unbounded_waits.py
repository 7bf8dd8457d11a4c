"""No wait without a deadline in popgrpo/runtime/: every ``ray.get`` and ``ray.wait`` names a timeout.

A stopped process (SIGSTOP, a frozen node) never answers and Ray never reports it lost, so one
``ray.get`` without a timeout is enough for a single frozen member to hold a whole population
for good (issue 48). The scan reads the source (AST), so it covers code no test reaches.
"""

from __future__ import annotations

import ast
from pathlib import Path

import popgrpo.runtime

RUNTIME = Path(popgrpo.runtime.__file__).parent
WAITS = {"get", "wait"}


def unbounded_waits(source: str) -> list[tuple[int, str]]:
    """``(line, call)`` of each ``ray.get(…)`` / ``ray.wait(…)`` in ``source`` without a ``timeout=``
    (or with ``timeout=None``); a ``**kwargs`` call is taken as unbounded too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if func.attr not in WAITS or not (isinstance(func.value, ast.Name) and func.value.id == "ray"):
            continue
        timeout = next((k.value for k in node.keywords if k.arg == "timeout"), None)
        if timeout is None or (isinstance(timeout, ast.Constant) and timeout.value is None):
            found.append((node.lineno, f"ray.{func.attr}"))
    return found


def test_the_scan_finds_what_it_must():
    assert unbounded_waits("ray.get(ref)\nray.wait([r])\nray.get(r, timeout=None)\n") == [
        (1, "ray.get"),
        (2, "ray.wait"),
        (3, "ray.get"),
    ]
    assert unbounded_waits("ray.get(r, timeout=5)\nray.wait([r], timeout=t)\nray.get_actor('x')\nd.get(k)\n") == []


def test_no_ray_get_or_wait_without_a_timeout_in_the_runtime():
    offenders = [
        f"{path.name}:{line}: {call}"
        for path in sorted(RUNTIME.glob("*.py"))
        for line, call in unbounded_waits(path.read_text())
    ]
    assert not offenders, "waits without a deadline: " + ", ".join(offenders)
