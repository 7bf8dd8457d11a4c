"""The evaluator actor's priority (popgrpo.runtime.actors.take_niceness): the round's end waits for
it, so it runs at the driver's niceness, not at that of Ray's workers, where the OS allows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# A process at niceness 10 with a second thread asks for ``target``; it prints what it got and
# every thread's niceness as /proc reads it (field 19 of /proc/self/task/<tid>/stat).
SCRIPT = """
import json, os, sys, threading
os.nice(10)  # before the imports: the threads they start inherit it
from popgrpo.runtime.actors import take_niceness
stop = threading.Event()
worker = threading.Thread(target=stop.wait)
worker.start()
got = take_niceness(int(sys.argv[1]))
threads = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/stat") as f:
        threads[tid] = int(f.read().rsplit(")", 1)[1].split()[16])
stop.set()
worker.join()
print(json.dumps({"got": got, "threads": threads}))
"""


def _run(target: int) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(target)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_thread_takes_a_lower_niceness_where_the_os_allows_it():
    privileged = os.geteuid() == 0  # root may raise a priority; another user may not
    result = _run(3)
    expected = 3 if privileged else 10
    assert result["got"] == expected
    assert len(result["threads"]) >= 2 and set(result["threads"].values()) == {expected}


def test_a_niceness_no_lower_than_the_current_one_changes_nothing():
    result = _run(12)
    assert result["got"] == 10 and set(result["threads"].values()) == {10}
