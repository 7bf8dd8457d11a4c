"""Reading a config: YAML within bounds, ``--set key=value`` overrides, presets, one-line errors.

:func:`load_config` turns any problem — missing file, bad YAML, unknown key, wrong type,
out-of-range value, unknown choice, inconsistent fields — into
:class:`~popgrpo.config.schema.ConfigError`, whose message names the offending field; the
CLI prints it and exits 2. :func:`load_model` does the same for any other config model
(``popgrpo rm train``'s).
"""

from __future__ import annotations

import copy
import difflib
import re
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from popgrpo.config.schema import Config, ConfigError
from popgrpo.registry import UnknownChoice

__all__ = [
    "DEFAULT_PRESET",
    "PRESET_DIR",
    "field_name",
    "list_presets",
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


# One dotted part of a --set key: a name, then any list indices (``rewards[0]``).
_KEY_PART = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")

KeyPath = list[str | int]  # field names and list indices: env.text.rewards[0].fn → ["env", "text", "rewards", 0, "fn"]


def field_name(path: Sequence[str | int]) -> str:
    """``["env", "text", "rewards", 0, "fn"]`` → ``"env.text.rewards[0].fn"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _key_path(key: str) -> KeyPath:
    """``"env.text.rewards[0].fn"`` → ``["env", "text", "rewards", 0, "fn"]``; ConfigError if malformed."""
    path: KeyPath = []
    for part in key.split("."):
        match = _KEY_PART.fullmatch(part)
        if match is None:
            raise ConfigError(
                f"--set {key}: cannot read the key (dotted field names, list items as name[index], "
                "e.g. env.text.rewards[0].fn)"
            )
        path.append(match.group(1))
        path += [int(i) for i in re.findall(r"\[(\d+)\]", match.group(2))]
    return path


def parse_override(item: str) -> tuple[KeyPath, Any]:
    """``"grpo.lr=1e-3"`` → ``(["grpo", "lr"], 0.001)``; the value is parsed as YAML.

    A list item is named by its index: ``env.text.rewards[0].fn=m:f`` →
    ``(["env", "text", "rewards", 0, "fn"], "m:f")``.
    """
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {item!r}")
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"--set {key}: value longer than {MAX_CONFIG_BYTES:,} characters")
    try:
        value = _safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: cannot parse value: {exc}".replace("\n", " ")) from None
    return _key_path(key.strip()), value


def _apply_override(data: dict, path: KeyPath, value: Any, defaults: Any = None) -> None:
    """Set ``path`` in ``data`` to ``value``. A list the file does not give starts as the
    model's default (``defaults``: the model's defaults as plain data); index ``len(list)``
    appends an item."""
    node: Any = data
    for i, part in enumerate(path[:-1]):
        where = field_name(path[: i + 1])
        nxt = path[i + 1]
        defaults = _child(defaults, part)
        if isinstance(part, int):
            child = _list_item(node, part, path, i, {} if isinstance(nxt, str) else [])
        else:
            if not isinstance(node, dict):
                raise ConfigError(f"--set {field_name(path)}: {field_name(path[:i]) or 'the config'} is not a section")
            if part not in node:  # the default, or a new section / list
                node[part] = copy.deepcopy(defaults) if defaults is not None else {} if isinstance(nxt, str) else []
            child = node[part]
        if isinstance(nxt, int) and not isinstance(child, list):
            raise ConfigError(f"--set {field_name(path)}: {where} is not a list")
        if isinstance(nxt, str) and not isinstance(child, dict):
            raise ConfigError(f"--set {field_name(path)}: {where} is not a section")
        node = child
    last = path[-1]
    if isinstance(last, int):
        _list_item(node, last, path, len(path) - 1, value)
        node[last] = value
    else:
        node[last] = value


def _child(defaults: Any, part: str | int) -> Any:
    if isinstance(part, int):
        return defaults[part] if isinstance(defaults, list) and part < len(defaults) else None
    return defaults.get(part) if isinstance(defaults, dict) else None


def _list_item(items: list, index: int, path: KeyPath, at: int, new: Any) -> Any:
    """``items[index]``; ``index == len(items)`` appends ``new`` first; beyond that, ConfigError."""
    if index == len(items):
        items.append(new)
    elif index > len(items):
        raise ConfigError(
            f"--set {field_name(path)}: {field_name(path[:at])} has {len(items)} item(s); "
            f"index {index} is out of range (index {len(items)} appends one)"
        )
    return items[index]


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


def _unwrap(tp: Any) -> Any:
    """``Annotated[X, …]`` and ``X | None`` → ``X``."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _model_at(model: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The config section (model class) at ``path`` of ``model``; None where there is none."""
    tp: Any = model
    for part in path:
        tp = _unwrap(tp)
        if isinstance(part, int):
            if get_origin(tp) is not list:
                return None
            tp = get_args(tp)[0]
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


# An unknown key's section lists its keys when it has at most this many; larger ones point to the reference.
_LISTED_KEYS = 12


def _unknown_key(model: type[BaseModel], loc: Sequence[str | int]) -> str:
    """What to say of the unknown key at ``loc``: close matches among its section's keys, or the keys."""
    section = _model_at(model, loc[:-1])
    if section is None:
        return "unknown key"
    names = list(section.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=3, cutoff=0.6)
    if close:
        return "unknown key (did you mean " + " or ".join(field_name([*loc[:-1], c]) for c in close) + "?)"
    where = field_name(loc[:-1]) or "the config"
    if len(names) <= _LISTED_KEYS:
        return f"unknown key; the keys of {where}: {', '.join(names)}"
    return f"unknown key; `popgrpo config --markdown` lists the keys of {where}"


