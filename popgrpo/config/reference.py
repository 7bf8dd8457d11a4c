"""The config reference: a Markdown table generated from the field descriptions.

``popgrpo config --markdown`` prints it; ``make docs-reference`` (docs/gen_reference.py)
writes it into docs/reference/config.md, and a test fails when that page is stale. A field
backed by a registry of :mod:`popgrpo.registry` gets its built-in choices appended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from popgrpo.config.schema import Config
from popgrpo.markdown import md_table
from popgrpo.registry import REGISTRIES, Registry

__all__ = ["config_markdown", "model_markdown"]

_EXTEND = "plugins add more: docs/guides/extend.md"


def model_markdown(
    model: type[BaseModel], choices: Mapping[str, Registry[Any]] | None = None, escape: bool = True
) -> str:
    """``| key | default | meaning |`` rows of every field of ``model``, nested sections flattened.

    ``choices``: field key → the registry its values name; the row gets the registry's built-in
    names. ``escape``: ``<`` and ``>`` outside code spans become entities (Markdown would take
    ``<name>`` for an HTML tag).
    """
    rows: list[list[str]] = []
    choices = choices or {}

    def walk(section: type[BaseModel], prefix: str) -> None:
        for name, field in section.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = field.get_default(call_default_factory=True)
            text = field.description or ""
            registry = choices.get(f"{prefix}{name}")
            if registry is not None:
                names = ", ".join(f"`{n}`" for n in registry.builtin_names())
                text += f" Built-in choices: {names} ({_EXTEND})."
            rows.append([f"`{prefix}{name}`", f"`{default}`", _markdown_text(text) if escape else text])

    walk(model, "")
    return md_table(["key", "default", "meaning"], rows) + "\n"


def config_markdown() -> str:
    """The run config's reference table."""
    return model_markdown(Config, {r.field: r for r in REGISTRIES})


def _markdown_text(text: str) -> str:
    """``text`` with ``<`` and ``>`` outside code spans escaped, so Markdown renders
    ``runs/<name>`` as written instead of taking ``<name>`` for an HTML tag."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside backticks
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)
