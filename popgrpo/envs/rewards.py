"""Built-in reward callables for the text environment (``env.text.rewards``).

Each is called as ``fn(prompts, completions, **kwargs)`` with one prompt per completion
(:class:`popgrpo.envs.text.TextEnv`), TRL's reward-function convention, and returns one float
per completion or ``(floats, reasons)``. Write your own the same way and name it by import
path in the config.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["execution_score", "target_fraction"]


def target_fraction(prompts: Sequence[str], completions: Sequence[str], target: str = "a") -> list[float]:
    """Share of a completion's characters that are one of the characters of ``target`` (0 when empty).

    A verifiable synthetic reward: with a character-level tokenizer and one target character
    it is the fraction of target tokens. With a set of characters (e.g. digits and operators)
    it is a format reward, the dense companion of a sparse execution reward.
    """
    if not target:
        raise ValueError("target must name at least one character")
    allowed = set(target)
    return [sum(ch in allowed for ch in c) / len(c) if c else 0.0 for c in completions]


def execution_score(
    prompts: Sequence[str],
    completions: Sequence[str],
    template: str = "{code}",
    fenced: bool = True,
    timeout_s: float = 5.0,
    cpu_s: int = 5,
    memory_mb: int = 512,
    max_workers: int | None = None,
    score_range: Sequence[float] = (0.0, 1.0),
    site_packages: bool = True,
    isolation: str = "bwrap",
) -> tuple[list[float], list[str]]:
    """Run each completion's code in the sandbox; the program's global ``score`` is the reward.

    The program is ``template`` with ``{code}`` replaced by the completion's code (its last
    fenced block when ``fenced``, else the whole completion) and ``{prompt}`` by the prompt
    (as a Python string literal). The program must run to its end and leave a number in the
    global ``score``, inside ``score_range`` (default ``[0, 1]``; outside scores 0,
    ``out_of_range``). Printed output is never a score. A run that times out, exhausts memory,
    crashes, touches what it may not, leaves a process behind or sets no score scores 0, with that
    reason (:mod:`popgrpo.envs.sandbox`). Programs run in parallel, ``max_workers`` at a time;
    ``site_packages=False`` starts them with the standard library only, several times faster.
    ``isolation="none"`` runs them without bubblewrap and seccomp (explicit opt-out, warned).

    The template runs in the same interpreter as the code it wraps: compute the score after the
    code, from values whose type you check (``type(value) in (int, float)``), so that an object
    the code returns cannot compute its own score.
    """
    from popgrpo.envs.sandbox import Sandbox, SandboxLimits, extract_code

    programs: list[str | None] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        code = extract_code(completion) if fenced else completion
        programs.append(None if code is None else template.format(code=code, prompt=repr(prompt)))
    limits = SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb)
    lo, hi = score_range
    span = (lo, hi)
    with Sandbox(
        limits, max_workers=max_workers, score_range=span, site_packages=site_packages, isolation=isolation
    ) as sandbox:
        results = sandbox.run_many(programs)
    return [r.score for r in results], [r.reason for r in results]
