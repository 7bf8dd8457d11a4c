import os

import pytest
import torch

from tests.services import HIDER, IN_CI, program_problem, require, require_module

torch.set_num_threads(1)

# Ray starts its worker processes at nice 15 (RAY_worker_niceness) so that its own daemons stay
# responsive. Beside any nice-0 CPU load (a second job, a CPU hog) those workers then get a few
# per cent of a core: an actor's start-up took about three minutes under two busy loops, and
# the chaos and job tests ran past their deadlines. Every Ray the suite starts (in-process, the
# `ray start` heads and clusters, popgrpo subprocesses: all inherit this environment) runs its
# workers at the suite's own priority instead.
os.environ.setdefault("RAY_worker_niceness", "0")


# Packages whose tests share one package-scoped fixture that is costly to start: tests/runtime's
# `ray_local`, a Ray cluster (docs/reference/tests.md says what it costs). pytest stops a
# package's fixtures as soon as the next test of its process is in another package.
SHARED_FIXTURE_PACKAGES = ("tests/runtime/",)


def pytest_configure(config):
    """pytest-xdist's ``--dist loadscope`` hands the modules out in the order of
    :func:`scheduling_order` (below), not re-sorted by its own count of tests."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def scheduling_order(items: list) -> list:
    """The tests, module by module (a class is its own unit, as for ``loadscope``): first the
    packages of :data:`SHARED_FIXTURE_PACKAGES`, then the rest, each part in decreasing number of
    tests (as xdist orders them by itself) and a module's tests in their own order.

    Handed out in this order, every xdist worker runs the modules of such a package one after
    another and starts their shared fixture once, where xdist's own order by count interleaves
    them with other packages' modules and restarts it at each. The largest units still go
    first, so that the last ones are small."""
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(item.nodeid.rsplit("::", 1)[0], []).append(item)

    def key(unit: str) -> tuple[bool, int]:
        return (not unit.startswith(SHARED_FIXTURE_PACKAGES), -len(units[unit]))

    return [item for unit in sorted(units, key=key) for item in units[unit]]


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the order counts the tests that run
def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.requires("prometheus", ...)``: a test whose program is missing here is
    skipped with the reason (reported at the test, no fixture set up); in CI it fails instead,
    in :func:`pytest_runtest_setup` (:func:`tests.services.require`).

    ``@pytest.mark.solo`` is a kind of slow test (``make test-slow`` runs it alone): one marked
    solo and not slow would run in ``make test`` beside another test, so collection refuses it.

    The tests run in :func:`scheduling_order`."""
    items[:] = scheduling_order(items)
    unslow = [item.nodeid for item in items if item.get_closest_marker("solo") and not item.get_closest_marker("slow")]
    if unslow:
        raise pytest.UsageError(f"marked solo but not slow (make test would run them in parallel): {unslow}")
    if IN_CI:
        return
    for item in items:
        problems = [program_problem(p) for marker in item.iter_markers("requires") for p in marker.args]
        if any(problems):
            item.add_marker(pytest.mark.skip(reason="; ".join(p for p in problems if p)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """With ``POPGRPO_TEST_HIDE_PROGRAMS=1`` (CI), the programs the test did not declare are hidden
    from it, its fixtures included, until its teardown ends (:class:`tests.services.ProgramHider`).
    In CI, a test whose program is missing fails before its fixtures are set up."""
    declared = [program for marker in item.iter_markers("requires") for program in marker.args]
    if HIDER is not None:
        HIDER.begin(declared)
    if IN_CI:
        for program in declared:
            require(program)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if HIDER is not None:
        HIDER.end()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


# ---- exit without interpreter finalisation --------------------------------------------------
# Once every test has run and the summary is printed, a native library (torch, Ray's gRPC
# threads) can crash in its C++ destructors during interpreter shutdown: seen here once in
# four full runs as "Segmentation fault" right after "92 passed", which turns a green run red.
# We leave with pytest's own exit status instead, skipping only that teardown; a failing test
# still fails the run.
_exit_status: dict[str, int | None] = {"code": None}


def pytest_sessionfinish(session, exitstatus):
    _exit_status["code"] = int(exitstatus)
    if HIDER is not None:
        HIDER.close()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    code = _exit_status["code"]
    if code is None:
        return
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A toy causal LM written with save_pretrained, loaded by every test through from_pretrained."""
    require_module("transformers")
    from popgrpo.policies.causal_lm import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny-lm"))
