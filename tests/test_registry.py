"""popgrpo.registry: registration, lazy targets, errors, plugins; and every registry-backed
config field refusing an unknown name with exit 2 and the list of choices."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from importlib.metadata import EntryPoint

import pytest

from popgrpo import registry
from popgrpo.cli import main
from popgrpo.config import ConfigError, load_config
from popgrpo.registry import REGISTRIES, DuplicateChoice, Registry, UnknownChoice


def _double(x: int) -> int:
    return 2 * x


def test_register_by_decorator_direct_call_and_lazy_target():
    reg: Registry = Registry("thing", "section.kind", "(x) -> y")

    @reg.register("triple")
    def triple(x: int) -> int:
        return 3 * x

    reg.register("double", _double)
    reg.register("dumps", "json:dumps")
    assert "json" in sys.modules  # (already imported by pytest; the lazy target is not resolved yet)
    assert reg.names() == ["double", "dumps", "triple"]
    assert reg.get("triple") is triple and reg["double"](4) == 8
    assert reg.get("dumps")([1]) == "[1]"
    assert "dumps" in reg and "nope" not in reg and len(reg) == 3 and list(reg) == reg.names()


def test_second_registration_names_both_origins_unless_replaced():
    reg: Registry = Registry("merge", "scheduler.merge", "")
    reg.register("soup", "pkg.merges:soup")
    with pytest.raises(DuplicateChoice) as err:
        reg.register("soup", _double)
    message = str(err.value)
    assert "scheduler.merge: merge 'soup' is registered twice" in message
    assert "first by pkg.merges:soup" in message and "then by tests.test_registry:_double" in message
    assert "replace=True" in message
    reg.register("soup", _double, replace=True)
    assert reg.get("soup") is _double


def test_unknown_choice_names_field_close_matches_and_choices():
    reg: Registry = Registry("environment", "env.kind", "")
    for name in ("idea", "text", "ideas_v2"):
        reg.register(name, _double)
    with pytest.raises(UnknownChoice) as err:
        reg.get("idae")
    assert isinstance(err.value, ValueError)
    assert str(err.value) == (
        "env.kind: unknown environment 'idae' (did you mean 'idea'?); choices: idea, ideas_v2, text"
    )
    with pytest.raises(UnknownChoice, match=r"unknown environment 'zzz'; choices: idea, ideas_v2, text$"):
        reg.check("zzz")
    with pytest.raises(ValueError, match="module:attr"):
        reg.register("bad", "no_colon_here")


def test_a_huge_unknown_name_is_cut_in_the_one_line_error():
    """A hostile config value of 100,000 characters gives a short message that still lists the choices."""
    reg: Registry = Registry("environment", "env.kind", "")
    reg.register("idea", _double)
    with pytest.raises(UnknownChoice) as err:
        reg.check("idea" + "x" * 100_000)
    message = str(err.value)
    assert len(message) < 200 and "\n" not in message
    assert message.startswith("env.kind: unknown environment 'ideaxxx") and message.endswith("...; choices: idea")


def test_builtins_are_known_without_importing_torch_or_ray():
    code = (
        "import json, sys; from popgrpo.config import load_config; "
        "c = load_config(None, ['env.kind=text', 'policy.kind=causal_lm', 'policy.causal_lm.model=m', "
        "'env.text.prompts=[p]', 'env.text.rewards=[{fn: a:b}]', 'scheduler.merge=wise_ft', 'scheduler.mutate=svd']); "
        "print(json.dumps({'kinds': [c.env.kind, c.policy.kind, c.scheduler.merge, c.scheduler.mutate], "
        "'heavy': sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray'))}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout)
    assert loaded["kinds"] == ["text", "causal_lm", "wise_ft", "svd"]  # every name was checked and kept
    assert loaded["heavy"] == []


def test_every_builtin_resolves_to_a_callable():
    for reg in REGISTRIES:
        assert reg.builtin_names(), reg
        for name in reg.builtin_names():
            assert callable(reg.get(name)), (reg.field, name)


@pytest.fixture
def fresh_plugins(monkeypatch):
    """Plugin loading as if popgrpo had just started, with the given entry points."""

    def install(*eps: EntryPoint) -> None:
        monkeypatch.setattr(registry, "_state", registry._Loading(builtin=False))
        monkeypatch.setattr(registry, "entry_points", lambda group: [ep for ep in eps if ep.group == group])

    return install


def test_plugin_module_and_callable_are_loaded_once_and_a_broken_one_only_warns(fresh_plugins, monkeypatch):
    calls = []
    reg: Registry = Registry("environment", "env.kind", "")
    module = type(sys)("fake_plugin")
    module.setup = lambda: (calls.append(1), reg.register("from_callable", _double))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_plugin", module)
    fresh_plugins(
        EntryPoint("good", "fake_plugin:setup", registry.PLUGIN_GROUP),
        EntryPoint("broken", "no_such_module_for_popgrpo:setup", registry.PLUGIN_GROUP),
        EntryPoint("elsewhere", "fake_plugin:setup", "another.group"),
    )
    with pytest.warns(RuntimeWarning, match=r"plugin failed to load: \?:broken = no_such_module_for_popgrpo:setup"):
        assert reg.names() == ["from_callable"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loaded once: no second warning, no second call
        assert reg.names() == ["from_callable"] and calls == [1]
    assert "(plugin ?:good = fake_plugin:setup)" in reg.origin("from_callable")
    with pytest.raises(UnknownChoice, match=r"plugins that failed to load: \?:broken .*ModuleNotFoundError"):
        reg.get("nope")


# Every config field whose values are registry names, with a name no registry holds.
FIELDS = {
    "env.kind": "env.kind=nope",
    "env.landscape": "env.landscape=nope",
    "policy.kind": "policy.kind=nope",
    "reward.source": "reward.source=nope",
    "run.loggers": "run.loggers=[tensorboard, nope]",
    "scheduler.merge": "scheduler.merge=nope",
    "scheduler.mutate": "scheduler.mutate=nope",
    "scheduler.population": "scheduler.population=nope",
    "scheduler.objectives": "scheduler.objectives=[pop_score, nope]",
    "reward.proxy.combine": "reward.proxy.combine=nope",
    "policy.causal_lm.rollout.engine": "policy.causal_lm.rollout.engine=nope",
    "explore.advantage": "explore.advantage=nope",
    "explore.policy_loss": "explore.policy_loss=nope",
}


def test_every_registry_backed_field_is_covered():
    assert set(FIELDS) == {r.field for r in REGISTRIES}


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_unknown_choice_exits_2_with_the_choices(field, tmp_path, capsys):
    reg = next(r for r in REGISTRIES if r.field == field)
    with pytest.raises(ConfigError):
        load_config(None, [FIELDS[field]])
    code = main(["train", "--set", FIELDS[field], "--out", str(tmp_path / "run"), "--executor", "local"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"popgrpo: invalid config (--set {FIELDS[field]}): ")
    hint = r"( \(did you mean [^)]*\))?"  # 'nope' is close to the mutation 'none'
    assert re.search(
        rf": {re.escape(field)}: unknown {reg.kind} 'nope'{hint}; choices: {re.escape(', '.join(reg.names()))}$",
        lines[0],
    )
    assert not (tmp_path / "run").exists()


def test_unknown_environment_exits_2_from_the_command_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "popgrpo", "train", "--set", "env.kind=nope", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.endswith(
        "(--set env.kind=nope): env.kind: unknown environment 'nope'; choices: code, idea, text\n"
    )
    assert len(res.stderr.splitlines()) == 1
