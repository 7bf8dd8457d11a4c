"""How tensors travel between the driver and the actors: as numpy arrays, which Ray moves cheaply.

Ray serialises a ``torch.Tensor`` through torch's own pickling, which writes every tensor's
storage with ``torch.save`` into a byte string and reads it back with ``torch.load``: a fixed
cost of tens of microseconds per tensor on each side, however small the tensor. A member's
state (weights, Adam's moments, the random generator) is a few hundred small tensors, so on
the pop_grpo preset moving five members' states cost about 10 ms to ``ray.put`` and 10 ms to
``ray.get``. numpy arrays are written to the object store as out-of-band buffers (pickle
protocol 5) and read back without a copy: packed, the same states move in about 4 and 1 ms
(``python -m benchmarks.transport_cost``, docs/benchmarks/suite.md, section 3;
``tests/runtime/test_transport.py`` checks the values).

:func:`pack` replaces every tensor in a nest of dicts, lists and tuples by a :class:`Packed`
(its bytes as a numpy array, its torch dtype and shape); :func:`unpack` turns them back into
tensors of their own memory (the arrays Ray hands out are read-only views of the object
store, which must not be written through). dtypes numpy lacks (bfloat16, the float8 types)
travel as integers of the same width and are viewed back. The values are bit-identical:
nothing is converted, only reinterpreted. Tensors on a GPU come back on the CPU, as a member's
states already are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from popgrpo.core.trees import map_leaves

__all__ = ["Packed", "pack", "unpack"]

# torch dtypes without a numpy equivalent → an integer dtype of the same width to carry their bits
_CARRIERS: dict[torch.dtype, torch.dtype] = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _CARRIERS[getattr(torch, _name)] = torch.uint8


@dataclass(frozen=True)
class Packed:
    """A tensor on its way through Ray: its bytes as numpy, viewed back as ``dtype`` on arrival."""

    array: np.ndarray
    dtype: torch.dtype


def _pack_tensor(tensor: torch.Tensor) -> Packed:
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    carrier = _CARRIERS.get(t.dtype)
    array = (t.view(carrier) if carrier is not None else t).numpy()
    return Packed(array, tensor.dtype)


def _unpack_tensor(packed: Packed) -> torch.Tensor:
    # A copy: what Ray hands out is a read-only view of the object store.
    tensor = torch.from_numpy(np.array(packed.array, copy=True))
    return tensor.view(packed.dtype) if packed.dtype in _CARRIERS else tensor


def pack(obj: Any) -> Any:
    """``obj`` with every tensor (in nested dicts, lists and tuples) replaced by a :class:`Packed`."""
    return map_leaves(obj, torch.Tensor, _pack_tensor)


def unpack(obj: Any) -> Any:
    """What :func:`pack` packed, with each :class:`Packed` a tensor again (of its own memory)."""
    return map_leaves(obj, Packed, _unpack_tensor)
