"""The landscapes a study runs on, by name: which preset of a method, and which overrides.

A study landscape is registered in :data:`popgrpo.registry.STUDY_LANDSCAPES` (a plugin's the
same way) and names how a method's preset becomes that landscape's: the preset itself
(``collapse``), the calibrated ``paper_*`` preset that ``popgrpo calibrate`` writes (``paper``),
or the preset with overrides (``stepping_stones``: the landscape family of
:func:`popgrpo.envs.landscapes.stepping_stones` at the settings its GRPO control climbs it).
Its instances are ``env.peak_seed`` values.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COLLAPSE", "PAPER", "STEPPING_STONES", "StudyLandscape"]


@dataclass(frozen=True)
class StudyLandscape:
    """How a study runs a method on one landscape: the preset ``prefix + method`` with ``overrides``."""

    name: str
    prefix: str
    overrides: tuple[str, ...] = ()
    about: str = ""

    def preset(self, method: str) -> str:
        """The preset of ``method`` (a shipped preset name such as ``pop_grpo``) on this landscape."""
        return f"{self.prefix}{method}"


COLLAPSE = StudyLandscape("collapse", "", (), "the presets' own landscape (peaks family), where GRPO collapses")
PAPER = StudyLandscape("paper", "paper_", (), "the calibrated paper landscape (`popgrpo calibrate`'s paper_* presets)")
STEPPING_STONES = StudyLandscape(
    "stepping_stones",
    "",
    (
        "env.landscape=stepping_stones",
        # Execution fails less with distance than on the paper's landscape (p_exec at the far
        # peaks about 0.6), so the expected reward rises along each chain and GRPO climbs it.
        "env.exec_lambda=0.1",
        # Adam's steps move the policy's mean about lr per update: 120 epochs at the paper's 3e-4
        # reach the second stone, 1e-3 at 4 updates per epoch the far peaks (docs/DISCOVERY.md).
        "grpo.lr=0.001",
    ),
    "narrow far peaks at the ends of bent chains of stones (env.landscape=stepping_stones)",
)
