"""The studies ``popgrpo reproduce --study`` runs and ``popgrpo report`` redraws: one registered
:class:`StudyKind` each, in :data:`popgrpo.registry.STUDIES`.

A kind says everything that differs between studies, so the commands never ask for a study by
name: the options it takes, where its directory goes by default, how a new plan is built, how
its tables and figures are redrawn, and how ``popgrpo report`` recognises one of its
directories. A plugin registers its own kind the same way (``STUDIES.register("mine", MyKind())``).

This module imports nothing heavy: building the command line reads the kinds' help.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from popgrpo.registry import STUDIES

__all__ = ["OPTIONS", "StudyKind", "report_kind", "study_kind"]

# The options of `popgrpo reproduce` that only some studies take; a kind lists those it uses.
OPTIONS = ("landscape", "model", "seeds", "epochs", "address", "num_cpus")


def _load(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class StudyKind:
    """One study.

    Args:
        help: one line for ``--study``'s help.
        render: ``"module:attr"`` of ``(out) -> written paths``, the report from the directory's Parquet files.
        plan: ``"module:attr"`` of ``(study, quick, seeds, epochs, landscape, model) -> plan.json's content``
            (raises ValueError for a bad request), for studies run as Tune trials by
            :func:`popgrpo.research.study.run.reproduce`; None for a study that runs itself (``run``) or a
            directory ``popgrpo report`` redraws but ``reproduce`` does not make.
        run: ``"module:attr"`` of ``(out, quick, progress) -> {"seconds", "written"}``: a study run in
            this process with its own plan.
        out: the default ``--out``; ``{quick}`` becomes ``-quick`` with ``--quick`` and ``{landscape}``
            ``-paper`` on the paper landscape.
        options: the options of :data:`OPTIONS` it takes; another given is an error.
        marker: a file whose presence marks one of its directories without a ``plan.json``.
        recognise: ``"module:attr"`` of ``(dir) -> bool``, for directories no marker names.
        plan_names: the ``plan.json`` ``study`` values it redraws (default: its registered name).
    """

    help: str
    render: str
    plan: str | None = None
    run: str | None = None
    out: str = ""
    options: frozenset[str] = frozenset()
    marker: str | None = None
    recognise: str | None = None
    plan_names: tuple[str, ...] = field(default_factory=tuple)

    @property
    def reproducible(self) -> bool:
        """``popgrpo reproduce`` can make it."""
        return self.plan is not None or self.run is not None

    def default_out(self, quick: bool, landscape: str) -> str:
        return self.out.format(quick="-quick" if quick else "", landscape="-paper" if landscape == "paper" else "")

    def unused(self, given: Sequence[str]) -> list[str]:
        """The options of ``given`` this study does not take."""
        return [name for name in given if name not in self.options]

    def new_plan(self, study: str, quick: bool, seeds, epochs, landscape: str, model: str | None) -> dict:
        if self.plan is None:
            raise ValueError(f"--study {study} has no Tune plan")
        return _load(self.plan)(study, quick, seeds, epochs, landscape, model)

    def run_here(self, out: Path, quick: bool, progress: bool) -> dict:
        if self.run is None:
            raise ValueError("this study runs as Tune trials")
        return _load(self.run)(out, quick, progress)

    def redraw(self, out: str | Path) -> list[Path]:
        return _load(self.render)(out)

    def recognises(self, directory: Path) -> bool:
        """``directory`` (without a ``plan.json``) is one of this study's."""
        if self.marker is not None and (directory / self.marker).is_file():
            return True
        return self.recognise is not None and bool(_load(self.recognise)(directory))


def study_kind(name: str) -> StudyKind:
    """The kind registered as ``name`` (UnknownChoice lists the choices)."""
    kind = STUDIES.get(name)
    if not isinstance(kind, StudyKind):
        raise TypeError(f"study {name!r} is registered as {type(kind).__name__}, not a StudyKind")
    return kind


def report_kind(directory: str | Path) -> StudyKind:
    """The kind whose report redraws ``directory``: the one its ``plan.json`` names, else the
    first whose marker or test recognises it, else ``paper``."""
    directory = Path(directory)
    plan_file = directory / "plan.json"
    planned = json.loads(plan_file.read_text()).get("study") if plan_file.is_file() else None
    kinds = [(name, study_kind(name)) for name in STUDIES.names()]
    if planned is not None:
        for name, kind in kinds:
            if planned == name or planned in kind.plan_names:
                return kind
    else:
        for _, kind in kinds:
            if kind.recognises(directory):
                return kind
    return study_kind("paper")


def run_warm(out: Path, quick: bool, progress: bool) -> dict:
    """``--study warm``: WARM's study at its quick or full size, in this process."""
    from popgrpo.research.study.warm import FULL, QUICK, run_warm_study

    return run_warm_study(out, QUICK if quick else FULL, progress=progress)


_TUNE_OPTIONS = frozenset({"epochs", "address", "num_cpus"})

PAPER = StudyKind(
    help="the main paper's studies (Table 1, multi-seed, ablations)",
    render="popgrpo.research.study.report:render",
    plan="popgrpo.research.study.run:paper_plan",
    out="runs/reproduce{quick}{landscape}",
    options=_TUNE_OPTIONS | {"landscape", "seeds"},
)
WARM = StudyKind(
    help="WARM's reward-model study (docs/WARM.md), in this process",
    render="popgrpo.research.study.warm_report:render_warm",
    run="popgrpo.research.study.kinds:run_warm",
    out="runs/warm{quick}",
    marker="corruption.parquet",
)
LM = StudyKind(
    help="the collapse study on real programs with the causal LM of --model (docs/RESULTS_LM.md)",
    render="popgrpo.research.study.lm_report:render_lm",
    plan="popgrpo.research.study.run:lm_plan",
    out="runs/lm-study{quick}",
    options=_TUNE_OPTIONS | {"model", "seeds", "landscape"},
)
DISCOVERY = StudyKind(
    help="population mechanisms against best-of-K, the pre-registered confirmatory design (docs/DISCOVERY.md)",
    render="popgrpo.research.study.discovery_report:render_discovery",
    plan="popgrpo.research.study.run:discovery_plan",
    out="runs/discovery{quick}",
    options=_TUNE_OPTIONS | {"seeds", "landscape"},
)
DISCOVERY_TUNING = StudyKind(
    help="the discovery study on the tuning seeds and instance",
    render="popgrpo.research.study.discovery_report:render_discovery",
    plan="popgrpo.research.study.run:discovery_tuning_plan",
    out="runs/discovery-tuning{quick}",
    options=_TUNE_OPTIONS | {"seeds", "landscape"},
)
DISCOVERY2 = StudyKind(
    help="the second discovery study's confirmatory design (preregistration/discovery2.json; issue 46)",
    render="popgrpo.research.study.discovery2_report:render_discovery2",
    plan="popgrpo.research.study.discovery2:discovery2_plan",
    out="runs/discovery2{quick}",
    options=_TUNE_OPTIONS | {"seeds"},
)
DISCOVERY2_TUNING = StudyKind(
    help="the second discovery study on its tuning instances and seeds (preregistration/discovery2_tuning.json)",
    render="popgrpo.research.study.discovery2_report:render_discovery2",
    plan="popgrpo.research.study.discovery2:discovery2_tuning_plan",
    out="runs/discovery2-tuning{quick}",
    options=_TUNE_OPTIONS | {"seeds"},
)
CODE_RUN = StudyKind(
    help="one code run's directory (env.kind=code): its pass@k curves",
    render="popgrpo.research.study.code_report:render_code",
    recognise="popgrpo.research.study.code_report:is_code_run",
)
