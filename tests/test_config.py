import re
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


DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_field_documented_once_and_config_reference_page_in_sync():
    table = config_markdown()
    rows = [line for line in table.splitlines()[2:]]
    keys = [r.split("|")[1].strip() for r in rows]
    assert len(keys) == len(set(keys)) > 40
    assert all(r.split("|")[3].strip() not in ("", "None") for r in rows)
    page = (DOCS / "reference" / "config.md").read_text()
    assert table in page, "docs/reference/config.md is stale: regenerate with `make docs-reference`"


def test_metrics_reference_page_in_sync():
    from popgrpo.telemetry.live import metrics_markdown

    page = (DOCS / "reference" / "metrics.md").read_text()
    assert metrics_markdown() in page, "docs/reference/metrics.md is stale: regenerate with `make docs-reference`"


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


# ---- hostile input ---------------------------------------------------------------------------
def _billion_laughs(levels: int = 9) -> str:
    """A few hundred bytes of anchors and aliases that expand to 9**levels strings."""
    lines = ['a0: &a0 "lol"']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["run.name", "env.text.prompts"])
def test_yaml_bomb_is_refused_while_composing(tmp_path: Path, where):
    section, key = where.rsplit(".", 1)
    bomb = _billion_laughs()
    nested = "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split(".")))
    indent = "  " * len(section.split("."))
    body = bomb.replace("\n", "\n" + indent).rstrip()
    # The bomb's anchors sit in a throwaway mapping under the field, which must be a string or list.
    path = tmp_path / "bomb.yaml"
    path.write_text(f"{nested}{indent}{key}:\n{indent}  {body}\n")
    with pytest.raises(ConfigError, match="too large or deep: more than 200,000 values") as err:
        load_config(path)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="cannot parse value: more than 200,000 values"):
        load_config(None, [f"{where}={{{bomb.strip().replace(chr(10), ', ')}}}"])


def test_a_small_config_may_use_anchors(tmp_path: Path):
    path = tmp_path / "anchors.yaml"
    path.write_text("grpo: &g\n  lr: 0.001\nrun:\n  name: anchored\nqd: {enabled: true, beta_new: 0.4}\n")
    cfg = load_config(path)
    assert cfg.grpo.lr == 0.001 and cfg.run.name == "anchored" and cfg.qd.beta_new == 0.4


