"""env.kind dispatches through registered EnvKind objects (popgrpo.envs.kinds): the CLI, the config
and `popgrpo eval` ask the kind, never the name, and a plugin's plain factory is wrapped in one."""

import subprocess
import sys

import pytest

from popgrpo.cli import main
from popgrpo.config import ConfigError, load_config, preset_path
from popgrpo.envs.idea import IdeaEnv
from popgrpo.envs.kinds import CodeKind, EnvKind, env_kind
from popgrpo.registry import ENVIRONMENTS, TEXT_IDEAS


@pytest.fixture
def plugin_env():
    """A plugin's text environment registered as a plain factory, reading env.text like `text`."""
    built = []

    def factory(cfg, device="cpu"):
        built.append((cfg.kind, device))
        return "an environment"

    ENVIRONMENTS.register("plugin_text", factory, ideas=TEXT_IDEAS, inputs="env.text")
    yield built
    ENVIRONMENTS._entries.pop("plugin_text")  # the registry has no unregister
    ENVIRONMENTS._resolved.pop("plugin_text", None)


def test_builtin_kinds_build_their_environments_and_only_code_checks_inputs(tmp_path):
    config = load_config(preset_path("pop_grpo"))
    kind = env_kind("idea")
    assert type(kind) is EnvKind and not kind.problems
    assert isinstance(kind(config.env), IdeaEnv)
    kind.check_inputs(config)  # nothing to read
    code = env_kind("code")
    assert isinstance(code, CodeKind) and code.problems
    missing = tmp_path / "missing.jsonl"
    bad = load_config(preset_path("code_programs"), [f"env.code.problems={missing}"])
    with pytest.raises(ConfigError, match=r"^env\.code\.problems: .*missing\.jsonl"):
        code.check_inputs(bad)


def test_a_plugin_factory_is_wrapped_and_its_inputs_trait_is_what_the_config_requires(plugin_env):
    kind = env_kind("plugin_text")
    assert type(kind) is EnvKind and not kind.problems
    assert kind(load_config(preset_path("pop_grpo")).env, "cpu") == "an environment"
    assert plugin_env == [("idea", "cpu")]
    # Like env.kind=text, an entry registered with inputs="env.text" needs rewards and prompts there.
    with pytest.raises(
        ConfigError, match=r"env\.text\.rewards: at least one reward callable is required with env\.kind=plugin_text"
    ):
        load_config(preset_path("lm_programs"), ["env.kind=plugin_text", "env.text.rewards=[]"])


def test_eval_refuses_an_environment_without_problems_in_one_line(tmp_path, capsys):
    assert main(["eval", "--config", "pop_grpo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "popgrpo: env.kind=idea: popgrpo eval scores runs on problems with tests (env.kind=code)"


def test_the_env_kinds_import_no_torch():
    """The CLI asks a kind for its checks before anything heavy loads."""
    code = "import sys, popgrpo.envs.kinds; print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
