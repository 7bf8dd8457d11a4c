"""start_local_ray: a head that times out waiting for its own raylet (Ray's fixed 30 s, hit on
a machine whose cores are all busy) is stopped, with every process it started, and started
again; other failures are raised at once and processes that were there before are left alone.

The slow start is injected: ``ray.init`` is replaced by one that starts real processes (a child
with a grandchild, as Ray's raylet starts its agents) and raises what Ray raises. The last test
holds the message against Ray's own source, so an upgrade that rewords it fails here."""

from __future__ import annotations

import inspect
import subprocess
import sys
import time

import psutil
import pytest
import ray

from popgrpo.runtime import cluster

SLEEPER = "import time; time.sleep(300)"
PARENT = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); time.sleep(300)"


def _start_tree() -> list[psutil.Process]:
    """A child that has started a grandchild: both as psutil processes."""
    child = psutil.Process(subprocess.Popen([sys.executable, "-c", PARENT]).pid)
    deadline = time.monotonic() + 60
    while not child.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.children(), "the grandchild did not start"
    return [child, *child.children()]


# A child that starts a grandchild each time its trigger file appears (and removes it), as an
# earlier Ray's raylet starts a worker: a process new during a start, but not the start's.
SPAWNER = """
import os, subprocess, sys, time
trigger = sys.argv[1]
while True:
    if os.path.exists(trigger):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        os.remove(trigger)
    time.sleep(0.02)
"""


class SlowThenUp:
    """``ray.init`` whose first ``fail`` calls start processes and raise ``error``; ``during``
    runs in each failing call before it raises."""

    def __init__(self, fail: int, error: Exception, during=None):
        self.fail, self.error, self.during = fail, error, during
        self.calls: list[dict] = []
        self.started: list[psutil.Process] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if len(self.calls) <= self.fail:
            self.started += _start_tree()
            if self.during is not None:
                self.during()
            raise self.error
        return "context"


@pytest.fixture
def bystander():
    """A child of this process that was running before the start, and must survive it."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


@pytest.fixture
def other_tree(tmp_path):
    """A child of this process, running before the start, whose new grandchild appears during it."""
    trigger = tmp_path / "spawn"
    parent = psutil.Process(subprocess.Popen([sys.executable, "-c", SPAWNER, str(trigger)]).pid)

    def spawn() -> None:
        before = set(parent.children())
        trigger.touch()
        deadline = time.monotonic() + 60
        while not set(parent.children()) - before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert set(parent.children()) - before, "the grandchild did not start"

    yield parent, spawn
    tree = [parent, *parent.children(recursive=True)]
    for proc in tree:
        proc.kill()
    psutil.wait_procs(tree, timeout=10)


def _gone(procs: list[psutil.Process]) -> bool:
    return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in procs)


def test_a_slow_start_is_stopped_and_started_again(monkeypatch, bystander):
    init = SlowThenUp(1, Exception("The current node timed out during startup. This could happen because ..."))
    monkeypatch.setattr(ray, "init", init)
    assert cluster.start_local_ray(num_cpus=2, include_dashboard=False) == "context"
    assert len(init.calls) == 2 and init.calls[0] == init.calls[1]
    assert len(init.started) == 2 and _gone(init.started)  # the child and its grandchild
    assert bystander.is_running() and bystander.status() != psutil.STATUS_ZOMBIE


def test_processes_of_children_that_were_there_before_are_left_alone(monkeypatch, other_tree):
    parent, spawn = other_tree
    init = SlowThenUp(1, Exception("The current node timed out during startup."), during=spawn)
    monkeypatch.setattr(ray, "init", init)
    assert cluster.start_local_ray(include_dashboard=False) == "context"
    assert _gone(init.started)
    grandchildren = parent.children()
    assert grandchildren and all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in grandchildren)


def test_the_last_attempt_raises_what_ray_raised(monkeypatch, bystander):
    init = SlowThenUp(2, Exception("The current node timed out during startup."))
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(Exception, match="timed out during startup"):
        cluster.start_local_ray(include_dashboard=False, attempts=2)
    assert len(init.calls) == 2
    assert _gone(init.started[:2])  # the first attempt's processes were stopped before the second
    for proc in init.started[2:]:  # the last attempt's, as Ray leaves them (a run exits on this)
        proc.kill()
    psutil.wait_procs(init.started[2:], timeout=10)
    assert bystander.is_running()


def test_any_other_failure_is_raised_at_once(monkeypatch, bystander):
    init = SlowThenUp(1, ValueError("dashboard_port 1 is not free"))
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ValueError, match="not free"):
        cluster.start_local_ray(include_dashboard=False)
    assert len(init.calls) == 1
    for proc in init.started:
        proc.kill()
    psutil.wait_procs(init.started, timeout=10)
    assert bystander.is_running()


def test_ray_still_raises_the_message_the_retry_matches():
    import ray._private.node as node

    assert cluster.SLOW_START in inspect.getsource(node.Node.__init__)
