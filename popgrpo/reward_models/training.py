"""Making an RM directory, step by step, without Ray: the pieces ``popgrpo rm train`` runs
(:mod:`popgrpo.reward_models.tune` runs :func:`finetune_member` as Ray Tune trials) and the
WARM study calls in-process.

1. :func:`prepare`: the preference pairs and the pre-trained featurizer's checkpoints.
2. :func:`finetune_member`: RM k from a featurizer checkpoint with its own lr, dropout, data order.
3. :func:`finalize`: WARM (the weight average), ENS, every accuracy, the manifest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from popgrpo.columns import json_float
from popgrpo.config import Config
from popgrpo.core.reward_model import (
    FinetuneSpec,
    PreferencePairs,
    RewardModel,
    ensemble_scores,
    finetune,
    linear_probe,
    pair_accuracy,
    pretrain_featurizer,
    weight_average,
)
from popgrpo.core.seeding import derive_seed, torch_generator
from popgrpo.reward_models.config import RMTrainConfig
from popgrpo.reward_models.data import PURPOSE_PRETRAIN, STREAM_RM, build_pairs, reference_data
from popgrpo.reward_models.store import FORMAT, MANIFEST, build_model, save_tensor_file, write_json

__all__ = [
    "SUBSETS",
    "accuracies",
    "baklava_choices",
    "draw_hyperparameters",
    "finalize",
    "finetune_member",
    "load_pairs",
    "prepare",
]

# Where accuracies are measured (WARM Figs. 4–5): train pairs with their true label, the
# corrupted train pairs against the swapped label they were trained on (memorisation: lower
# is more robust), held-out pairs, pairs of a trained policy's ideas.
SUBSETS = ("train_clean", "train_corrupt", "test", "shifted")
PURPOSE_HEAD, PURPOSE_DATA_ORDER, PURPOSE_HPARAMS = 5, 6, 7


def _pairs_to_dict(pairs: PreferencePairs) -> dict[str, torch.Tensor]:
    return {"a": pairs.a, "b": pairs.b, "y": pairs.y, "true_y": pairs.true_y, "corrupted": pairs.corrupted}


def load_pairs(rm_dir: str | Path) -> dict[str, PreferencePairs]:
    data = torch.load(Path(rm_dir) / "data.pt", weights_only=True)
    return {name: PreferencePairs(**tensors) for name, tensors in data.items()}


def prepare(
    rm_cfg: RMTrainConfig,
    base: Config,
    rm_dir: str | Path,
    shifted_weights: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Write ``data.pt`` (pairs) and ``pretrain.pt`` (the featurizer checkpoints, the linear
    probe every RM's head starts from, and what the RMs score) into ``rm_dir``. ``base`` says
    where the data come from: ideas of a Gaussian policy, or sentence embeddings of a causal
    LM's completions (:func:`~popgrpo.reward_models.data.reference_data`)."""
    rm_dir = Path(rm_dir)
    rm_dir.mkdir(parents=True, exist_ok=True)
    d = rm_cfg.data
    reference = reference_data(base)
    pairs = build_pairs(
        reference,
        seed=rm_cfg.seed,
        reference_ideas=d.reference_ideas,
        train_pairs=d.train_pairs,
        test_pairs=d.test_pairs,
        corruption=d.corruption,
        executions=d.executions,
        temperatures=d.temperatures,
        shifted_weights=shifted_weights,
        shifted_pairs=d.shifted_pairs,
    )
    save_tensor_file(rm_dir / "data.pt", {k: _pairs_to_dict(v) for k, v in pairs.items()})
    f = rm_cfg.featurizer
    gen = torch_generator(rm_cfg.seed, STREAM_RM, PURPOSE_PRETRAIN)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(rm_cfg.seed, STREAM_RM, PURPOSE_PRETRAIN, 1))
        model = RewardModel(int(pairs["train"].a.shape[1]), f.hidden, f.depth)
    inputs, targets = reference.pretraining_set(f.pretrain_ideas, gen)
    checkpoints = pretrain_featurizer(
        model,
        inputs,
        targets,
        steps=f.pretrain_steps,
        n_checkpoints=f.checkpoints,
        lr=f.pretrain_lr,
        batch_size=128,
        generator=gen,
    )
    model.eval()
    probe_gen = torch_generator(rm_cfg.seed, STREAM_RM, PURPOSE_HEAD)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(rm_cfg.seed, STREAM_RM, PURPOSE_HEAD))
        model.head.reset_parameters()
    linear_probe(
        model, pairs["train"], epochs=rm_cfg.finetune.probe_epochs, lr=1e-2, batch_size=128, generator=probe_gen
    )
    head = {k: v.detach().clone() for k, v in model.head.state_dict().items()}
    save_tensor_file(rm_dir / "pretrain.pt", {"featurizers": checkpoints, "head": head, "features": reference.features})


