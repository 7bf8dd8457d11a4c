"""``popgrpo rm train``: M reward models fine-tuned in parallel as Ray Tune trials.

Each trial is one RM; the hyper-parameters Tune samples for it (learning rate log-uniform,
dropout uniform, the featurizer checkpoint it starts from with Baklava) are WARM's sources of
diversity, and its data order comes from its index. Tune's sampler is seeded
(``BasicVariantGenerator(random_state=seed)``), so one config gives one set of draws. The
driver prepares the data and the featurizer first and averages the RMs at the end
(:mod:`popgrpo.reward_models.training`). Trials read and write the RM directory, so on a
multi-node cluster it must be on storage every node sees.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from popgrpo.config import Config
from popgrpo.reward_models.config import RMTrainConfig
from popgrpo.reward_models.training import baklava_choices, finalize, finetune_member, prepare

__all__ = ["search_space", "shifted_policy_weights", "train_rms"]


def shifted_policy_weights(base: Config, epochs: int) -> dict:
    """Weights of ``base``'s member 0 after ``epochs`` epochs of training on execution, in this process."""
    from popgrpo.runtime.executor import LocalExecutor

    executor = LocalExecutor(base.model_copy(update={"reward": base.reward.model_copy(update={"source": "execution"})}))
    executor.train(epochs)
    return executor.get_weights([0])[0]


def search_space(rm_cfg: RMTrainConfig) -> dict:
    """One trial per RM index, each with its own sampled lr, dropout and featurizer checkpoint."""
    from ray import tune

    ft = rm_cfg.finetune
    return {
        "rm_index": tune.grid_search(list(range(ft.n_models))),
        "lr": tune.loguniform(ft.lr_min, ft.lr_max),
        "dropout": tune.uniform(ft.dropout_min, ft.dropout_max) if ft.dropout_max > ft.dropout_min else ft.dropout_min,
        "init_checkpoint": tune.choice(baklava_choices(rm_cfg)),
    }


def _trainable(params: dict) -> None:
    import torch
    from ray import tune

    torch.set_num_threads(1)
    rm_cfg = RMTrainConfig.model_validate_json(params["rm_config"])
    entry = finetune_member(rm_cfg, params["rm_dir"], params)
    accuracy = {f"acc_{k}": v for k, v in entry["accuracy"].items() if v is not None}
    tune.report({**accuracy, "entry": json.dumps(entry)})


def train_rms(
    rm_cfg: RMTrainConfig,
    base: Config,
    rm_dir: str | Path,
    address: str | None = None,
    num_cpus: int | None = None,
    progress: bool = True,
) -> dict:
    """Prepare, fine-tune the M RMs on Ray Tune, finalize; return the manifest (``rms.json``)."""
    import ray
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from popgrpo.runtime.cluster import connect

    rm_dir = Path(rm_dir).resolve()
    shifted = shifted_policy_weights(base, rm_cfg.data.shift_epochs) if rm_cfg.data.shift_epochs else None
    prepare(rm_cfg, base, rm_dir, shifted)
    n = rm_cfg.finetune.n_models
    bar = tqdm(total=n, desc="rm train", unit="RM", disable=not progress)

    class _Progress(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            bar.update(1)
            acc = (trial.last_result or {}).get("acc_test")
            if acc is not None:
                bar.set_postfix_str(f"last test acc {acc:.3f}")

    started_ray = connect(address, num_cpus=num_cpus)
    try:
        tuner = tune.Tuner(
            tune.with_resources(_trainable, {"cpu": 1}),
            param_space={**search_space(rm_cfg), "rm_config": rm_cfg.model_dump_json(), "rm_dir": str(rm_dir)},
            tune_config=tune.TuneConfig(
                search_alg=BasicVariantGenerator(random_state=rm_cfg.seed), num_samples=1, reuse_actors=True
            ),
            run_config=tune.RunConfig(
                name="rm_train", storage_path=str(rm_dir / "tune"), verbose=0, callbacks=[_Progress()]
            ),
        )
        results = tuner.fit()
    finally:
        bar.close()
        if started_ray:
            ray.shutdown()
    errors = [r.error for r in results if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} RM trials failed; first: {errors[0]}")
    entries = []
    for r in results:
        if r.metrics is None:  # Ray types it Optional; a trial that did not fail reported its entry
            raise RuntimeError(f"an RM trial reported no metrics: {r.path}")
        entries.append(json.loads(r.metrics["entry"]))
    return finalize(rm_cfg, rm_dir, entries)
