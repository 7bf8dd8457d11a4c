"""The program in a completion: its last fenced Python block."""

from __future__ import annotations

import re

__all__ = ["extract_code"]

_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,})[ \t]*([\w.+-]*)[^\n`]*$")
_PYTHON_TAGS = frozenset({"", "python", "python3", "py", "py3"})


def extract_code(completion: str) -> str | None:
    """The last fenced block tagged ``python``/``py`` (or untagged) in ``completion``; else None.

    Parsed line by line rather than with one regex so that the closing fence of a block in
    another language (```` ```bash ````) is never mistaken for the opening of an untagged one,
    and so that an unterminated final block (generation cut off) is not run half-written.
    Blocks that are empty or only whitespace count as no code.
    """
    last: str | None = None
    fence: str | None = None  # the opening backticks of the block we are in
    tag = ""
    body: list[str] = []
    for line in completion.splitlines():
        if fence is None:
            m = _FENCE_OPEN.match(line)
            if m:
                fence, tag, body = m.group(1), m.group(2).lower(), []
        elif line.strip().startswith(fence) and set(line.strip()) == {"`"}:
            if tag in _PYTHON_TAGS and "\n".join(body).strip():
                last = "\n".join(body) + "\n"
            fence = None
        else:
            body.append(line)
    return last