def baklava_choices(rm_cfg: RMTrainConfig) -> list[int]:
    """Featurizer checkpoints an RM may start from: the second half of pre-training with
    Baklava, else only the last."""
    n = rm_cfg.featurizer.checkpoints
    return list(range(n // 2, n)) if rm_cfg.finetune.baklava else [n - 1]


def draw_hyperparameters(rm_cfg: RMTrainConfig) -> list[dict]:
    """Every RM's lr (log-uniform), dropout (uniform) and featurizer checkpoint, drawn from the
    config's seed: the in-process equivalent of the Tune search space (:mod:`~popgrpo.reward_models.tune`)."""
    ft = rm_cfg.finetune
    rng = np.random.default_rng(derive_seed(rm_cfg.seed, STREAM_RM, PURPOSE_HPARAMS))
    choices = baklava_choices(rm_cfg)
    return [
        {
            "rm_index": k,
            "lr": float(math.exp(rng.uniform(math.log(ft.lr_min), math.log(ft.lr_max)))),
            "dropout": float(rng.uniform(ft.dropout_min, ft.dropout_max)),
            "init_checkpoint": int(rng.choice(choices)),
        }
        for k in range(ft.n_models)
    ]


def _initial_model(
    rm_cfg: RMTrainConfig, in_dim: int, featurizer: Mapping[str, torch.Tensor], head: Mapping[str, torch.Tensor]
) -> RewardModel:
    """A featurizer checkpoint with the linear-probed head every RM shares: RMs differ only by
    their start along pre-training and their fine-tuning, so their weights stay averageable."""
    f = rm_cfg.featurizer
    model = RewardModel(in_dim, f.hidden, f.depth)
    model.featurizer.load_state_dict(dict(featurizer))
    model.head.load_state_dict(dict(head))
    return model


def accuracies(score: Callable[[torch.Tensor], torch.Tensor], pairs: Mapping[str, PreferencePairs]) -> dict[str, float]:
    """Pair accuracy of ``score`` (``[n, d]`` → ``[n]``) on each of :data:`SUBSETS` present (NaN otherwise)."""
    out: dict[str, float] = dict.fromkeys(SUBSETS, math.nan)
    train = pairs["train"]
    clean, corrupt = train.subset(~train.corrupted), train.subset(train.corrupted)
    with torch.no_grad():
        out["train_clean"] = pair_accuracy(score(clean.a), score(clean.b), clean.true_y)
        out["train_corrupt"] = pair_accuracy(score(corrupt.a), score(corrupt.b), corrupt.y)
        for name in ("test", "shifted"):
            if name in pairs:
                p = pairs[name]
                out[name] = pair_accuracy(score(p.a), score(p.b), p.y)
    return out


def finetune_member(rm_cfg: RMTrainConfig, rm_dir: str | Path, hparams: Mapping) -> dict:
    """Fine-tune RM ``hparams["rm_index"]``, write ``rm_<k>.pt``; return its entry of the manifest."""
    rm_dir = Path(rm_dir)
    k = int(hparams["rm_index"])
    pairs = load_pairs(rm_dir)
    pretrained = torch.load(rm_dir / "pretrain.pt", weights_only=True)
    in_dim = pairs["train"].a.shape[1]
    featurizer = pretrained["featurizers"][int(hparams["init_checkpoint"])]
    model = _initial_model(rm_cfg, in_dim, featurizer, pretrained["head"])
    ft = rm_cfg.finetune
    spec = FinetuneSpec(
        lr=float(hparams["lr"]),
        dropout=float(hparams["dropout"]),
        data_seed=derive_seed(rm_cfg.seed, STREAM_RM, PURPOSE_DATA_ORDER, k),
        epochs=ft.epochs,
        batch_size=ft.batch_size,
        weight_decay=ft.weight_decay,
    )
    losses = finetune(model, pairs["train"], spec)
    name = f"rm_{k}.pt"
    save_tensor_file(rm_dir / name, model.state_dict())
    return {
        "file": name,
        "rm_index": k,
        "lr": spec.lr,
        "dropout": spec.dropout,
        "init_checkpoint": int(hparams["init_checkpoint"]),
        "data_seed": spec.data_seed,
        "final_loss": losses[-1],
        "accuracy": _json(accuracies(model, pairs)),
    }


def _json(accuracy: dict[str, float]) -> dict[str, float | None]:
    """Accuracies for JSON: a subset that is absent (NaN) becomes null."""
    return {k: json_float(v) for k, v in accuracy.items()}


def _models(manifest: dict, states: Sequence[Mapping[str, torch.Tensor]]) -> list[RewardModel]:
    return [build_model(manifest, dict(s)) for s in states]


def finalize(rm_cfg: RMTrainConfig, rm_dir: str | Path, entries: Sequence[dict]) -> dict:
    """WARM and ENS of all the RMs in ``entries``: ``warm.pt``, their accuracies, ``rms.json``."""
    rm_dir = Path(rm_dir)
    entries = sorted(entries, key=lambda e: e["rm_index"])
    pairs = load_pairs(rm_dir)
    pretrained = torch.load(rm_dir / "pretrain.pt", weights_only=True)
    manifest = {
        "format": FORMAT,
        "features": pretrained["features"],
        "in_dim": int(pairs["train"].a.shape[1]),
        "hidden": rm_cfg.featurizer.hidden,
        "depth": rm_cfg.featurizer.depth,
        "models": list(entries),
    }
    states = [torch.load(rm_dir / e["file"], weights_only=True) for e in entries]
    warm_state = weight_average(states)
    save_tensor_file(rm_dir / "warm.pt", warm_state)
    warm = build_model(manifest, warm_state)
    members = _models(manifest, states)
    manifest["warm"] = {"file": "warm.pt", "n_models": len(entries), "accuracy": _json(accuracies(warm, pairs))}
    manifest["ens"] = {
        "members": [e["file"] for e in entries],
        "accuracy": _json(accuracies(lambda x: ensemble_scores([m(x) for m in members]), pairs)),
    }
    manifest["config"] = rm_cfg.model_dump(mode="json")
    write_json(rm_dir / MANIFEST, manifest)
    return manifest
