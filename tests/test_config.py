from pathlib import Path

import pytest

from popgrpo.config import Config, ConfigError, config_markdown, load_config, preset_path

PRESETS = ["grpo", "qd_grpo", "maxent_grpo", "pop_grpo"]


@pytest.mark.parametrize("name", [*PRESETS, "pop_grpo_scale", "combined"])
def test_presets_load(name):
    cfg = load_config(preset_path(name))
    assert cfg.run.name == name


def test_every_job_config_is_valid_and_the_scale_out_one_is_large():
    for path in sorted(Path(preset_path("grpo")).parent.glob("*.yaml")):
        load_config(path)
    scale = load_config(preset_path("pop_grpo_scale"))
    assert scale.population.size >= 64 and scale.population.size % scale.population.members_per_actor == 0


def test_preset_values_follow_the_paper():
    pop = load_config(preset_path("pop_grpo"))
    assert (pop.population.size, pop.scheduler.interval_epochs, pop.scheduler.top_m, pop.scheduler.perturb_sigma) == (
        5,
        10,
        3,
        0.01,
    )
    qd = load_config(preset_path("qd_grpo"))
    assert qd.qd.enabled and (qd.qd.beta_new, qd.qd.beta_imp) == (0.5, 0.3)
    me = load_config(preset_path("maxent_grpo"))
    assert me.maxent.entropy.target == 1.0 and me.maxent.novelty.coef == 0.3 and me.maxent.complexity_bins == 3
    d = Config()
    assert (d.grpo.lr, d.grpo.clip, d.grpo.kl_coef, d.grpo.group_size, d.policy.n_prompts, d.run.epochs) == (
        3e-4,
        0.2,
        0.01,
        16,
        8,
        120,
    )


def test_overrides_parse_yaml_values():
    cfg = load_config(None, ["grpo.lr=1e-3", "qd.enabled=true", "run.name=x", "population.size=7"])
    assert cfg.grpo.lr == 1e-3 and cfg.qd.enabled is True and cfg.run.name == "x" and cfg.population.size == 7


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["grpo.lr=fast"], "grpo.lr"),
        (["grpo.bogus=1"], "grpo.bogus"),
        (["nosuchsection.x=1"], "nosuchsection"),
        (["population.size=-3"], "population.size"),
        (["population.size=0"], "population.size"),
        (["scheduler.enabled=true", "population.size=2", "scheduler.top_m=3"], "top_m"),
        (["grpo.clip=1.5"], "grpo.clip"),
        (["grpo"], "key=value"),
        (["run.seed=1.5"], "run.seed"),
    ],
)
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert field in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_malformed_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_yaml_roundtrip(tmp_path: Path):
    cfg = load_config(preset_path("maxent_grpo"), ["run.seed=7"])
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_every_field_documented_once_and_readme_in_sync():
    table = config_markdown()
    rows = [line for line in table.splitlines()[2:]]
    keys = [r.split("|")[1].strip() for r in rows]
    assert len(keys) == len(set(keys)) > 40
    assert all(r.split("|")[3].strip() not in ("", "None") for r in rows)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert table in readme, "README config reference is stale: regenerate with `popgrpo config --markdown`"


def test_readme_metrics_table_in_sync():
    from popgrpo.telemetry.live import metrics_markdown

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert metrics_markdown() in readme, "README metrics table is stale: regenerate from popgrpo.telemetry.live"


LM_BASE = [
    "env.kind=text",
    "policy.kind=causal_lm",
    "policy.causal_lm.model=some/model",
    "env.text.prompts=[p]",
    "env.text.rewards=[{fn: popgrpo.envs.rewards:target_fraction}]",
    "eval.k=4",
    "grpo.group_size=8",
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.kind=text"], "causal_lm policy needs env.kind=text"),
        (["policy.kind=causal_lm"], "causal_lm policy needs env.kind=text"),
        (["policy.causal_lm.model=null"], "policy.causal_lm.model"),
        (["env.text.rewards=[]"], "env.text.rewards"),
        (["env.text.prompts=[]"], "env.text.prompts"),
        (["population.vectorize=true"], "population.vectorize"),
        (["env.text.rewards=[{weight: 1}]"], "fn"),
        (["policy.causal_lm.loss_normalisation=mean"], "loss_normalisation"),
    ],
)
def test_language_model_configs_explain_what_is_missing(overrides, message):
    base = LM_BASE if overrides[0] not in ("env.kind=text", "policy.kind=causal_lm") else []
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*base, *overrides])


def test_language_model_config_and_relative_paths(tmp_path, monkeypatch):
    cfg = load_config(None, LM_BASE)
    assert cfg.policy.causal_lm.model == "some/model"  # a name, not a path here: kept as is
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "prompts.txt").write_text("p\n")
    cfg = load_config(None, [*LM_BASE, "policy.causal_lm.model=models/m", "env.text.prompts_path=prompts.txt"])
    # Existing relative paths become absolute: the config travels to workers with another cwd.
    assert cfg.policy.causal_lm.model == str(tmp_path / "models" / "m")
    assert cfg.env.text.prompts_path == str(tmp_path / "prompts.txt")
