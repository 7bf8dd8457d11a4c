"""Escapes an attacker tried against the execution reward, each checked from outside the sandbox.

Every program runs through :func:`popgrpo.envs.rewards.execution_score` with its default limits
(the audit hook and the kernel layer together), and the escapes that do not depend on Python
also run with the audit hook's refusals switched off (``kernel``): bubblewrap and seccomp must
contain them on their own. What is checked never trusts the program: files on the host, a
loopback listener of the test's own, processes still alive, signals this process received,
secrets the program could only have found by reading another process.

A program signals "my attack worked" by setting ``score = 1.0`` and "it failed, I finished" by
``score = 0.25``; the assertions on the outside hold either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from popgrpo.envs.rewards import execution_score
from popgrpo.envs.sandbox import Sandbox, SandboxLimits

# The shipped lm_exec job's template: the completion is an expression, the score is computed after it.
LM_EXEC_TEMPLATE = """value = ({code})
target = int({prompt}.split()[1].rstrip(':'))
score = max(0.0, 1.0 - abs(value - target) / target) if type(value) in (int, float) else 0.0"""


pytestmark = pytest.mark.requires("sandbox")


@pytest.fixture(scope="module")
def kernel_only():
    """A sandbox whose audit hook refuses nothing: only namespaces and seccomp stand in the way."""
    with Sandbox(SandboxLimits(), max_workers=2, site_packages=False, _audit_hook=False) as sb:
        yield sb


def run(code: str, **kwargs) -> tuple[float, str]:
    """One program through the reward function with its default limits: (score, reason)."""
    kwargs.setdefault("site_packages", False)
    scores, reasons = execution_score(["make 24:"], [code], fenced=False, **kwargs)
    return scores[0], reasons[0]


def both_layers(code: str, kernel_only: Sandbox) -> list[tuple[float, str]]:
    """The program with every layer, then with the kernel layer alone."""
    result = kernel_only.run(code)
    return [run(code), (result.score, result.reason)]


def _marked_processes(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.fixture
def marker():
    """A string that names the processes a program tries to leave behind; any found are killed."""
    tag = f"popgrpo-escape-{uuid.uuid4().hex}"
    yield tag
    for pid in _marked_processes(tag):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def host_targets(tmp_path):
    """Places outside the work dir a program would write to: the test's own folder, and the
    interpreter's prefix, which is visible (read-only) inside the sandbox."""
    name = f"popgrpo-escape-{uuid.uuid4().hex}"
    targets = [tmp_path / name, __import__("pathlib").Path(sys.base_prefix) / name]
    yield targets
    for target in targets:
        with contextlib.suppress(OSError):
            target.unlink()


# ----------------------------------------------------------------------------- files


@pytest.mark.parametrize(
    "attack",
    [
        # dir_fd: the hook checked the path against the working directory, not against dir_fd
        "d = os.open(os.path.dirname(T), os.O_RDONLY)\n"
        "fd = os.open(os.path.basename(T), os.O_WRONLY | os.O_CREAT, dir_fd=d)\nos.write(fd, b'x')",
        "os.mkfifo(T)",
        "os.mknod(T, 0o600 | stat.S_IFREG)",
        "sqlite3.connect(':memory:').execute('ATTACH DATABASE ? AS x', (T,)).connection.execute('CREATE TABLE x.t(a)')",
        "c = sqlite3.connect(':memory:')\nc.execute('CREATE TABLE t(a)')\nc.execute('VACUUM INTO ?', (T,))",
    ],
    ids=["dir_fd", "mkfifo", "mknod", "sqlite-attach", "sqlite-vacuum-into"],
)
def test_no_write_outside_the_work_dir(attack, host_targets, kernel_only):
    for target in host_targets:
        code = f"import os, sqlite3, stat\nT = {str(target)!r}\ntry:\n" + "".join(
            f"    {line}\n" for line in attack.splitlines()
        )
        code += "except Exception:\n    pass\nscore = 1.0 if os.path.exists(T) else 0.25"
        for score, reason in both_layers(code, kernel_only):
            assert score != 1.0, reason
        assert not target.exists(), f"{attack!r} created {target}"


# ----------------------------------------------------------------------------- processes

SURVIVORS = {
    "fork_exec-setsid": (
        "import _posixsubprocess, os\n"
        "args = [b'/bin/sh', b'-c', b'sleep 30', MARKER.encode()]\n"
        "_posixsubprocess.fork_exec(args, [b'/bin/sh'], True, (), None, None, -1, -1, -1, -1, -1, -1,"
        " *os.pipe(), True, True, -1, None, None, None, -1, None, False)\n"
    ),
    "spawnv_passfds": (
        "import multiprocessing.util\n"
        "multiprocessing.util.spawnv_passfds(b'/bin/sh', [b'sh', b'-c', b'sleep 30', MARKER.encode()], [])\n"
    ),
    "fork-setsid": (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sh', ['sh', '-c', 'sleep 30', MARKER])\n"
    ),
    "subinterpreter": (
        "import _xxsubinterpreters as interpreters\n"
        "interpreters.run_string(interpreters.create(),"
        " f\"import os\\nos.posix_spawn('/bin/sh', ['sh', '-c', 'sleep 30', {MARKER!r}], {{}}, setsid=True)\")\n"
    ),
    "thread": "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n",
}


