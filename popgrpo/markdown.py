"""Markdown tables: the one writer behind every report, reference page and benchmark section.

Reports (:mod:`popgrpo.research.study`), the reference pages (:mod:`popgrpo.config.reference`,
:mod:`popgrpo.telemetry.live`) and the benchmarks' sections of BENCHMARKS.md all write their
tables with :func:`md_table`, so a table looks the same wherever it is drawn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["md_table"]

_RULES = {"l": "---", "r": "---:"}


def md_table(header: Sequence[object], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A Markdown table of ``header`` and ``rows``, cells written with ``str``, without a final newline.

    ``align``: one letter per column, ``l`` (left, the default) or ``r`` (right: ``---:``).
    """
    if align is not None and (len(align) != len(header) or set(align) - set(_RULES)):
        raise ValueError(f"align {align!r}: one of 'l' or 'r' for each of the {len(header)} columns")
    rules = [_RULES[a] for a in align or "l" * len(header)]
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "| " + " | ".join(rules) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