def _source(loc: Sequence[str | int], path: str | Path | None, overrides: Sequence[tuple[KeyPath, str]]) -> str:
    """Where the value at ``loc`` came from: the last ``--set`` that wrote it, a section above it
    or a field below it (a section's own check), else the file (the built-in defaults without one)."""
    loc = list(loc)
    for key_path, item in reversed(overrides):
        n = min(len(key_path), len(loc))
        if n and key_path[:n] == loc[:n]:
            return f"--set {item if len(item) <= 80 else item[:77] + '...'}"
    return str(path) if path is not None else "the defaults"


def _format_validation_error(
    exc: ValidationError,
    model: type[BaseModel],
    path: str | Path | None,
    overrides: Sequence[tuple[KeyPath, str]] = (),
) -> str:
    """One line: ``invalid config (SOURCE): field: what is wrong; …``, SOURCE the file or the ``--set``
    the faulty value came from, so the user edits the right thing."""
    parts, sources = [], []
    for err in exc.errors():
        loc = list(err["loc"])
        field = field_name(loc) or "(config)"
        msg = err["msg"].removeprefix("Value error, ")
        cause = err.get("ctx", {}).get("error")
        if loc or not overrides:
            new = [_source(loc, path, overrides)]
        else:  # a check across sections: the file, and the --set of each field the message names
            named = [item for key_path, item in overrides if re.search(rf"\b{re.escape(field_name(key_path))}\b", msg)]
            new = [*([str(path)] if path is not None else []), *(f"--set {item}" for item in named)]
        sources += [s for s in new if s not in sources]
        if isinstance(cause, UnknownChoice):  # already "<field>: unknown … 'x'; choices: …"
            parts.append(str(cause))
            continue
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(model, loc)
        elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict):
            msg = f"{msg} (got {_short_repr(err['input'])})"
        parts.append(f"{field}: {msg}")
    source = f" ({', '.join(sources)})" if sources and sources != ["the defaults"] else ""
    return f"invalid config{source}: " + "; ".join(parts)


def load_model(model: type[M], path: str | Path | None = None, overrides: Iterable[str] = ()) -> M:
    """Load YAML (``{}`` when ``path`` is None), apply ``key=value`` overrides, validate as ``model``.

    Raises:
        ConfigError: with a one-line message naming the field at fault, and the file or the
            ``--set`` its value came from.
    """
    data = copy.deepcopy(read_yaml(Path(path))) if path is not None else {}
    applied: list[tuple[KeyPath, str]] = []
    defaults: Any = None
    for item in overrides:
        key_path, value = parse_override(item)
        if defaults is None and any(isinstance(p, int) for p in key_path):
            defaults = _defaults(model)
        _apply_override(data, key_path, value, defaults)
        applied.append((key_path, item))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, model, path, applied)) from None


def _defaults(model: type[BaseModel]) -> Any:
    """The model's defaults as plain data (None when it has required fields)."""
    try:
        return model().model_dump(mode="json")
    except ValidationError:
        return None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """The run :class:`~popgrpo.config.schema.Config` of YAML ``path`` (defaults when None) and
    ``key=value`` overrides (:func:`load_model`); raises :class:`ConfigError`."""
    return load_model(Config, path, overrides)


def preset_path(name: str) -> Path:
    """Path of a shipped preset (``grpo``, ``qd_grpo``, ``maxent_grpo``, ``pop_grpo``; :func:`list_presets`)."""
    return PRESET_DIR / f"{name}.yaml"


DEFAULT_PRESET = "pop_grpo"


def list_presets() -> list[tuple[str, str]]:
    """Every shipped preset as ``(name, what it is)``, by name; what it is: the first sentence or
    clause of the comment the preset file starts with."""
    out = []
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        comment = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            text = line.lstrip("#").strip()
            if not text:
                break
            comment.append(text)
        first = " ".join(comment)
        cut = min((i for i in (first.find(": "), first.find(". ")) if i > 0), default=len(first))
        out.append((path.stem, first[:cut].rstrip(".")))
    return out


def resolve_config_path(value: str | None) -> Path:
    """A file path, or a preset name (:func:`list_presets`); the default preset for None.

    Raises:
        ConfigError: neither exists; the message names close presets and lists them all.
    """
    if value is None:
        return preset_path(DEFAULT_PRESET)
    path = Path(value)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in value:
        return path
    preset = preset_path(value)
    if preset.exists():
        return preset
    names = [name for name, _ in list_presets()]
    close = difflib.get_close_matches(value, names, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    raise ConfigError(
        f"--config {value}: not found: no such file and no preset of that name{hint}; "
        f"presets: {', '.join(names)} (`popgrpo config --list` says what each is)"
    )


def load_args_config(args) -> Config:
    """The validated config of a command line's ``--config`` (file or preset), ``--set`` overrides and ``--seed``.

    ``args`` is an :class:`argparse.Namespace` with ``config``, ``set`` and ``seed`` (``popgrpo
    train`` and ``popgrpo submit`` share these options).
    """
    overrides = list(args.set or [])
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    return load_config(resolve_config_path(args.config), overrides)