def test_deep_nesting_and_non_utf8_and_oversized_files_are_one_line_errors(tmp_path: Path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("run:\n  name: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_config(deep)
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_config(None, ["run.name=" + "[" * 20_000 + "]" * 20_000])
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 16 is 0xe9\)"):
        load_config(latin1)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"# padding\n" * (2**20 + 1))
    with pytest.raises(ConfigError, match="larger than 10 MiB"):
        load_config(huge)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["grpo.lr=inf"], "grpo.lr: Input should be a finite number"),
        (["grpo.lr=.inf"], "grpo.lr: Input should be a finite number"),
        (["env.noise_std=.nan"], "env.noise_std: Input should be a finite number"),
        (["scheduler.weighted_soup_temperature=-.inf"], "weighted_soup_temperature: Input should be a finite number"),
        (["maxent.novelty.k=600", "maxent.novelty.capacity=512"], "k (600) must be <= capacity (512)"),
        (["population.size=1000000000"], "population.size: Input should be less than or equal to 10000"),
        (["archive.cells_per_dim=1000000"], "archive.cells_per_dim: Input should be less than or equal to 1000"),
        (["population.size=64", "archive.cells_per_dim=1000"], "allocates 64,000,000 cells"),
        (["run.name=../../x"], "run.name: must be a single file-name component"),
        (["run.name=a/b"], "run.name: must be a single file-name component"),
        (["run.name=.."], "run.name: must be a single file-name component"),
        (["run.name=" + "x" * 300], "run.name: String should have at most 200 characters (got 'xxxxx"),
    ],
)
def test_hostile_values_are_refused_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_sizes_at_their_bounds_are_accepted():
    cfg = load_config(None, ["population.size=10000", "archive.shared=true", "archive.cells_per_dim=1000"])
    assert cfg.population.size == 10_000 and cfg.archive.cells_per_dim == 1000
    assert load_config(None, ["maxent.novelty.k=512", "maxent.novelty.capacity=512"]).maxent.novelty.k == 512


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["run.epoch=3"], "invalid config (--set run.epoch=3): run.epoch: unknown key (did you mean run.epochs?)"),
        (["grp.lr=1"], "grp: unknown key (did you mean grpo?)"),
        (["run.xyz=1"], "run.xyz: unknown key; the keys of run: name, seed, epochs,"),
        (["scheduler.xyz=1"], "scheduler.xyz: unknown key; `popgrpo config --markdown` lists the keys of scheduler"),
        (
            ["env.text.rewards[0].fn=m:f", "env.text.rewards[0].wieght=2"],
            "env.text.rewards[0].wieght: unknown key (did you mean env.text.rewards[0].weight?)",
        ),
    ],
)
def test_unknown_keys_get_close_matches_or_the_section_keys(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(preset_path("pop_grpo"), overrides)
    assert message in str(err.value)


def test_an_error_names_the_set_it_came_from_not_the_preset_file(tmp_path: Path):
    preset = preset_path("pop_grpo")
    with pytest.raises(ConfigError) as err:
        load_config(preset, ["run.name=ok", "grpo.lr=fast"])
    assert str(err.value).startswith("invalid config (--set grpo.lr=fast): grpo.lr: ")
    assert str(preset) not in str(err.value)
    # A value from the file names the file; a check across sections names both.
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  lr: fast\n")
    with pytest.raises(ConfigError, match=rf"^invalid config \({bad}\): grpo.lr: "):
        load_config(bad, ["run.name=ok"])
    with pytest.raises(ConfigError, match=rf"^invalid config \({preset}, --set scheduler.top_m=9\): "):
        load_config(preset, ["scheduler.top_m=9"])


def test_set_indexes_into_lists():
    cfg = load_config(
        preset_path("lm_exec"), ["env.text.rewards[0].weight=2.5", "run.loggers[1]=mlflow", "env.text.prompts[0]=x"]
    )
    assert cfg.env.text.rewards[0].weight == 2.5 and cfg.env.text.rewards[0].fn.endswith("execution_score")
    assert cfg.run.loggers == ["tensorboard", "mlflow"]  # the default list, one item appended
    assert cfg.env.text.prompts[0] == "x"
    added = load_config(None, ["env.text.rewards[0].fn=m:f", "env.text.rewards[1]={fn: n:g, weight: 0.5}"])
    assert [(r.fn, r.weight) for r in added.env.text.rewards] == [("m:f", 1.0), ("n:g", 0.5)]
    for overrides, message in [
        (["env.text.rewards[3].fn=m:f"], "env.text.rewards has 0 item(s); index 3 is out of range"),
        (["run.epochs[0]=1"], "--set run.epochs[0]: run.epochs is not a list"),
        (["run.loggers.x=1"], "run.loggers: Input should be a valid list"),
        (["run..x=1"], "cannot read the key"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(None, overrides)
        assert message in str(err.value), overrides


def test_a_typo_in_a_preset_name_suggests_close_ones_and_lists_them():
    from popgrpo.config import list_presets, resolve_config_path

    with pytest.raises(ConfigError) as err:
        resolve_config_path("pop_grp")
    names = [name for name, _ in list_presets()]
    assert "(did you mean pop_grpo" in str(err.value)
    assert f"presets: {', '.join(names)} (`popgrpo config --list`" in str(err.value)
    assert {"grpo", "qd_grpo", "maxent_grpo", "pop_grpo", "lm_exec", "pop_grpo_scale"} <= set(names)
    assert dict(list_presets())["pop_grpo"] == "Pop-GRPO (main paper §4.3)"


def _schema_descriptions() -> dict[str, str]:
    """``Section.field`` → description, for every field of every model in popgrpo/config/schema.py."""
    import inspect

    from pydantic import BaseModel

    from popgrpo.config import schema

    models = [
        c
        for _, c in inspect.getmembers(schema, inspect.isclass)
        if issubclass(c, BaseModel) and c.__module__ == schema.__name__
    ]
    return {f"{m.__name__}.{name}": f.description or "" for m in models for name, f in m.model_fields.items()}


# A measured figure: a number with a unit of time (``2.5 ms``, ``40 s``), a speed ratio (``1.25x``,
# ``0.72×``, not the product ``10 × 10``), a throughput (``tokens/s``) or the machine it was
# measured on (``2-core``, ``2 CPU cores``; not an example of what fits, ``K = 256 on 2 cores``).
MEASURED = re.compile(r"\d(?:[\d.,]*\d)?\s*(?:ms|s|min|h|[x×](?!\s*\d))(?![\w/])|\d\s*tokens/s|\d+(?:-| CPU )cores?\b")
DESCRIPTION_CHARS = 700


def test_field_descriptions_say_what_a_field_does_and_leave_measurements_to_the_docs():
    """A measured figure goes stale with the code and the machine: it belongs in the docs page a
    description points to, not in the description."""
    descriptions = _schema_descriptions()
    assert len(descriptions) > 200
    assert {k: MEASURED.findall(d) for k, d in descriptions.items() if MEASURED.search(d)} == {}
    assert {k: len(d) for k, d in descriptions.items() if len(d) > DESCRIPTION_CHARS} == {}


@pytest.mark.parametrize(
    ("text", "measured"),
    [
        ("costs about 2.5 ms of CPU a round", True),
        ("on the quiet 2-core machine 1.25x the sequential step", True),
        ("took 0.65-0.69x TRL's time per step on 2 CPU cores, 0.92× without", True),
        ("the sequential step's 120 tokens/s", True),
        ("one archive cell at the default 10 × 10 grid", False),
        ("every component shrinks to at most 30%", False),
        ("fit large populations on few cores (e.g. K = 256 on 2 cores)", False),
        ("timeout_s seconds; 0: off (BENCHMARKS.md section 7)", False),
    ],
)
def test_the_measured_figure_rule(text, measured):
    assert bool(MEASURED.search(text)) is measured
