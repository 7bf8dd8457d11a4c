"""The sandbox child's message handling, in this process (the rest of it runs in the sandbox tests)."""

import json
import os

import pytest

from popgrpo.envs.sandbox import SandboxLimits
from popgrpo.envs.sandbox import child as sandbox_child
from popgrpo.envs.sandbox.child import parse_limits, read_program, split_header
from popgrpo.envs.sandbox.command import limits_message


def _message(**changes) -> bytes:
    fields = {
        "status_fd": 5,
        "ready_fd": 6,
        "cpu_s": 2,
        "memory_bytes": 1 << 28,
        "file_size_bytes": 1 << 20,
        "nproc": 1,
        "contain": True,
    }
    fields.update(changes)
    return json.dumps({k: v for k, v in fields.items() if v is not None}).encode()


def test_the_parents_message_is_what_the_child_accepts():
    line = limits_message(SandboxLimits(cpu_s=3, memory_mb=64, file_size_mb=2), 7, 8, nproc=0, audit_hook=False)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_limits(line.rstrip(b"\n")) == {
        "status_fd": 7,
        "ready_fd": 8,
        "cpu_s": 3,
        "memory_bytes": 64 << 20,
        "file_size_bytes": 2 << 20,
        "nproc": 0,
        "contain": False,
    }


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (_message(cpu_s=None), "keys"),
        (_message(extra=1), "keys"),
        (_message(contain=1), "contain must be bool"),
        (_message(cpu_s=True), "cpu_s must be int"),
        (_message(cpu_s=1.5), "cpu_s must be int"),
        (_message(nproc=-1), "must not be negative"),
        (_message(memory_bytes=0), "must be positive"),
        (b"[1, 2]", "JSON object"),
    ],
    ids=["missing", "unknown", "int-for-bool", "bool-for-int", "float", "negative", "zero-limit", "not-an-object"],
)
def test_a_malformed_limits_message_is_refused(line, error):
    with pytest.raises(ValueError, match=error):
        parse_limits(line)


def test_header_and_program_are_split_wherever_the_reads_end():
    r, w = os.pipe()
    os.write(w, _message() + b"\nabc123\nscore = 1\n")
    os.close(w)
    header = split_header(r)
    assert header is not None
    line, rest = header
    assert parse_limits(line)["cpu_s"] == 2
    assert read_program(r, rest) == ("abc123", "score = 1\n")


def test_a_closed_pipe_means_no_program():
    r, w = os.pipe()
    os.close(w)
    assert split_header(r) is None
    r, w = os.pipe()
    os.close(w)
    assert read_program(r) is None


def test_the_child_imports_only_the_standard_library():
    # It runs where the package is not visible: any popgrpo import would fail there.
    with open(sandbox_child.__file__) as f:
        source = f.read()
    imports = [line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not [name for name in imports if name.startswith("popgrpo")]
