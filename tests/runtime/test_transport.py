"""Tensors between the driver and the actors travel as numpy (popgrpo.runtime.transport): same bits back."""

from collections import namedtuple

import numpy as np
import torch

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.transport import Packed, pack, unpack


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _same(a, b) -> bool:
    """Equal structure, and tensors of the same dtype, shape and bits."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b))
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def _zoo() -> dict:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    zoo = {
        "float32": base,
        "float64": base.double(),
        "float16": base.half(),
        "bfloat16": base.bfloat16(),  # no numpy dtype: carried as int16
        "int64": torch.arange(7),
        "uint8": torch.randint(0, 255, (5,), generator=g, dtype=torch.uint8),
        "bool": base > 0,
        "scalar": torch.tensor(3.5),  # Adam's step is a 0-d tensor
        "transposed": base.t(),  # not contiguous
        "grad": base.clone().requires_grad_(True),
        "nested": [{"a": base[:2], "b": (base[0], 1.5, "x")}, None],
        "rng": torch.Generator().manual_seed(1).get_state(),
        "numpy": np.arange(3.0),  # passes through
    }
    if hasattr(torch, "float8_e4m3fn"):
        zoo["float8"] = base.to(torch.float8_e4m3fn)
    return zoo


def test_pack_then_unpack_gives_the_same_bits_in_tensors_of_their_own():
    zoo = _zoo()
    packed = pack(zoo)
    assert isinstance(packed["bfloat16"], Packed) and isinstance(packed["nested"][0]["b"][0], Packed)
    assert not any(isinstance(v, torch.Tensor) for v in packed.values())
    back = unpack(packed)
    assert _same({k: v for k, v in zoo.items() if k != "grad"}, {k: v for k, v in back.items() if k != "grad"})
    assert torch.equal(back["grad"], zoo["grad"].detach()) and not back["grad"].requires_grad
    assert back["transposed"].is_contiguous() and torch.equal(back["transposed"], zoo["transposed"])
    # The unpacked tensors own their memory: writing one leaves the original alone.
    back["float32"].add_(1.0)
    assert not torch.equal(back["float32"], zoo["float32"])
    Point = namedtuple("Point", "x y")
    assert unpack(pack(Point(1, 2))) == Point(1, 2)  # named tuples are left as they are


def test_a_member_state_survives_a_real_ray_round_trip_packed(ray_local):
    """What actors send back (states, weights) comes out of Ray's object store bit for bit, writable."""
    import ray

    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=2", "scheduler.top_m=2", "run.epochs=2", "scheduler.interval_epochs=1"],
    )
    executor = LocalExecutor(cfg)
    executor.train(1, 0)
    states = executor.member_states()
    back = unpack(ray.get(ray.put(pack(states))))
    assert _same(states, back)
    weight = next(iter(back[0]["policy"].values()))
    weight.mul_(2.0)  # a read-only view of the object store would refuse this
    executor.members[0].load_state_dict(unpack(ray.get(ray.put(pack(states))))[0])
    assert _same(executor.member_states()[0], states[0])


def test_adopted_bases_are_put_once_and_anew_after_a_rebuild(ray_local):
    """The bases of an adopt call are ``ray.put`` once for every actor and every retry, until an
    actor is rebuilt: then anew, so that no copy a member fetched on a node that froze since
    is among the locations a retried fetch may pick (``_PutOnce``)."""
    import ray

    from popgrpo.runtime.ray_executor import _PutOnce

    bases = {"a": {"w": torch.arange(4.0)}, "b": {"w": torch.ones(2)}}
    rebuilds = [0]
    put = _PutOnce(bases, lambda: rebuilds[0])
    first = put.refs(["a", "b"])
    assert list(put.refs(["b"])) == ["b"] and put.refs(["b"])["b"] == first["b"]  # one object, asked twice
    rebuilds[0] += 1
    again = put.refs(["a", "b"])
    assert all(again[k] != first[k] for k in bases)  # new objects
    for k, base in bases.items():
        assert _same(unpack(ray.get(again[k])), base) and _same(unpack(ray.get(first[k])), base)
    assert put.refs(["a"])["a"] == again["a"]
