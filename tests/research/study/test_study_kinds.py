"""Study kinds come from a registry (popgrpo.registry.STUDIES): `popgrpo reproduce --study` and
`popgrpo report` ask the registered StudyKind, so a plugin's study is run and redrawn like a built-in."""

import json
from pathlib import Path

import pytest

from popgrpo.cli import main
from popgrpo.registry import STUDIES
from popgrpo.research.study.kinds import StudyKind, report_kind, study_kind

calls: list[tuple] = []


def toy_run(out: Path, quick: bool, progress: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps({"study": "toy", "quick": quick}))
    calls.append(("run", out, quick, progress))
    return {"seconds": 0.0, "written": [out / "plan.json"]}


def toy_render(out) -> list[Path]:
    calls.append(("render", Path(out)))
    page = Path(out) / "toy.md"
    page.write_text("# toy\n")
    return [page]


@pytest.fixture
def toy_study():
    STUDIES.register(
        "toy",
        StudyKind(
            help="a plugin's study",
            render=f"{__name__}:toy_render",
            run=f"{__name__}:toy_run",
            out="runs/toy{quick}",
            options=frozenset({"epochs"}),
        ),
    )
    calls.clear()
    yield
    STUDIES._entries.pop("toy")  # the registry has no unregister; tests leave it as they found it
    STUDIES._resolved.pop("toy", None)


def test_a_registered_study_is_run_by_reproduce_and_redrawn_by_report(toy_study, tmp_path, capsys):
    out = tmp_path / "toy"
    assert main(["reproduce", "--study", "toy", "--quick", "--out", str(out)]) == 0
    assert calls == [("run", out, True, True)]
    assert report_kind(out) is study_kind("toy")  # plan.json names it
    assert main(["report", str(out)]) == 0
    assert calls[-1] == ("render", out)
    assert capsys.readouterr().out.strip().endswith(str(out / "toy.md"))


def test_an_option_the_study_does_not_take_exits_2_naming_it_and_who_takes_it(toy_study, tmp_path, capsys):
    assert main(["reproduce", "--study", "toy", "--model", "m", "--out", str(tmp_path / "t")]) == 2
    line = capsys.readouterr().err.strip()
    assert line == "popgrpo: --study toy does not take --model (it is for --study lm): drop it"
    assert main(["reproduce", "--study", "warm", "--epochs", "3", "--out", str(tmp_path / "w")]) == 2
    assert "--study warm does not take --epochs" in capsys.readouterr().err
    assert calls == [] and not (tmp_path / "t").exists() and not (tmp_path / "w").exists()


def test_report_recognises_each_directory_by_its_plan_or_marker(tmp_path):
    def directory(name: str, files: dict[str, str]) -> Path:
        d = tmp_path / name
        d.mkdir()
        for file, text in files.items():
            (d / file).write_text(text)
        return d

    assert report_kind(directory("lm", {"plan.json": '{"study": "lm"}'})) is study_kind("lm")
    tuning = directory("tuning", {"plan.json": '{"study": "discovery-tuning"}'})
    assert report_kind(tuning) is study_kind("discovery-tuning")
    assert report_kind(directory("warm", {"corruption.parquet": ""})) is study_kind("warm")
    assert report_kind(directory("paper", {"plan.json": '{"study": "paper"}'})) is study_kind("paper")
    assert report_kind(directory("empty", {})) is study_kind("paper")


def test_every_builtin_study_kind_resolves_its_targets():
    """A typo in a lazy "module:attr" would only show when that study is run: resolve them all here."""
    import importlib

    for name in STUDIES.builtin_names():
        kind = study_kind(name)
        for target in (kind.render, kind.plan, kind.run, kind.recognise):
            if target is not None:
                module, _, attr = target.partition(":")
                assert callable(getattr(importlib.import_module(module), attr)), (name, target)
