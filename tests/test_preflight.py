"""popgrpo.preflight: what a run needs from outside its config, checked before it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from popgrpo.config import ConfigError, load_config
from popgrpo.preflight import check_run, reward_import_paths

REWARDS = """\
import math


def short_and_numeric(prompts, completions, max_chars=12):
    return [float(len(c) <= max_chars and any(ch.isdigit() for ch in c)) for c in completions]


if __name__ == "__main__":
    def only_when_run():
        pass
"""


def _lm_yaml(fn: str, model: str, extra: str = "") -> str:
    return (
        "env:\n  kind: text\n  text:\n    prompts: ['make 24:']\n"
        f"    rewards:\n      - fn: {fn}\n{extra}"
        f"policy:\n  kind: causal_lm\n  causal_lm:\n    model: {model}\n"
    )


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A config folder holding a reward module and a stand-in model directory; the working
    directory elsewhere. The import path and PYTHONPATH are restored afterwards."""
    folder = tmp_path / "project"
    (folder / "tiny-lm").mkdir(parents=True)
    (folder / "tiny-lm" / "config.json").write_text("{}")
    (folder / "rewards_beside_config.py").write_text(REWARDS)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    yield folder
    sys.modules.pop("rewards_beside_config", None)
    sys.modules.pop("rewards_in_cwd", None)


def _check(folder: Path, text: str, overrides: tuple[str, ...] = ()) -> None:
    path = folder / "run.yaml"
    path.write_text(text)
    check_run(load_config(path, overrides), path)


def test_a_reward_module_beside_the_config_or_in_the_working_directory_is_found(project):
    model = project / "tiny-lm"
    _check(project, _lm_yaml("rewards_beside_config:short_and_numeric", str(model)))
    Path("rewards_in_cwd.py").write_text(REWARDS)
    _check(project, _lm_yaml("rewards_in_cwd:short_and_numeric", str(model)))
    # Both folders lead the import path, and PYTHONPATH, which the member actors of an
    # embedded Ray inherit.
    assert sys.path[:2] == reward_import_paths(project / "run.yaml")
    assert os.environ["PYTHONPATH"].split(os.pathsep)[:2] == [str(project), str(Path.cwd())]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            "rewards_beside_config:short_and_numerc",
            "env.text.rewards[0].fn: module rewards_beside_config has no function 'short_and_numerc' "
            "(did you mean 'short_and_numeric'?)",
        ),
        ("rewards_beside_confg:short_and_numeric", "no module named 'rewards_beside_confg'"),
        ("rewards_beside_confg:short_and_numeric", "(did you mean 'rewards_beside_config'?)"),
        ("popgrpo.envs.reward:target_fraction", "(did you mean 'popgrpo.envs.rewards'?)"),
        ("popgrpo.envs.rewards:target_fractoin", "has no function 'target_fractoin' (did you mean 'target_fraction'?)"),
        ("no_colon_or_dot", "is not an import path; write it as module:function"),
        ("rewards_beside_config:math", "rewards_beside_config.math is a module, not a function"),
    ],
)
def test_a_typo_in_a_reward_names_the_field_and_close_matches(project, fn, message):
    with pytest.raises(ConfigError) as err:
        _check(project, _lm_yaml(fn, str(project / "tiny-lm")))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_reward_module_that_raises_on_import_is_one_line_with_its_place(project):
    (project / "broken_rewards.py").write_text("def score(p, c):\n    return c\n\nraise RuntimeError('oops')\n")
    with pytest.raises(ConfigError) as err:
        _check(project, _lm_yaml("broken_rewards:score", str(project / "tiny-lm")))
    assert "env.text.rewards[0].fn: importing broken_rewards failed: RuntimeError: oops" in str(err.value)
    assert f"{project / 'broken_rewards.py'}, line 4" in str(err.value)


def test_a_missing_model_suggests_lm_tiny_and_lm_pretrain(project):
    with pytest.raises(ConfigError) as err:
        _check(project, _lm_yaml("rewards_beside_config:short_and_numeric", "runs/tiny-lm"))
    message = str(err.value)
    assert message.startswith("policy.causal_lm.model: runs/tiny-lm: no such directory")
    assert "`popgrpo lm tiny --out runs/tiny-lm`" in message and "`popgrpo lm pretrain --out runs/tiny-lm`" in message
    assert "huggingface.co" not in message and "internet" not in message
    not_a_model = project / "empty"
    not_a_model.mkdir()
    with pytest.raises(ConfigError, match="is a directory but not a saved model"):
        _check(project, _lm_yaml("rewards_beside_config:short_and_numeric", str(not_a_model)))


def test_prompt_files_are_read_before_the_run(project):
    model = str(project / "tiny-lm")
    fn = "rewards_beside_config:short_and_numeric"
    with pytest.raises(ConfigError, match=r"env.text.prompts_path: .*nope.txt: no such file"):
        _check(project, _lm_yaml(fn, model), ("env.text.prompts_path=nope.txt",))
    records = project / "prompts.jsonl"
    records.write_text(json.dumps({"text": "make 24:"}) + "\n")
    with pytest.raises(ConfigError, match="have no text field 'prompt'"):
        _check(project, _lm_yaml(fn, model), (f"env.text.prompts_path={records}",))
    _check(project, _lm_yaml(fn, model), (f"env.text.prompts_path={records}", "env.text.prompt_field=text"))


def test_the_first_pass_catches_typos_without_importing_torch(project, tmp_path):
    """A typo stops the run before torch is imported (3 s on a busy 2-core machine): the module
    is found without importing its packages and its names are read from its source."""
    path = project / "run.yaml"
    for fn in ("rewards_beside_config:short_and_numerc", "popgrpo.envs.rewards:target_fractoin"):
        path.write_text(_lm_yaml(fn, str(project / "tiny-lm")))
        code = (
            "import json, sys; from popgrpo.cli import main\n"
            f"code = main(['train', '--config', {str(path)!r}, '--out', {str(tmp_path / 'never')!r}])\n"
            "print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] == 'torch')]))\n"
        )
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == [2, []]  # exit 2, and torch never imported
        assert "did you mean" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "never").exists()


def test_idea_runs_need_nothing_from_outside():
    check_run(load_config(None))  # nothing to import, no model, no prompts
