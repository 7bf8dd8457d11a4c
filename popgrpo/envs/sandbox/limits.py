"""What a sandboxed run is given and what it gives back: its limits, its result and its reasons."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NO_CODE", "REASONS", "ExecutionResult", "SandboxLimits", "SandboxUnavailable"]

REASONS = ("ok", "timeout", "memory", "crash", "forbidden", "leftover", "no_score", "out_of_range", "no_code")
"""Every :attr:`ExecutionResult.reason`; :mod:`popgrpo.envs.sandbox` says how each is detected."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. Frozen (hashable) so it can key the default-sandbox cache."""

    timeout_s: float = 5.0  # wall clock
    cpu_s: int = 5  # RLIMIT_CPU (soft = hard: SIGXCPU is blocked, the kernel's SIGKILL ends the program)
    memory_mb: int = 512  # RLIMIT_AS: virtual address space, not resident memory
    max_output_bytes: int = 65536  # stdout kept for diagnostics (its tail); never a score
    file_size_mb: int = 16  # RLIMIT_FSIZE: any single file, stdout included

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_output_bytes", "file_size_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ExecutionResult:
    """One program's outcome: ``score`` is 0.0 unless ``reason == "ok"``."""

    score: float
    reason: str  # one of REASONS
    detail: str = ""  # short human-readable cause (last stderr line, limit hit, ...), for logs


NO_CODE = ExecutionResult(0.0, "no_code", "no fenced Python block in the completion")
"""The result of a completion with nothing to run; it never starts a sandbox."""


class SandboxUnavailable(RuntimeError):
    """The required isolation cannot run here, so untrusted code is not executed at all."""
