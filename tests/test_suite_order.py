"""The order the suite's tests are handed out in (tests/conftest.py ``scheduling_order``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import scheduling_order

ROOT = Path(__file__).resolve().parents[1]


def _items(*nodeids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_the_shared_fixture_package_comes_first_and_each_part_by_decreasing_size():
    items = _items(
        "tests/a/test_one.py::t1",
        "tests/runtime/test_x.py::t1",
        "tests/b/test_three.py::t1",
        "tests/b/test_three.py::t2",
        "tests/runtime/test_y.py::t1",
        "tests/b/test_three.py::t3",
        "tests/runtime/test_y.py::t2",
        "tests/a/test_cls.py::Case::t1",
        "tests/a/test_cls.py::Case::t2",
        "tests/a/test_cls.py::t3",
    )
    order = [i.nodeid for i in scheduling_order(items)]
    assert order == [
        # tests/runtime first, together; its bigger module first.
        "tests/runtime/test_y.py::t1",
        "tests/runtime/test_y.py::t2",
        "tests/runtime/test_x.py::t1",
        # Then the other units by decreasing count; a class is a unit of its own, and units of
        # equal size keep their order of collection.
        "tests/b/test_three.py::t1",
        "tests/b/test_three.py::t2",
        "tests/b/test_three.py::t3",
        "tests/a/test_cls.py::Case::t1",
        "tests/a/test_cls.py::Case::t2",
        "tests/a/test_one.py::t1",
        "tests/a/test_cls.py::t3",
    ]
    assert sorted(order) == sorted(i.nodeid for i in items)


def test_the_suite_is_collected_in_that_order_and_xdist_keeps_it(pytestconfig):
    # xdist re-sorts loadscope's modules by count unless told not to; conftest tells it.
    if hasattr(pytestconfig.option, "loadscopereorder"):
        assert pytestconfig.option.loadscopereorder is False
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/core/test_archive.py", "tests/runtime/test_executor_spec.py", "tests/runtime/test_naming.py"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    modules = list(dict.fromkeys(i.split("::")[0] for i in ids))
    assert modules[-1] == "tests/core/test_archive.py"
    assert set(modules[:-1]) == {"tests/runtime/test_executor_spec.py", "tests/runtime/test_naming.py"}
