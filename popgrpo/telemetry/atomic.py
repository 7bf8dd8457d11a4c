"""Files replaced atomically: written under a temporary name beside the target, then renamed.

A reader (a resumed run, Grafana's provider rescanning its folder, a user's notebook) sees the
previous complete file or the new one, never half a file; a writer that dies mid-write leaves
only a hidden ``.NAME.tmp`` behind, which the next write replaces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "atomic_write"]


@contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """A temporary path to write ``target``'s new content to; renamed over ``target`` when the
    block ends without an exception (removed when it raises)."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)


def atomic_write(target: str | Path, data: bytes | str) -> Path:
    """Replace ``target`` with ``data`` (text is written as UTF-8)."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(target)
