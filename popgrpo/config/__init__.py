"""The run configuration: typed, validated once, documented once.

* :mod:`~popgrpo.config.schema`: the pydantic models (:class:`Config` and its sections),
  whose field descriptions are the only documentation of each option.
* :mod:`~popgrpo.config.loader`: YAML within bounds, ``--set key=value`` overrides, presets,
  and one-line :class:`ConfigError` messages naming the field (the CLI exits 2 on them).
* :mod:`~popgrpo.config.reference`: the Markdown reference table (docs/reference/config.md).

Fields that name an implementation take their values from :mod:`popgrpo.registry`.
"""

from __future__ import annotations

from popgrpo.config.loader import (
    DEFAULT_PRESET,
    PRESET_DIR,
    load_args_config,
    load_config,
    load_model,
    parse_override,
    preset_path,
    read_yaml,
    resolve_config_path,
)
from popgrpo.config.reference import config_markdown, model_markdown
from popgrpo.config.schema import (
    HELD_OUT_METRICS,
    MAX_ARCHIVE_CELLS,
    MAX_CELLS_PER_DIM,
    MAX_POPULATION,
    ArchiveConfig,
    CausalLMConfig,
    Config,
    ConfigError,
    EntropyConfig,
    EnvConfig,
    EvalConfig,
    GRPOConfig,
    LoRAConfig,
    MaxEntConfig,
    NoveltyConfig,
    PolicyConfig,
    PopulationConfig,
    ProxyConfig,
    QDConfig,
    ResourcesConfig,
    RewardConfig,
    RewardSpec,
    RolloutConfig,
    RunConfig,
    SchedulerConfig,
    Section,
    TextEnvConfig,
    checkpoint_due,
)

__all__ = [
    "DEFAULT_PRESET",
    "HELD_OUT_METRICS",
    "MAX_ARCHIVE_CELLS",
    "MAX_CELLS_PER_DIM",
    "MAX_POPULATION",
    "PRESET_DIR",
    "ArchiveConfig",
    "CausalLMConfig",
    "Config",
    "ConfigError",
    "EntropyConfig",
    "EnvConfig",
    "EvalConfig",
    "GRPOConfig",
    "LoRAConfig",
    "MaxEntConfig",
    "NoveltyConfig",
    "PolicyConfig",
    "PopulationConfig",
    "ProxyConfig",
    "QDConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RewardSpec",
    "RolloutConfig",
    "RunConfig",
    "SchedulerConfig",
    "Section",
    "TextEnvConfig",
    "checkpoint_due",
    "config_markdown",
    "load_args_config",
    "load_config",
    "load_model",
    "model_markdown",
    "parse_override",
    "preset_path",
    "read_yaml",
    "resolve_config_path",
]
