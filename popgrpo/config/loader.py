"""Reading a config: YAML within bounds, ``--set key=value`` overrides, presets, one-line errors.

:func:`load_config` turns any problem — missing file, bad YAML, unknown key, wrong type,
out-of-range value, unknown choice, inconsistent fields — into
:class:`~popgrpo.config.schema.ConfigError`, whose message names the offending field; the
CLI prints it and exits 2. :func:`load_model` does the same for any other config model
(``popgrpo rm train``'s).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from popgrpo.config.schema import Config, ConfigError
from popgrpo.registry import UnknownChoice

__all__ = [
    "DEFAULT_PRESET",
    "PRESET_DIR",
    "load_args_config",
    "load_config",
    "load_model",
    "parse_override",
    "preset_path",
    "read_yaml",
    "resolve_config_path",
]

M = TypeVar("M", bound=BaseModel)

# The presets are the job configs in jobs/configs/: installed as popgrpo/presets/ by a wheel
# (pyproject's package-dir), read in place from a source checkout or an editable install.
_PACKAGE = Path(__file__).resolve().parents[1]
PRESET_DIR = next(
    (d for d in (_PACKAGE / "presets", _PACKAGE.parent / "jobs" / "configs") if d.is_dir()),
    _PACKAGE.parent / "jobs" / "configs",
)

# What a config may cost to read. A YAML "billion laughs" (anchors nesting aliases of
# aliases) is a few hundred bytes that expand to 9^9 leaves: counting nodes as if every
# alias were expanded stops it while composing, before any object is built. Deep nesting is
# cut off before Python's recursion limit.
MAX_CONFIG_BYTES = 10 * 2**20
MAX_YAML_NODES = 200_000  # after alias expansion; a full config has a few hundred
MAX_YAML_ALIASES = 1_000
MAX_YAML_DEPTH = 64


class _TooComplex(yaml.YAMLError):
    """A YAML document over the limits above."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader with bounded alias expansion, node count and nesting depth."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0  # nodes composed so far, each alias counted as the size of its target
        self._aliases = 0
        self._size: dict[int, int] = {}  # id(node) → nodes under it, aliases expanded

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _TooComplex(f"more than {MAX_YAML_ALIASES} aliases")
            node = super().compose_node(parent, index)
            self._count(self._size.get(id(node), 1))
            return node
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _TooComplex(f"nested deeper than {MAX_YAML_DEPTH} levels")
        before = self._nodes
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._count(1)
        self._size[id(node)] = self._nodes - before
        return node

    def _count(self, n: int) -> None:
        self._nodes += n
        if self._nodes > MAX_YAML_NODES:
            raise _TooComplex(f"more than {MAX_YAML_NODES:,} values once its aliases are expanded")


def _safe_load(text: str) -> Any:
    """``yaml.safe_load`` within the limits of :class:`_BoundedLoader`."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"grpo.lr=1e-3"`` → ``(["grpo", "lr"], 0.001)``; the value is parsed as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {item!r}")
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"--set {key}: value longer than {MAX_CONFIG_BYTES:,} characters")
    try:
        value = _safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot parse value: {exc}".replace("\n", " ")) from None
    return key.strip().split("."), value


def _apply_override(data: dict, path: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {'.'.join(path[: i + 1])} is not a section")
        node = child
    node[path[-1]] = value


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; a config is a few KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})") from None
    try:
        data = _safe_load(text)
    except _TooComplex as exc:
        raise ConfigError(f"{path}: YAML too large or deep: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: a hostile value must not flood the one-line message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _format_validation_error(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(config)"
        msg = err["msg"].removeprefix("Value error, ")
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, UnknownChoice):  # already "<field>: unknown … 'x'; choices: …"
            parts.append(str(cause))
            continue
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict):
            msg = f"{msg} (got {_short_repr(err['input'])})"
        parts.append(f"{field}: {msg}")
    return f"invalid config{source}: " + "; ".join(parts)


def load_model(model: type[M], path: str | Path | None = None, overrides: Iterable[str] = ()) -> M:
    """Load YAML (``{}`` when ``path`` is None), apply ``key=value`` overrides, validate as ``model``.

    Raises:
        ConfigError: with a one-line message naming the field at fault.
    """
    data = copy.deepcopy(read_yaml(Path(path))) if path is not None else {}
    for item in overrides:
        key_path, value = parse_override(item)
        _apply_override(data, key_path, value)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        source = f" ({path})" if path is not None else ""
        raise ConfigError(_format_validation_error(exc, source)) from None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """The run :class:`~popgrpo.config.schema.Config` of YAML ``path`` (defaults when None) and
    ``key=value`` overrides (:func:`load_model`); raises :class:`ConfigError`."""
    return load_model(Config, path, overrides)


def preset_path(name: str) -> Path:
    """Path of a shipped preset (``grpo``, ``qd_grpo``, ``maxent_grpo``, ``pop_grpo``)."""
    return PRESET_DIR / f"{name}.yaml"


DEFAULT_PRESET = "pop_grpo"


def resolve_config_path(value: str | None) -> Path:
    """A file path, or a preset name (``grpo``, ``qd_grpo``, ``maxent_grpo``, ``pop_grpo``)."""
    if value is None:
        return preset_path(DEFAULT_PRESET)
    path = Path(value)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in value:
        return path
    preset = preset_path(value)
    if preset.exists():
        return preset
    raise ConfigError(f"config file not found: {value} (and no preset named {value!r})")


def load_args_config(args) -> Config:
    """The validated config of a command line's ``--config`` (file or preset), ``--set`` overrides and ``--seed``.

    ``args`` is an :class:`argparse.Namespace` with ``config``, ``set`` and ``seed`` (``popgrpo
    train`` and ``popgrpo submit`` share these options).
    """
    overrides = list(args.set or [])
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    return load_config(resolve_config_path(args.config), overrides)
