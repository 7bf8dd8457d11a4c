"""One walk over the nests that hold a member's state: dicts, lists and plain tuples.

A member's state (weights, an optimizer's ``state_dict``, generator states, archives) is a
nest of those containers around tensors or arrays. Copying it to the CPU, packing it for Ray
and making it loadable with ``weights_only`` all rebuild the nest with each leaf replaced;
:func:`map_leaves` is that rebuild.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

__all__ = ["map_leaves"]

Leaf = TypeVar("Leaf")


def map_leaves(obj: object, leaf: type[Leaf], fn: Callable[[Leaf], object]) -> object:
    """``obj`` rebuilt with ``fn(x)`` in place of every ``x`` of type ``leaf`` inside nested dicts,
    lists and plain tuples. Named tuples and every other object are returned as they are (not
    copied), and so is what they hold."""
    if isinstance(obj, leaf):
        return fn(obj)
    # isinstance cannot bind a container's item types: the casts say what any item is.
    if isinstance(obj, dict):
        return {k: map_leaves(v, leaf, fn) for k, v in cast("dict[object, object]", obj).items()}
    if isinstance(obj, list):
        return [map_leaves(v, leaf, fn) for v in cast("list[object]", obj)]
    if isinstance(obj, tuple):
        items = cast("tuple[object, ...]", obj)
        return items if hasattr(items, "_fields") else tuple(map_leaves(v, leaf, fn) for v in items)
    return obj
