"""A pooled sandbox cannot see or affect another program, the pool, or the trainer.

The warm pool (:mod:`popgrpo.envs.sandbox.pool`) keeps sandboxes waiting next to the one that
runs a program. Each attack below runs in a pooled sandbox, once with every layer and once with
the audit hook's refusals off (``kernel``: bubblewrap and seccomp alone), and is judged from
outside: the other warm sandboxes still alive and in the pool, a process of the test's own still
alive, no signal received here, nothing left on the host, and the next program's result the same
as in a fresh sandbox. The attacks aim only at what the test itself started (its pool's
sandboxes, its own processes); ``kill(-1, SIGKILL)`` is sent only from inside bubblewrap's pid
namespace, where it could reach nothing else even if seccomp let it through.

A program signals "my attack worked" by setting ``score = 1.0`` and "it failed" by ``0.25``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
import uuid

import pytest

from popgrpo.envs.sandbox import CHILD_SCRIPT, ExecutionResult, SandboxLimits
from popgrpo.envs.sandbox.pool import SandboxPool

pytestmark = pytest.mark.requires("sandbox")

LIMITS = SandboxLimits(timeout_s=3.0, cpu_s=3, memory_mb=256, file_size_mb=1)

# What a fresh sandbox looks like to the next program: an empty working directory and /tmp, an
# interpreter nobody else ran in, a directory it can write.
PROBE = (
    "import os, sys\n"
    "fresh = os.listdir('.') == [] and os.listdir('/tmp') == [] and not hasattr(sys, 'popgrpo_mark')\n"
    "sys.popgrpo_mark = 1\n"
    "open('probe', 'w').write('x')\n"
    "score = 1.0 if fresh else 0.25"
)
FRESH = ExecutionResult(1.0, "ok")


@pytest.fixture(scope="module")
def layers():
    with SandboxPool(LIMITS, size=3, site_packages=False) as pool:
        yield pool


@pytest.fixture(scope="module")
def kernel():
    with SandboxPool(LIMITS, size=3, site_packages=False, _audit_hook=False) as pool:
        yield pool


@pytest.fixture(params=["layers", "kernel"])
def pool(request) -> SandboxPool:
    pool = request.getfixturevalue(request.param)
    assert pool.wait_warm(timeout=60)
    return pool


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _attack(body: str) -> str:
    """``body`` inside a try; ``score`` 1.0 when it sets ``worked``, else 0.25."""
    code = "worked = False\ntry:\n" + "".join(f"    {line}\n" for line in body.splitlines())
    return code + "except BaseException:\n    pass\nscore = 1.0 if worked else 0.25"


def test_a_waiting_program_holds_up_and_learns_nothing_from_the_others(pool):
    secret = uuid.uuid4().hex
    holder = pool.submit_one(f"open('secret', 'w').write({secret!r})\nimport time\ntime.sleep(30)\nscore = 1.0")
    time.sleep(0.3)  # the holder has written its secret
    seeker = _attack(
        "import os\n"
        "for top in ('/tmp', '/sandbox', '/', '/dev', '/dev/shm', '/popgrpo'):\n"
        "    for name in os.listdir(top):\n"
        "        path = os.path.join(top, name)\n"
        "        if not os.path.isfile(path):\n"
        "            continue\n"  # a device such as /dev/ptmx would block the read
        "        try:\n"
        f"            worked = worked or {secret!r}.encode() in open(path, 'rb').read(1 << 16)\n"
        "        except OSError:\n"
        "            pass"
    )
    assert pool.run(seeker).score != 1.0
    assert pool.run(PROBE) == FRESH
    assert not holder.done(), "the others finished while the holder still runs"
    assert holder.result(timeout=30).reason == "timeout"


def test_signals_reach_no_other_sandbox_the_pool_or_the_trainer(pool):
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda *_: received.append(1))
    victim = subprocess.Popen(["sleep", "60"])
    try:
        warm = pool.pids()  # the attack takes the first; the others wait beside it
        discarded = pool.discarded
        attack = _attack(
            "import os, signal\n"
            "try:\n    os.kill(-1, signal.SIGKILL)\n    worked = True\nexcept OSError:\n    pass\n"
            f"for pid in {[*warm[1:], victim.pid]!r}:\n"
            "    for send in (os.kill, os.killpg):\n"
            "        try:\n            send(pid, signal.SIGKILL)\n            worked = True\n"
            "        except OSError:\n            pass\n"
            f"for pid in ({os.getpid()}, os.getppid()):\n"
            "    try:\n        os.kill(pid, signal.SIGUSR2)\n        worked = worked or pid > 1\n"
            "    except OSError:\n        pass"
        )
        assert pool.run(attack).score != 1.0
        time.sleep(0.1)
        assert victim.poll() is None, "the test's own process was killed"
        assert received == []
        assert all(_alive(pid) for pid in warm[1:]), "a waiting sandbox was killed"
        assert set(warm[1:]) <= set(pool.pids()) and pool.discarded == discarded
        assert pool.run_many([PROBE] * 3) == [FRESH] * 3
    finally:
        victim.kill()
        victim.wait()
        signal.signal(signal.SIGUSR2, previous)


def test_proc_shows_no_other_process(pool):
    attack = _attack(
        "import os\n"
        "worked = bool([p for p in os.listdir('/proc') if p.isdigit()])\n"
        f"for pid in {[*pool.pids(), os.getpid()]!r}:\n"
        "    for name in ('environ', 'cmdline', 'status', 'mem'):\n"
        "        try:\n            open(f'/proc/{pid}/{name}', 'rb').read(1)\n            worked = True\n"
        "        except OSError:\n            pass"
    )
    assert pool.run(attack).score != 1.0
    assert pool.run(PROBE) == FRESH


def test_a_program_that_forks_leaves_nothing_running(pool):
    marker = f"popgrpo-pool-{uuid.uuid4().hex}"
    attack = _attack(
        f"import os\nif os.fork() == 0:\n    os.execv('/bin/sh', ['sh', '-c', 'sleep 30', {marker!r}])\nworked = True"
    )
    assert pool.run(attack).score != 1.0
    survivors = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    survivors.append(int(entry))
        except OSError:
            pass
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
    assert pool.run(PROBE) == FRESH


def test_writes_meant_for_the_next_program_do_not_reach_it(pool):
    with open(CHILD_SCRIPT, "rb") as f:
        child_before = hashlib.sha256(f.read()).hexdigest()
    # Places private to the sandbox (its directory, /tmp, its own root and /dev) may take a
    # write under the kernel layer alone; what must not happen is the next program seeing it.
    private = ("sitecustomize.py", "/tmp/next", "/sandbox/../next", "/next", "/dev/shm/next")
    shared = ("/popgrpo/sandbox_child.py", CHILD_SCRIPT)  # the child's code, which every sandbox runs
    attack = _attack(
        "import os\n"
        f"for path in {private!r}:\n"
        "    try:\n        open(path, 'a').write('score = 1.0')\n    except OSError:\n        pass\n"
        f"for path in {shared!r}:\n"
        "    try:\n        open(path, 'a').write('score = 1.0')\n        worked = True\n"
        "    except OSError:\n        pass"
    )
    assert pool.run(attack).score != 1.0
    probe = f"import os\nleft = [p for p in {private!r} if os.path.exists(p)]\n" + PROBE.replace(
        "fresh = ", "fresh = not left and "
    )
    assert pool.run_many([probe] * 3) == [FRESH] * 3
    with open(CHILD_SCRIPT, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == child_before


def test_a_program_that_fills_the_disk_leaves_nothing_behind(tmp_path):
    filler = (
        "chunk = b'x' * (1 << 20)\n"
        "for i in range(48):\n"  # bounded: 48 MiB on the host disk, 48 MiB in the sandbox's /tmp
        "    for where in ('.', '/tmp'):\n"
        "        try:\n            open(f'{where}/fill{i}', 'wb').write(chunk)\n"
        "        except OSError:\n            pass\n"
        "score = 0.25"
    )
    # The kernel layer alone: with the audit hook, the first write to /tmp already ends the run.
    with SandboxPool(LIMITS, size=2, site_packages=False, temp_dir=str(tmp_path), _audit_hook=False) as pool:
        assert pool.wait_warm(timeout=60)
        assert pool.run(filler).reason in ("ok", "timeout")  # done, or out of time on a loaded machine
        assert pool.run_many([PROBE] * 3) == [FRESH] * 3
        assert pool.wait_warm(timeout=60)
        left = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path) for f in fs)
        assert len(os.listdir(tmp_path)) == pool.size  # the waiting sandboxes' directories only
        assert left < 1 << 20
    assert os.listdir(tmp_path) == []
