"""Cost of the archive round trip: one member's GRPO step, in-process vs on Ray.

    python -m benchmarks.archive_roundtrip [--epochs 20]

The same member (same seed) trains in this process, then on Ray with its private archive in
its own actor (the default: no archive call), then on Ray with ``archive.shared=true``, where
the archive lives in the archive actor: one call per GRPO step for QD-GRPO and MaxEnt-GRPO,
whose updates need the statuses or novelty first, and one per epoch for plain GRPO, whose
epoch is inserted at its end. Start-up is excluded.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from popgrpo.config import load_config, preset_path
from popgrpo.markdown import md_table
from popgrpo.runtime.executor import LocalExecutor


def time_train(executor, epochs: int, steps: int) -> float:
    executor.train(1)  # warm-up: imports, first allocations
    start = time.perf_counter()
    executor.train(epochs)
    return (time.perf_counter() - start) / (epochs * steps) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    from popgrpo.runtime.cluster import start_local_ray
    from popgrpo.runtime.ray_executor import RayExecutor

    start_local_ray(num_cpus=2, temp_dir=tempfile.mkdtemp(prefix="pgb-", dir="/tmp"), include_dashboard=False)
    rows = []
    for preset in ("grpo", "qd_grpo", "maxent_grpo"):
        cfg = load_config(preset_path(preset), [f"run.epochs={args.epochs + 1}"])
        steps = cfg.grpo.steps_per_epoch
        local = time_train(LocalExecutor(cfg), args.epochs, steps)
        remote = {}
        for shared in (False, True):
            layout = load_config(preset_path(preset), [f"run.epochs={args.epochs + 1}", f"archive.shared={shared}"])
            ray_executor = RayExecutor(layout)
            remote[shared] = time_train(ray_executor, args.epochs, steps)
            ray_executor.close()
        private, shared = remote[False], remote[True]
        rows.append([preset, f"{local:.2f}", f"{private:.2f}", f"{private / local:.2f}×"])
        rows[-1] += [f"{shared:.2f}", f"{shared / local:.2f}×"]
    header = ["preset", "in-process ms/step", "Ray, private archive in the member actor", "ratio"]
    print(md_table([*header, "Ray, shared archive in the archive actor", "ratio"], rows))


if __name__ == "__main__":
    main()