@pytest.mark.parametrize("attack", list(SURVIVORS), ids=list(SURVIVORS))
def test_nothing_outlives_the_program(attack, marker, kernel_only):
    code = f"MARKER = {marker!r}\ntry:\n" + "".join(f"    {line}\n" for line in SURVIVORS[attack].splitlines())
    code += "    score = 1.0\nexcept BaseException:\n    score = 0.25\n"
    for score, reason in both_layers(code, kernel_only):
        assert score != 1.0, reason
        assert _marked_processes(marker) == []


def test_a_fork_split_does_not_multiply_the_memory_limit(kernel_only):
    """3 × 400 MiB in three processes, each under a 512 MiB limit: no second process starts."""
    code = (
        "import os, time\nstarted = 0\n"
        "for _ in range(3):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            x = bytearray(400 * 2**20)\n            time.sleep(5)\n            os._exit(0)\n"
        "        started += 1\n"
        "    except OSError:\n        pass\n"
        "score = 1.0 if started else 0.25"
    )
    for score, reason in both_layers(code, kernel_only):
        assert score != 1.0, reason


# ----------------------------------------------------------------------------- signals


@pytest.fixture
def victim():
    """A process of the test's own the program would like to kill, and the count of SIGUSR2s this
    test process receives while the program runs (a handler, so a failure cannot end pytest)."""
    received = []
    previous = signal.signal(signal.SIGUSR2, lambda *_: received.append(1))
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc, received
    finally:
        proc.kill()
        proc.wait()
        signal.signal(signal.SIGUSR2, previous)


def test_no_signal_reaches_the_trainer_or_its_processes(victim, kernel_only):
    # Only targeted signals: a broken sandbox must not be able to end pytest or anyone else's
    # processes (no kill(-1, ...), SIGUSR2 where the target is pytest itself).
    proc, received = victim
    code = (
        "import os, signal\nhit = 0\n"
        f"for pid, sig in (({proc.pid}, signal.SIGKILL), ({os.getpid()}, signal.SIGUSR2), (os.getppid(), signal.SIGUSR2)):\n"
        "    try:\n        os.kill(pid, sig)\n        hit += pid > 1\n    except Exception:\n        pass\n"
        "    try:\n        signal.pidfd_send_signal(os.pidfd_open(pid), sig)\n        hit += 1\n    except Exception:\n        pass\n"
        "score = 1.0 if hit else 0.25"
    )
    for score, reason in both_layers(code, kernel_only):
        assert score != 1.0, reason
    time.sleep(0.1)
    assert proc.poll() is None, "the victim was killed"
    assert received == []


# ----------------------------------------------------------------------------- secrets


def test_no_other_process_environment_or_memory_is_readable(kernel_only):
    secret = f"popgrpo-secret-{uuid.uuid4().hex}"
    env = {**os.environ, "POPGRPO_TEST_SECRET": secret}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        code = (
            "import os\nfound = False\n"
            f"pids = [{proc.pid}, {os.getpid()}, os.getppid(), 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
            "for pid in pids:\n"
            "    for name in ('environ', 'cmdline', 'mem'):\n"
            "        try:\n"
            "            with open(f'/proc/{pid}/{name}', 'rb') as f:\n"
            "                data = f.read(1 << 20)\n"
            "            found = found or b'POPGRPO_TEST_SECRET=' in data\n"
            "        except Exception:\n"
            "            pass\n"
            "score = 1.0 if found else 0.25"
        )
        for score, reason in both_layers(code, kernel_only):
            assert score != 1.0, reason
    finally:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------- network


@pytest.mark.parametrize("via", ["socket", "ctypes"])
def test_no_connection_to_a_loopback_listener(via, kernel_only):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        if via == "socket":
            attack = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        else:  # libc directly: no audit event at all
            attack = (
                "import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)\n"
                f"addr = struct.pack('=HH4s8x', socket.AF_INET, socket.htons({port}), socket.inet_aton('127.0.0.1'))\n"
                "assert libc.connect(fd, addr, len(addr)) == 0"
            )
        code = "try:\n" + "".join(f"    {line}\n" for line in attack.splitlines())
        code += "    score = 1.0\nexcept BaseException:\n    score = 0.25"
        for score, reason in both_layers(code, kernel_only):
            assert score != 1.0, reason
        with pytest.raises(TimeoutError):
            listener.accept()


# ----------------------------------------------------------------------------- the audit hook


