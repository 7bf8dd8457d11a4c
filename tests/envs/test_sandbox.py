"""The execution sandbox, on real subprocesses: limits, containment, classification, parallelism."""

import os
import threading
import time
from concurrent.futures import CancelledError, Future

import pytest

from popgrpo.envs.sandbox import (
    REASONS,
    ExecutionResult,
    Sandbox,
    SandboxLimits,
    extract_code,
    score_completions,
)

LIMITS = SandboxLimits(timeout_s=3.0, cpu_s=3, memory_mb=256)
MARKER = b"popgrpo-sandbox-"  # the temp-dir prefix: on bubblewrap's command line via the bound work dir


pytestmark = pytest.mark.requires("sandbox")


@pytest.fixture(autouse=True)
def _no_warm_sandboxes_of_earlier_tests():
    """A shared pool (popgrpo.envs.sandbox.pool.shared_pool) lives until the process exits, and
    its warm sandboxes are children of this process too: close the pools earlier tests left
    open, so that the leak checks here see only the sandboxes these tests start."""
    from popgrpo.envs.sandbox.pool import SandboxPool

    SandboxPool.close_all()


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(LIMITS, max_workers=4) as sb:
        yield sb


def _stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after ``(comm)``: [state, ppid, pgrp, ...]; [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _sandbox_processes() -> dict[int, bytes]:
    """pid → command line of every live sandboxed program started by *this* test process."""
    found = {}
    for pid in _pids():
        stat = _stat(pid)
        if not stat or int(stat[1]) != os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if MARKER in cmdline:
            found[pid] = cmdline
    return found


def _group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid``."""
    return [pid for pid in _pids() if (stat := _stat(pid)) and int(stat[2]) == pgid]


# A program that waits for the test's word (a file ``go`` in its working directory, the bound
# work dir named on bubblewrap's command line) before it sets its score: the tests of
# parallelism and cancelling release such programs instead of timing sleeping ones.
GATED = SandboxLimits(timeout_s=600.0, cpu_s=30, memory_mb=256)


def _gated(score: float) -> str:
    return f"import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)\nscore = {score}"


def _wait_running(n: int, timeout: float = 120) -> dict[int, bytes]:
    """The ``n`` sandboxes of this test process, once all are running (fails if they never are)."""
    deadline = time.monotonic() + timeout
    while len(running := _sandbox_processes()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(running) == n, f"{len(running)} sandboxes ran at once, not {n}"
    return running


def _release(n: int) -> None:
    """Once ``n`` sandboxes run at once, give each its word."""
    for cmdline in _wait_running(n).values():
        work = next(a for a in cmdline.split(b"\0") if MARKER in a).decode()
        with open(os.path.join(work, "go"), "w"):
            pass


def _count_sandboxes(monkeypatch) -> list[int]:
    """A one-item list counting the sandboxes started from now on."""
    from popgrpo.envs.sandbox import spawn as spawn_module  # where the one-shot path looks spawn_child up

    started = [0]
    spawn = spawn_module.spawn_child

    def counted(*args, **kwargs):
        started[0] += 1
        return spawn(*args, **kwargs)

    monkeypatch.setattr(spawn_module, "spawn_child", counted)
    return started


# ----------------------------------------------------------------------------- outcomes


def test_the_global_score_is_the_reward(sandbox):
    assert sandbox.run("score = 0.75") == ExecutionResult(0.75, "ok")
    assert sandbox.run("print('debug line')\nscore = 1\nprint('SCORE: 0.2')") == ExecutionResult(1.0, "ok")
    assert sandbox.run("class F(float):\n    def __float__(self): return 0.0\nscore = F(0.25)").score == 0.25


def test_infinite_loop_times_out_and_leaves_no_process_or_directory():
    with Sandbox(SandboxLimits(timeout_s=1.0), max_workers=1) as sb:
        assert not _sandbox_processes()
        future = sb.submit(["while True: pass"])
        deadline = time.monotonic() + 60  # a wait for it to start, however slowly
        while not (running := _sandbox_processes()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(running) == 1, "the program never showed up in /proc"
        ((pid, cmdline),) = running.items()
        assert os.getpgid(pid) == pid  # its own process group, so killpg reaches all of it
        work = next(a for a in cmdline.split(b"\0") if MARKER in a).decode()
        [result] = future.result(timeout=60)
    assert result.reason == "timeout" and result.score == 0.0
    assert "wall-clock" in result.detail  # the wall-clock limit ended it: it ran until killed
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped: not even a zombie
    assert _group_members(pid) == []
    assert not os.path.exists(os.path.dirname(work))  # the temp directory is gone


def test_cpu_limit_is_a_timeout():
    with Sandbox(SandboxLimits(timeout_s=600.0, cpu_s=1), max_workers=1) as sb:
        result = sb.run("while True: pass")
    assert result.reason == "timeout" and result.score == 0.0
    assert "CPU limit" in result.detail  # RLIMIT_CPU fired (SIGXCPU), not the wall clock


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(10**10)\nscore = 1.0", "x = []\nwhile True:\n    x.append(bytearray(10**6))"],
    ids=["one-huge-allocation", "growing-list"],
)
def test_memory_bomb_hits_the_memory_limit(sandbox, code):
    result = sandbox.run(code)
    assert result.reason == "memory" and result.score == 0.0
    assert "MemoryError" in result.detail


def test_memory_error_caught_by_the_program_is_not_a_failure(sandbox):
    code = "try:\n    x = bytearray(10**10)\nexcept MemoryError:\n    x = None\nscore = 0.25"
    assert sandbox.run(code) == ExecutionResult(0.25, "ok")


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ("raise ValueError('boom')", "ValueError: boom"),
        # The program is its namespace's init, which the kernel spares from default-action
        # signals sent from inside: abort() ends in glibc's fallback fault.
        ("import os\nos.abort()", "killed by SIG"),
        ("import sys\nscore = 1.0\nsys.exit(3)", "exit status 3"),
        ("def f(:\n    pass", "SyntaxError"),
    ],
    ids=["exception", "abort", "exit-status", "syntax-error"],
)
def test_crashes_are_classified_with_their_cause(sandbox, code, needle):
    result = sandbox.run(code)
    assert result.reason == "crash" and result.score == 0.0
    assert needle in result.detail


@pytest.mark.parametrize(
    "code",
    [
        "print('hello')",
        "print(0.5)",
        "score = float('nan')",
        "score = float('inf')",
        "pass",
        "score = '0.5'",
        "score = True",
        "score = 0.5\nimport sys\nsys.exit(0)",
        "score = 0.5\nimport os\nos._exit(0)",
    ],
)
def test_output_that_is_not_a_score(sandbox, code):
    assert sandbox.run(code).reason == "no_score"
    assert sandbox.run(code).score == 0.0


def test_scores_outside_the_range_score_zero(sandbox):
    high, low, edge = sandbox.run_many(["score = 5", "score = -3", "score = 1"])  # the default range is [0, 1]
    assert (high.score, high.reason) == (0.0, "out_of_range")
    assert (low.score, low.reason) == (0.0, "out_of_range")
    assert edge == ExecutionResult(1.0, "ok")
    with Sandbox(LIMITS, max_workers=1, score_range=(-10, 10)) as sb:
        assert sb.run("score = -3") == ExecutionResult(-3.0, "ok")
    for bad in [(1.0, 0.0), None, (0.0, float("inf"))]:
        with pytest.raises(ValueError):
            Sandbox(score_range=bad)


# ----------------------------------------------------------------------------- containment


def test_write_outside_the_working_directory_is_forbidden_and_does_not_happen(sandbox, tmp_path):
    target = tmp_path / "escape.txt"
    result = sandbox.run(f"open({str(target)!r}, 'w').write('x')\nscore = 1.0")
    assert result.reason == "forbidden" and result.score == 0.0
    assert "escape.txt" in result.detail
    assert not target.exists()


def test_forbidden_even_when_the_program_catches_the_refusal(sandbox, tmp_path):
    target = tmp_path / "caught.txt"
    code = f"try:\n    open({str(target)!r}, 'a')\nexcept PermissionError:\n    pass\nscore = 1.0"
    assert sandbox.run(code).reason == "forbidden"
    assert not target.exists()


def test_deleting_or_escaping_through_a_symlink_is_forbidden(sandbox, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    assert sandbox.run(f"import os\nos.remove({str(victim)!r})").reason == "forbidden"
    assert victim.read_text() == "keep me"
    target = tmp_path / "via_link.txt"
    code = f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('x')\nscore = 1.0"
    assert sandbox.run(code).reason == "forbidden"
    assert not target.exists()


def test_writing_inside_the_working_directory_is_allowed(sandbox):
    code = (
        "import os, tempfile\n"
        "os.makedirs('out/deep')\n"
        "with open('out/deep/score.txt', 'w') as f:\n    f.write('0.5')\n"
        "with tempfile.NamedTemporaryFile('w') as t:\n    t.write('scratch')\n"
        "assert os.environ['HOME'] == os.getcwd()\n"
        "score = float(open('out/deep/score.txt').read())"
    )
    assert sandbox.run(code) == ExecutionResult(0.5, "ok")


def test_each_run_gets_a_fresh_empty_directory(sandbox):
    code = "import os\nassert os.listdir('.') == [], os.listdir('.')\nopen('left.txt', 'w').write('x')\nscore = 1.0"
    assert [r.reason for r in sandbox.run_many([code, code, code])] == ["ok"] * 3


def test_environment_is_scrubbed(sandbox, monkeypatch):
    monkeypatch.setenv("POPGRPO_SECRET_TOKEN", "xyz")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("REDIS_PASSWORD", "hunter2")
    monkeypatch.setenv("MY_DB_PASSWORD", "hunter3")
    code = (
        "import os\n"
        "leaks = [k for k in os.environ if 'SECRET' in k or k.startswith(('RAY_', 'REDIS')) or 'PASSWORD' in k]\n"
        "leaks += [k for k, v in os.environ.items() if v in ('xyz', 'hunter2', 'hunter3')]\n"
        "score = 0.0 if leaks else 1.0"
    )
    assert sandbox.run(code) == ExecutionResult(1.0, "ok")


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])\nscore = 1.0",
        "import os\nos.system('true')\nscore = 1.0",
        "import os\npid = os.fork()\nscore = 1.0",
        "import os\nos.execv('/bin/true', ['true'])",
        "import socket\nsocket.socket().connect(('127.0.0.1', 9))",
        f"import os\nos.kill({os.getpid()}, 0)\nscore = 1.0",
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\nscore = 1.0",
    ],
    ids=["subprocess", "os.system", "fork", "exec", "socket", "signal-other-process", "raise-limits"],
)
def test_processes_network_and_limits_are_forbidden(sandbox, code):
    result = sandbox.run(code)
    assert result.reason == "forbidden" and result.score == 0.0


# ----------------------------------------------------------------------------- batches


def test_run_many_keeps_order_and_classifies_each_item(tmp_path):
    codes = [
        "score = 0.75",
        None,
        "while True: pass",
        "raise ValueError('boom')",
        f"open({str(tmp_path / 'x')!r}, 'w')",
        "print('hello')",
        "x = bytearray(10**10)",
        "score = 0.25",
    ]
    with Sandbox(SandboxLimits(timeout_s=1.0, memory_mb=256), max_workers=4) as sb:
        results = sb.run_many(codes)
    assert [r.reason for r in results] == [
        "ok",
        "no_code",
        "timeout",
        "crash",
        "forbidden",
        "no_score",
        "memory",
        "ok",
    ]
    assert [r.score for r in results] == [0.75, 0, 0, 0, 0, 0, 0, 0.25]
    assert all(r.reason in REASONS for r in results)
    assert not _sandbox_processes()


def test_run_many_runs_in_parallel():
    """Four programs that each wait for the test's word all finish: the word is given only once
    all four run at once (one at a time, the first would wait until its limit)."""
    with Sandbox(GATED, max_workers=4) as sb:
        future = sb.submit([_gated(1.0)] * 4)
        _release(4)
        results = future.result(timeout=120)
    assert results == [ExecutionResult(1.0, "ok")] * 4


def test_submit_returns_a_future_before_the_programs_finish():
    with Sandbox(GATED, max_workers=2) as sb:
        future = sb.submit([_gated(0.5), None])
        assert isinstance(future, Future)
        assert not future.done()  # its program waits for the word, given only now
        _release(1)
        done, skipped = future.result(timeout=120)
        nothing = sb.submit([None])
        assert nothing.done() and nothing.result()[0].reason == "no_code"  # nothing to run: done at once
    assert done == ExecutionResult(0.5, "ok")
    assert (skipped.score, skipped.reason) == (0.0, "no_code")


def test_callable_from_several_threads(sandbox):
    results: dict[int, list[ExecutionResult]] = {}

    def worker(i: int) -> None:
        results[i] = sandbox.run_many([f"score = 0.{i}5", f"score = 0.{i}25"])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert {i: [r.score for r in rs] for i, rs in results.items()} == {
        i: [float(f"0.{i}5"), float(f"0.{i}25")] for i in range(3)
    }


def test_cancelling_a_batch_skips_its_queued_programs(monkeypatch):
    started = _count_sandboxes(monkeypatch)
    sb = Sandbox(GATED, max_workers=1)
    first = sb.submit([_gated(1.0)])
    batch = sb.submit(["score = 0.5"] * 3)  # queued behind `first`, which waits for the word
    assert batch.cancel()
    _release(1)
    assert first.result(timeout=120) == [ExecutionResult(1.0, "ok")]
    sb.close()
    assert batch.cancelled()
    assert started == [1]  # `first`'s sandbox only: none was started for the cancelled programs


def test_close_cancels_queued_batches_without_deadlock(monkeypatch):
    started = _count_sandboxes(monkeypatch)
    sb = Sandbox(GATED, max_workers=1)
    first = sb.submit([_gated(1.0)])
    queued = sb.submit(["score = 0.5"] * 3)
    _wait_running(1)
    closing = threading.Thread(target=sb.close)  # close waits for `first`, so off this thread
    closing.start()
    # cancelling queued items runs their callbacks, which cancel the batch, re-entrantly
    _release(1)
    closing.join(timeout=120)
    assert not closing.is_alive(), "close() deadlocked"
    assert first.done() and first.result() == [ExecutionResult(1.0, "ok")]  # close waited for it
    assert queued.cancelled()
    assert started == [1]
    with pytest.raises(CancelledError):
        queued.result()


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxLimits(memory_mb=-1)


def test_closed_sandbox_refuses_work():
    sb = Sandbox(LIMITS, max_workers=1)
    sb.close()
    sb.close()  # idempotent
    with pytest.raises(RuntimeError):
        sb.run("score = 1")


def test_score_completions_end_to_end(sandbox):
    completions = [
        "Let me compute it.\n```python\nscore = 0.5\n```",
        "I cannot write code for this.",
        "```python\nscore = 1.0\n```\nOn second thought:\n```python\nraise SystemExit(2)\n```",
    ]
    rewards, reasons = score_completions(completions, sandbox=sandbox)
    assert rewards == [0.5, 0.0, 0.0]
    assert reasons == ["ok", "no_code", "crash"]
    assert score_completions(completions[:1], timeout_s=2.0) == ([0.5], ["ok"])  # a lazily made default
    with pytest.raises(TypeError):
        score_completions(completions, sandbox=sandbox, timeout_s=1.0)


# ----------------------------------------------------------------------------- parsing


def test_extract_code_takes_the_last_python_block():
    text = "a\n```python\nscore = 1\n```\nb\n```python\nscore = 2\n```\nc"
    assert extract_code(text) == "score = 2\n"
    assert extract_code("```\nscore = 3\n```") == "score = 3\n"
    assert extract_code("```py\nx = 1\nprint(x)\n```") == "x = 1\nprint(x)\n"


def test_extract_code_ignores_other_languages_and_unfinished_blocks():
    # the closing fence of a bash block must not open an untagged block
    assert extract_code("```bash\nls\n```\ntext\n```python\nscore = 3\n```") == "score = 3\n"
    assert extract_code("```python\nscore = 1\n```\n```bash\nrm -rf /\n```") == "score = 1\n"
    assert extract_code("```python\nscore = 1\n```\n```python\nscore = 2") == "score = 1\n"  # cut off mid-block
    assert extract_code("no code at all") is None
    assert extract_code("```python\nscore = 1") is None
    assert extract_code("```python\n   \n```") is None
    assert extract_code("") is None
