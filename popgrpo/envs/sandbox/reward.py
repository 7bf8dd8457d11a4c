"""The execution reward of a batch of completions, on a shared default sandbox unless one is given."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from popgrpo.envs.sandbox.limits import SandboxLimits
from popgrpo.envs.sandbox.parsing import extract_code
from popgrpo.envs.sandbox.runner import Sandbox

__all__ = ["default_sandbox_for", "score_completions"]

_DEFAULT_SANDBOXES: dict[tuple[object, ...], Sandbox] = {}
_DEFAULT_LOCK = threading.Lock()


def default_sandbox_for(
    limits: SandboxLimits,
    max_workers: int | None = None,
    score_range: tuple[float, float] = (0.0, 1.0),
    site_packages: bool = True,
    isolation: str = "bwrap",
) -> Sandbox:
    """One lazily created, shared one-shot sandbox per distinct settings (reused across batches)."""
    key = (limits, max_workers, score_range, site_packages, isolation)
    with _DEFAULT_LOCK:
        if key not in _DEFAULT_SANDBOXES:
            _DEFAULT_SANDBOXES[key] = Sandbox(
                limits, max_workers, score_range=score_range, site_packages=site_packages, isolation=isolation
            )
        return _DEFAULT_SANDBOXES[key]


def score_completions(
    completions: Sequence[str], *, sandbox: Sandbox | None = None, **limit_overrides: float
) -> tuple[list[float], list[str]]:
    """Rewards and reasons for a batch of completions: :func:`extract_code` → :meth:`Sandbox.run_many`.

    Without ``sandbox`` a module-level one-shot default is created on first use;
    ``limit_overrides`` (fields of :class:`SandboxLimits`, e.g. ``timeout_s=2``) select a default
    with those limits. For warm sandboxes pass ``sandbox=shared_pool(limits)``
    (:mod:`popgrpo.envs.sandbox.pool`).
    """
    if sandbox is not None and limit_overrides:
        raise TypeError("pass limits to the Sandbox you give, not to score_completions")
    if sandbox is None:
        sandbox = default_sandbox_for(replace(SandboxLimits(), **limit_overrides))
    results = sandbox.run_many([extract_code(c) for c in completions])
    return [r.score for r in results], [r.reason for r in results]