def test_the_audit_hook_cannot_be_neutered(tmp_path):
    target = tmp_path / "after-neutering"
    attacks = [
        # find the hook's state through the garbage collector and clear it
        "import gc\nfor o in gc.get_objects():\n    if isinstance(o, dict) and 'violated' in o:\n        o['violated'] = True",
        # the hook's checks used the builtin isinstance
        "import builtins\nbuiltins.isinstance = lambda *a: False\nbuiltins.any = lambda *a: False",
        # a trace function sees every frame, the hook's included
        "import sys\nsys.settrace(lambda *a: None)",
    ]
    for attack in attacks:
        code = attack + f"\nopen({str(target)!r}, 'w').write('x')\nscore = 1.0"
        assert run(code) == (0.0, "forbidden"), attack
        assert not target.exists()


# ----------------------------------------------------------------------------- scores


@pytest.mark.parametrize(
    ("completion", "reason"),
    [
        ("(print(1e30), __import__('sys').exit(0))", "no_score"),  # the hack from the shipped job
        ("(print(1.0), __import__('os')._exit(0))", "no_score"),
        ("__import__('builtins').exec('score = 1e300')", "ok"),  # the template's own score comes last...
        ("target", "crash"),  # the target does not exist yet
        # patched builtins the template uses after the code: the program has a copy of its own
        ("(setattr(__import__('builtins'), 'int', lambda s: 3), 3)[1]", "ok"),
        ("(setattr(__import__('builtins'), 'abs', lambda x: 0), 3)[1]", "ok"),
        ("type('V', (), {'__sub__': lambda s, o: 0, '__rsub__': lambda s, o: 0})()", "ok"),  # ...typed: 0
    ],
    ids=["print-and-exit", "print-and-_exit", "exec-score", "read-target", "patch-int", "patch-abs", "lazy-object"],
)
def test_lm_exec_completions_cannot_forge_their_score(completion, reason):
    score, got = run(completion, template=LM_EXEC_TEMPLATE)
    assert got == reason
    assert score == (0.125 if "setattr" in completion else 0.0)  # 3 for a target of 24: 1 - 21/24


def test_lm_exec_honest_answers_still_score():
    assert run("4 * 6", template=LM_EXEC_TEMPLATE) == (1.0, "ok")
    assert run("12", template=LM_EXEC_TEMPLATE) == (0.5, "ok")


@pytest.mark.parametrize(
    "attack",
    [
        "score = 1e30",
        "score = -1",
        # write a score line on every descriptor, then leave before the end
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'score\\t' + b'0' * 32 + b'\\t0x1.0p+0\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)",
        # call the reporting event directly, then leave
        "import sys, os\ntry:\n    sys.audit('popgrpo.score', 1.0)\nexcept PermissionError:\n    pass\nos._exit(0)",
        # look for the nonce in the bootstrap's frame, then report from there
        "import sys, os, re\nf = sys._getframe(1)\nfound = [v for v in f.f_locals.values() if isinstance(v, str) and re.fullmatch('[0-9a-f]{32}', v)]\n"
        "for n in found:\n    os.write(int(sys.argv[0]) if False else 4, ('score\\t' + n + '\\t0x1.0p+0\\n').encode())\nos._exit(0)",
        # scan its own memory for the nonce (no /proc in the sandbox, ctypes unavailable)
        "import os, re\nfound = set()\ntry:\n    import ctypes\nexcept ImportError:\n    pass\n"
        "try:\n    maps = open('/proc/self/maps').read().splitlines()\n    mem = open('/proc/self/mem', 'rb')\n"
        "    for line in maps:\n        lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "        try:\n            mem.seek(lo)\n            found |= set(re.findall(rb'[0-9a-f]{32}', mem.read(min(hi - lo, 1 << 24))))\n"
        "        except (OSError, ValueError, OverflowError, MemoryError):\n            pass\nexcept OSError:\n    pass\n"
        "for n in found:\n    for fd in range(3, 16):\n        try:\n            os.write(fd, b'score\\t' + n + b'\\t0x1.0p+0\\n')\n"
        "        except OSError:\n            pass\nos._exit(0)",
        # register a frame of its own as the bootstrap's
        "import sys\ntry:\n    sys.audit('popgrpo.begin')\nexcept PermissionError:\n    pass\nscore = 0.5",
    ],
    ids=["too-high", "too-low", "write-every-fd", "audit-event", "frame-nonce", "memory-nonce", "re-register"],
)
def test_a_program_cannot_report_a_score_it_did_not_end_with(attack):
    score, reason = run(attack)
    assert score == 0.0
    assert reason in ("out_of_range", "no_score", "forbidden")


def test_a_program_must_run_to_its_end():
    assert run("score = 0.75") == (0.75, "ok")
    assert run("score = 0.75\nraise SystemExit(0)") == (0.0, "no_score")
    assert run("score = 0.75\nimport os\nos._exit(0)") == (0.0, "no_score")
