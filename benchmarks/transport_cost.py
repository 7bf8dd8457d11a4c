"""What moving member states through Ray's object store costs: torch tensors vs numpy (runtime/transport.py).

``python -m benchmarks.transport_cost [--members 5] [--hidden 128] [--repeats 20] [--out JSON]``

The states of ``--members`` members of the pop_grpo preset (weights, Adam, random generator:
what an ``adopt`` answer carries for the round's checkpoint), after two epochs in this process,
are ``ray.put`` and ``ray.get`` on an embedded Ray, ``--repeats`` times each way, alternating:

* **tensors**: the state dicts as they are (Ray pickles each tensor through ``torch.save``);
* **packed**: :func:`popgrpo.runtime.transport.pack` before the put and
  :func:`~popgrpo.runtime.transport.unpack` after the get, as the executor and the member
  actors do; the unpacked tensors are copies that the run owns.

Times are wall seconds of this process (the put's serialisation and the get's
deserialisation both run here); median and min–max over the repeats. The JSON holds every
repeat; ``--report JSON`` prints the table again from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from popgrpo.core.trees import map_leaves
from popgrpo.markdown import md_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "data" / "transport_cost.json"


def _states(members: int, hidden: int) -> list[dict]:
    from popgrpo.config import load_config, preset_path
    from popgrpo.runtime.executor import LocalExecutor

    cfg = load_config(
        preset_path("pop_grpo"),
        [f"population.size={members}", f"scheduler.top_m={min(3, members)}", f"policy.hidden={hidden}"],
    )
    executor = LocalExecutor(cfg)
    executor.train(2, 0)
    return executor.member_states()


def _count(obj) -> tuple[int, int]:
    """Tensors and their bytes in a nest of dicts, lists and tuples: the leaves
    :func:`popgrpo.runtime.transport.pack` packs (:func:`popgrpo.core.trees.map_leaves`)."""
    tensors: list[torch.Tensor] = []
    map_leaves(obj, torch.Tensor, tensors.append)
    return len(tensors), sum(t.numel() * t.element_size() for t in tensors)


def measure(members: int, hidden: int, repeats: int) -> dict:
    import ray

    from benchmarks.common import local_ray
    from popgrpo.runtime.transport import pack, unpack

    states = _states(members, hidden)
    tensors, n_bytes = _count(states)
    sides = {
        "tensors": (lambda s: s, lambda s: s),
        "packed": (pack, unpack),
    }
    times: dict[str, dict[str, list[float]]] = {name: {"put": [], "get": []} for name in sides}
    with local_ray(num_cpus=1):
        for i in range(repeats + 1):  # the first of each is a warm-up, not kept
            for name, (before, after) in sides.items():
                start = time.perf_counter()
                ref = ray.put(before(states))
                put = time.perf_counter() - start
                start = time.perf_counter()
                back = after(ray.get(ref))
                get = time.perf_counter() - start
                del ref, back
                if i > 0:
                    times[name]["put"].append(put)
                    times[name]["get"].append(get)
    return {
        "members": members,
        "hidden": hidden,
        "repeats": repeats,
        "tensors": tensors,
        "bytes": n_bytes,
        "times": times,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def markdown(r: dict) -> str:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:.2f} ({min(values) * 1e3:.2f}–{max(values) * 1e3:.2f})"

    rows = []
    for name, label in (("tensors", "torch tensors as they are"), ("packed", "packed as numpy (popgrpo)")):
        t = r["times"][name]
        total = [p + g for p, g in zip(t["put"], t["get"], strict=True)]
        rows.append([label, cell(t["put"]), cell(t["get"]), cell(total)])
    ratio = statistics.median(
        (p + g) / (pp + pg)
        for p, g, pp, pg in zip(
            r["times"]["tensors"]["put"],
            r["times"]["tensors"]["get"],
            r["times"]["packed"]["put"],
            r["times"]["packed"]["get"],
            strict=True,
        )
    )
    head = (
        f"`python -m benchmarks.transport_cost --members {r['members']} --hidden {r['hidden']} --repeats {r['repeats']}`, "
        f"{r['when']}: the states of {r['members']} pop_grpo members (policy.hidden = {r['hidden']}; "
        f"{r['tensors']} tensors, {r['bytes'] / 1e6:.2f} MB) through an embedded Ray's object store, "
        f"ms, median (min–max) of {r['repeats']} alternated repeats; tensors ÷ packed, put + get: "
        f"{ratio:.1f}× (median of the paired repeats)."
    )
    return head + "\n\n" + md_table(["how", "ray.put", "ray.get", "put + get"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report", type=Path, help="print the table from this JSON, run nothing")
    args = parser.parse_args(argv)
    if args.report:
        print(markdown(json.loads(args.report.read_text())))
        return 0
    result = measure(args.members, args.hidden, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
