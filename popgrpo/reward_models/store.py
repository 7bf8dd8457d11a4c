"""The RM directory: what ``popgrpo rm train`` writes and a proxy reward reads.

::

    DIR/rms.json        manifest: what the RMs score (``features``: ``idea``, or
                        ``embedding:<model>`` for a text environment's sentence embeddings),
                        architecture, each RM's hyper-parameters and accuracies,
                        WARM's and ENS's accuracies, the training config
    DIR/rm_<k>.pt       RM k's weights (state dict of tensors)
    DIR/warm.pt         the weight average of all M RMs (WARM)
    DIR/pretrain.pt     the pre-trained featurizer's checkpoints (Baklava's initialisations),
                        the linear-probed head every RM starts from, and ``features``
    DIR/data.pt         the preference pairs: train (with the corruption mask), test, shifted

ENS has no file of its own: it is the RMs of the manifest's ``ens`` list, scored together.
Everything is loaded with ``torch.load(weights_only=True)`` (tensors and plain containers).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from popgrpo.core.reward_model import RewardModel

__all__ = ["MANIFEST", "RMDirError", "build_model", "load_manifest", "load_states", "save_tensor_file", "write_json"]

MANIFEST = "rms.json"
FORMAT = 1


class RMDirError(ValueError):
    """An RM directory that is missing, incomplete or not one (the CLI exits 2 with the message)."""


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as JSON atomically (a temporary file renamed over ``path``)."""
    _replace(path, (json.dumps(data, indent=2) + "\n").encode())


def save_tensor_file(path: Path, obj: object) -> None:
    """``torch.save`` atomically: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def load_manifest(rm_dir: str | Path) -> dict:
    """The manifest of ``rm_dir``, checked: the directory, the manifest and every RM file it names exist."""
    rm_dir = Path(rm_dir)
    if not rm_dir.is_dir():
        raise RMDirError(f"RM directory {rm_dir}: not found (train one with `popgrpo rm train --out {rm_dir}`)")
    path = rm_dir / MANIFEST
    if not path.is_file():
        raise RMDirError(f"RM directory {rm_dir}: no {MANIFEST}; not written by `popgrpo rm train`, or unfinished")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RMDirError(f"RM directory {rm_dir}: {MANIFEST} is unreadable: {exc}".replace("\n", " ")) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not manifest.get("models"):
        raise RMDirError(f"RM directory {rm_dir}: {MANIFEST} is not an RM manifest of format {FORMAT}")
    for entry in [*manifest["models"], manifest.get("warm") or {}]:
        if entry and not (rm_dir / entry["file"]).is_file():
            raise RMDirError(f"RM directory {rm_dir}: {entry['file']} is missing")
    return manifest


def load_states(rm_dir: str | Path, files: list[str]) -> list[dict[str, torch.Tensor]]:
    """The state dicts in ``files`` of ``rm_dir``."""
    states = []
    for name in files:
        path = Path(rm_dir) / name
        try:
            states.append(torch.load(path, weights_only=True, map_location="cpu"))
        except Exception as exc:
            raise RMDirError(f"RM directory {rm_dir}: cannot load {name}: {exc}".replace("\n", " ")) from None
    return states


def build_model(manifest: dict, state: dict[str, torch.Tensor] | None = None) -> RewardModel:
    """An RM of the manifest's architecture, in eval mode, with ``state`` loaded when given."""
    model = RewardModel(manifest["in_dim"], manifest["hidden"], manifest["depth"])
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise RMDirError(f"RM weights do not fit the manifest's architecture: {exc}".replace("\n", " ")) from None
    return model.eval()
