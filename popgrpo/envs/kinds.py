"""What an ``env.kind`` brings besides its environment: one registered object per kind.

:data:`popgrpo.registry.ENVIRONMENTS` maps each ``env.kind`` to an :class:`EnvKind`. It builds
the environment (called like the plain factory a plugin may register instead, see
:func:`env_kind`) and answers what depends on which environment it is, so no code outside the
registry asks for an environment by name:

=====================  ======================  ======================  =============================
                       ``idea``                ``text``                ``code``
=====================  ======================  ======================  =============================
builds                 :func:`~popgrpo.envs.   :func:`~popgrpo.envs.   :func:`~popgrpo.envs.code_env`
                       idea_env`               text_env`
inputs checked before  none                    none here (reward       the problem set: every row
the run                                        callables and prompts:  loads and has its tests
                                               :mod:`popgrpo.          (:func:`~popgrpo.envs.code.
                                               preflight`)             check_problems`)
prompts are problems   no                      no                      yes: ``popgrpo eval`` scores
with tests                                                             its runs
=====================  ======================  ======================  =============================

Facts the config reads without importing anything are traits of the registry entry instead
(:meth:`popgrpo.registry.Registry.trait`): ``ideas`` (vector or text) and ``inputs``
(``env.text``: the kind reads its prompts and reward callables from ``env.text``).

This module and :mod:`popgrpo.envs` import no torch: the CLI asks a kind for its checks before
anything heavy loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from popgrpo.registry import ENVIRONMENTS

if TYPE_CHECKING:
    import torch

    from popgrpo.config import Config, EnvConfig

__all__ = ["CODE", "IDEA", "TEXT", "CodeKind", "EnvKind", "env_kind"]


class EnvKind:
    """An environment built by ``build`` (a callable, or a lazy ``"module:attr"`` of one),
    ``(env: EnvConfig, device) -> Environment | TextEnvironment``. Subclasses change what differs."""

    problems = False  # its prompts are problems with their own tests (``popgrpo eval`` scores its runs)

    def __init__(self, build: Callable[..., Any] | str) -> None:
        self._build = build

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._build if isinstance(self._build, str) else self._build.__qualname__})"

    @property
    def build(self) -> Callable[..., Any]:
        if isinstance(self._build, str):
            module, _, attr = self._build.partition(":")
            self._build = getattr(importlib.import_module(module), attr)
        return self._build

    def __call__(self, cfg: EnvConfig, device: str | torch.device = "cpu") -> Any:
        return self.build(cfg, device)

    def check_inputs(self, config: Config) -> None:
        """Load and check what the environment reads besides its config (files), before the run
        directory or Ray exist. Raises :class:`~popgrpo.config.ConfigError` (one line)."""
        del config


class CodeKind(EnvKind):
    """``env.kind=code``: problems with their own tests (:mod:`popgrpo.envs.code`)."""

    problems = True

    def check_inputs(self, config: Config) -> None:
        """Every problem row loads and has its tests, and the held-out split is drawn (a bad row:
        one line naming the row and column)."""
        from popgrpo.config import ConfigError
        from popgrpo.envs.code import check_problems
        from popgrpo.envs.problems import ProblemSetError

        try:
            check_problems(config)
        except ProblemSetError as exc:
            raise ConfigError(str(exc)) from None


IDEA = EnvKind("popgrpo.envs:idea_env")
TEXT = EnvKind("popgrpo.envs:text_env")
CODE = CodeKind("popgrpo.envs:code_env")


def env_kind(name: str) -> EnvKind:
    """The :class:`EnvKind` registered as ``name``; a plugin's plain factory is wrapped in one."""
    entry = ENVIRONMENTS.get(name)
    return entry if isinstance(entry, EnvKind) else EnvKind(entry)
