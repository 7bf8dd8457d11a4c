"""The warm sandbox pool: same results as the one-shot path, one program per sandbox, nothing leaks."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from popgrpo.envs.sandbox import ExecutionResult, Sandbox, SandboxLimits
from popgrpo.envs.sandbox.pool import SandboxPool, shared_pool

pytestmark = pytest.mark.requires("sandbox")

LIMITS = SandboxLimits(timeout_s=1.5, cpu_s=3, memory_mb=256, file_size_mb=1)

# One program per outcome the sandbox tells apart.
PROGRAMS = {
    "pass": "score = 0.75",
    "fail": "score = 0.0",
    "no-score": "x = 1",
    "out-of-range": "score = 7",
    "timeout": "while True: pass",
    "memory": "x = bytearray(10**10)\nscore = 1.0",
    "syntax-error": "def f(:\n    pass",
    "exception": "raise ValueError('boom')",
    "forbidden": "import os\nos.fork()\nscore = 1.0",
    "file-too-large": "open('big', 'wb').write(b'x' * (2 << 20))\nscore = 1.0",
}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(LIMITS, size=3, site_packages=False) as p:
        yield p


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_program_gets_the_same_result_pooled_or_not(pool):
    codes = list(PROGRAMS.values())
    with Sandbox(LIMITS, max_workers=3, site_packages=False) as cold:
        one_shot = cold.run_many(codes)
    pooled = pool.run_many(codes)
    assert [r.reason for r in one_shot] == [
        "ok", "ok", "no_score", "out_of_range", "timeout", "memory", "crash", "crash", "forbidden", "crash",
    ]  # fmt: skip
    assert pooled == one_shot
    assert pooled[0] == ExecutionResult(0.75, "ok")


def test_the_wall_clock_starts_when_the_program_is_written(pool):
    assert pool.wait_warm(timeout=30)
    time.sleep(LIMITS.timeout_s + 0.2)  # the warm sandboxes have waited longer than the limit
    assert pool.run("import time\ntime.sleep(0.3)\nscore = 0.5") == ExecutionResult(0.5, "ok")


def test_each_sandbox_runs_one_program_and_is_then_gone(pool):
    assert pool.wait_warm(timeout=30)
    warm = pool.pids()
    # A second program in the same interpreter or directory would find the first one's marks.
    code = (
        "import os, sys\nfresh = not hasattr(sys, 'popgrpo_mark') and os.listdir('.') == []\n"
        "sys.popgrpo_mark = 1\nopen('mark', 'w').write('x')\nscore = 1.0 if fresh else 0.25"
    )
    assert [r.score for r in pool.run_many([code] * 7)] == [1.0] * 7
    assert not [pid for pid in warm if _alive(pid)]  # used (and killed) or still waiting: not reused


def test_a_sandbox_that_died_while_waiting_is_replaced(pool):
    assert pool.wait_warm(timeout=30)
    victim = pool.pids()[0]
    os.killpg(victim, signal.SIGKILL)  # a sandbox this test's pool started
    deadline = time.monotonic() + 5
    while _alive(victim) and time.monotonic() < deadline:
        time.sleep(0.01)
    before = pool.discarded
    assert pool.run_many(["score = 0.5"] * 3) == [ExecutionResult(0.5, "ok")] * 3
    assert pool.discarded == before + 1


def test_submit_one_returns_before_the_program_ends(tmp_path):
    """The program waits for the test's word (a file ``go`` in its working directory), given
    only once ``submit_one`` has returned."""
    gated = SandboxLimits(timeout_s=600.0, cpu_s=30, memory_mb=256)
    with SandboxPool(gated, size=1, site_packages=False, temp_dir=str(tmp_path)) as p:
        future = p.submit_one("import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)\nscore = 0.5")
        assert not future.done()
        deadline = time.monotonic() + 120
        while not future.done() and time.monotonic() < deadline:
            for work in tmp_path.glob("*/work"):  # the running sandbox's, and any warm one's
                (work / "go").touch()
            time.sleep(0.05)
        assert future.result(timeout=0) == ExecutionResult(0.5, "ok")
        nothing = p.submit_one(None)
        assert nothing.done() and nothing.result().reason == "no_code"


def test_close_kills_every_sandbox_and_removes_its_directory(tmp_path):
    p = SandboxPool(LIMITS, size=3, site_packages=False, temp_dir=str(tmp_path))
    assert p.wait_warm(timeout=30)
    warm = p.pids()
    assert len(os.listdir(tmp_path)) == 3
    p.close()
    p.close()  # idempotent
    assert not [pid for pid in warm if _alive(pid)]
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError):
        p.run("score = 1")


_TRAINER = """
import os, signal, sys
from popgrpo.envs.sandbox.pool import SandboxPool
from popgrpo.envs.sandbox import SandboxLimits
pool = SandboxPool(SandboxLimits(timeout_s=1.0), size=3, site_packages=False, isolation=sys.argv[1])
assert pool.wait_warm(timeout=30)
print(" ".join(map(str, pool.pids())), flush=True)
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)  # the trainer dies without closing anything
"""  # otherwise it ends normally, without closing the pool: the exit handler does


@pytest.mark.parametrize(("isolation", "end"), [("bwrap", "killed"), ("none", "killed"), ("bwrap", "exits")])
def test_nothing_outlives_a_trainer_that_is_killed_or_exits(isolation, end, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_TRAINER), isolation, end], env=env, capture_output=True, timeout=120
    )
    assert proc.returncode == (-signal.SIGKILL if end == "killed" else 0), proc.stderr.decode()[-2000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in alive:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert alive == []
    if end == "exits":
        assert os.listdir(tmp_path) == []  # and their directories are gone


def test_a_pool_whose_sandboxes_cannot_start_runs_programs_cold_and_does_not_hang():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        broken = SandboxPool(LIMITS, size=2, python="/bin/false", isolation="none")
    with broken:
        result = broken.run("score = 1")
    assert result.reason == "crash" and result.score == 0.0


def test_shared_pool_is_one_per_configuration():
    a = shared_pool(LIMITS, size=1, site_packages=False)
    assert shared_pool(LIMITS, size=1, site_packages=False) is a
    assert a.run("score = 0.5") == ExecutionResult(0.5, "ok")
    a.close()
    b = shared_pool(LIMITS, size=1, site_packages=False)
    assert b is not a
    b.close()


def test_pool_size_must_be_positive():
    with pytest.raises(ValueError, match="at least one sandbox"):
        SandboxPool(LIMITS, size=0)


def test_the_cost_benchmark_runs(tmp_path):
    import json

    from benchmarks.sandbox_cost import main

    out = tmp_path / "cost.json"
    main(["--runs", "2", "--rounds", "2", "--batch", "2", "--out", str(out)])
    numbers = json.loads(out.read_text())
    assert set(numbers["one_at_a_time_ms"]) == {"bwrap /bin/true", "one-shot", "pool", "one-shot / pool"}
    assert numbers["batched_ms_per_program"]["pool"]["median"] > 0


def test_a_program_not_read_before_its_deadline_times_out_and_never_runs_in_part(tmp_path):
    # 1.2 MB of program, 1 ms of wall clock: the child (still starting) cannot read it in time.
    # Were the pipe closed before the kill, the child would run the part it had read.
    mark = tmp_path / "ran"
    code = f"open({str(mark)!r}, 'w')\n" + "x = 1\n" * 200_000 + "score = 1.0"
    with Sandbox(SandboxLimits(timeout_s=0.001), max_workers=1, site_packages=False, _audit_hook=False) as sb:
        result = sb.run(code)
    assert result.reason == "timeout"
    assert not mark.exists()
