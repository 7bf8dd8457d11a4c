"""The test helpers' promise: nothing a test starts outlives it, even if pytest is SIGKILLed."""

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.services import require_binary, run_isolated

ROOT = Path(__file__).resolve().parent.parent


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie awaiting its reaper counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_redis_server_dies_with_a_sigkilled_test_process(tmp_path):
    require_binary("redis-server")
    fake_pytest = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom tests.services import RedisServer\n"
         f"server = RedisServer({str(tmp_path)!r})\nprint(server.proc.pid, flush=True)\ntime.sleep(600)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    redis_pid = int(fake_pytest.stdout.readline())
    assert not _gone(redis_pid, timeout=0.2)
    fake_pytest.send_signal(signal.SIGKILL)  # no finally, no atexit: only the watchdog can act
    fake_pytest.wait()
    assert _gone(redis_pid), f"redis-server {redis_pid} outlived the process that started it"


def test_an_isolated_driver_is_killed_with_its_children_at_its_timeout():
    code = "import subprocess, time\nprint(subprocess.Popen(['sleep', '600']).pid, flush=True)\ntime.sleep(600)\n"
    done = run_isolated([sys.executable, "-c", code], timeout=3)
    assert done.returncode == -signal.SIGKILL and "killed after the 3 s timeout" in done.stdout
    assert _gone(int(done.stdout.split()[0]))
