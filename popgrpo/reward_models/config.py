"""``popgrpo rm train``'s configuration (YAML + ``--set``, validated like the run config).

Field descriptions are the documentation: ``popgrpo rm train --markdown`` prints them
(docs/WARM.md carries that table).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from popgrpo.config import Section, load_model, model_markdown

__all__ = ["RMTrainConfig", "load_rm_config", "rm_config_markdown"]


class RMDataConfig(Section):
    reference_ideas: int = Field(
        default=8192,
        ge=16,
        le=1_000_000,
        description="Ideas sampled from the reference policy (the base config's initial policy) and executed (data.executions times each); the preference pairs are drawn among them, training pairs from one half, test pairs from the other.",
    )
    train_pairs: int = Field(
        default=4000, ge=10, le=1_000_000, description="Preference pairs the RMs are fine-tuned on."
    )
    test_pairs: int = Field(
        default=1000,
        ge=10,
        le=1_000_000,
        description="Held-out pairs from the same reference ideas' distribution (in-distribution test).",
    )
    shifted_pairs: int = Field(
        default=1000,
        ge=10,
        le=1_000_000,
        description="Pairs of ideas of a GRPO-trained policy (distribution shift), with shift_epochs > 0.",
    )
    shift_epochs: int = Field(
        default=0,
        ge=0,
        description="Epochs of GRPO (the base config, on execution) that make the shifted policy; 0: no shifted set.",
    )
    executions: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="Executions of each reference idea; its executed reward is their mean (one execution pays 0 on failure, so a single one mostly says which idea happened to run).",
    )
    temperatures: list[float] = Field(
        default_factory=lambda: [0.5, 1.0, 1.5],
        min_length=1,
        description="Factors on the reference policy's standard deviation (a causal LM: on its sampling temperature), one equal share of the reference ideas each (preference data sampled at several temperatures).",
    )

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(t <= 0 for t in v):
            raise ValueError(f"every temperature must be > 0, got {v}")
        return v

    corruption: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Fraction of training pairs whose label is swapped, exactly round(fraction·n) (WARM §5: 0.25 in the corruption study). Test and shifted pairs are never corrupted.",
    )


class RMFeaturizerConfig(Section):
    hidden: int = Field(default=64, ge=1, le=4096, description="Width of the featurizer's layers.")
    depth: int = Field(default=2, ge=1, le=8, description="ReLU layers of the featurizer.")
    pretrain_ideas: int = Field(
        default=8192,
        ge=16,
        le=1_000_000,
        description="Unlabelled ideas (a text base: completions) the featurizer is pre-trained on.",
    )
    pretrain_steps: int = Field(
        default=600,
        ge=1,
        description="Pre-training steps: regress each idea's norm and direction (reward-free geometry of the idea space) from ideas of norms 0–12; for a text base, reconstruct the sentence embeddings of never-executed completions of the reference LM (an auto-encoder).",
    )
    pretrain_lr: float = Field(default=3e-3, gt=0, description="Adam learning rate of the pre-training.")
    checkpoints: int = Field(
        default=5,
        ge=1,
        description="Featurizer checkpoints recorded evenly along pre-training (Baklava's initialisations).",
    )


class RMFinetuneConfig(Section):
    n_models: int = Field(default=6, ge=1, le=256, description="RMs fine-tuned, M (one Ray Tune trial each).")
    epochs: int = Field(default=10, ge=1, description="Passes over the training pairs.")
    batch_size: int = Field(default=64, ge=1, description="Pairs per Adam step.")
    lr_min: float = Field(
        default=1e-3, gt=0, description="Each RM's learning rate is drawn log-uniformly from [lr_min, lr_max]."
    )
    lr_max: float = Field(default=1e-2, gt=0, description="See lr_min.")
    dropout_min: float = Field(
        default=0.0, ge=0, lt=1, description="Each RM's dropout is drawn uniformly from [dropout_min, dropout_max]."
    )
    dropout_max: float = Field(default=0.2, ge=0, lt=1, description="See dropout_min.")
    baklava: bool = Field(
        default=True,
        description="Baklava (WARM §3.3): each RM starts from a featurizer checkpoint drawn from the second half of pre-training; false: every RM from the last checkpoint.",
    )
    weight_decay: float = Field(default=0.0, ge=0, description="Adam's L2 weight decay.")
    probe_epochs: int = Field(
        default=5,
        ge=0,
        description="Epochs of the linear probe: the head alone trained on the last featurizer checkpoint, then shared by every RM as its starting head (WARM appendix B.3); 0 keeps a random shared head.",
    )

    @model_validator(mode="after")
    def _ranges(self) -> RMFinetuneConfig:
        if self.lr_min > self.lr_max:
            raise ValueError("lr_min must be <= lr_max")
        if self.dropout_min > self.dropout_max:
            raise ValueError("dropout_min must be <= dropout_max")
        return self


class RMTrainConfig(Section):
    """An RM directory's recipe: reference policy, data, featurizer, the M fine-tunings."""

    seed: int = Field(
        default=0,
        ge=0,
        description="Root seed: reference ideas, executions, pairs, pre-training, the hyper-parameter draws.",
    )
    base: str = Field(
        default="grpo",
        description="Run config (preset name or YAML path) whose environment and initial policy (at seed) are the reference policy; its GRPO trains the shifted policy. An idea-environment config (Gaussian policy) gives RMs over ideas; a text-environment config (causal LM) gives RMs over the sentence embeddings of its completions (env.text.embedding_model), for language-model members.",
    )
    data: RMDataConfig = Field(default_factory=RMDataConfig, description="Preference data.")
    featurizer: RMFeaturizerConfig = Field(
        default_factory=RMFeaturizerConfig, description="The shared pre-trained featurizer."
    )
    finetune: RMFinetuneConfig = Field(
        default_factory=RMFinetuneConfig, description="The M fine-tunings (WARM's sources of diversity)."
    )


def load_rm_config(path: str | Path | None, overrides: Iterable[str] = ()) -> RMTrainConfig:
    """Like :func:`popgrpo.config.load_config`, for :class:`RMTrainConfig`; raises :class:`~popgrpo.config.ConfigError`."""
    return load_model(RMTrainConfig, path, overrides)


def rm_config_markdown() -> str:
    """The ``rm train`` config's reference table (docs/WARM.md)."""
    return model_markdown(RMTrainConfig, escape=False)
