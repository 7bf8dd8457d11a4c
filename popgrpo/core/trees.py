"""One walk over the nests that hold a member's state: dicts, lists and plain tuples.

A member's state (weights, an optimizer's ``state_dict``, generator states, archives) is a
nest of those containers around tensors or arrays. Copying it to the CPU, packing it for Ray
and making it loadable with ``weights_only`` all rebuild the nest with each leaf replaced;
:func:`map_leaves` is that rebuild.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeGuard, TypeVar, cast

__all__ = ["map_leaves"]

Leaf = TypeVar("Leaf")


def map_leaves(
    obj: object, leaf: type[Leaf] | Callable[[object], TypeGuard[Leaf]], fn: Callable[[Leaf], object]
) -> object:
    """``obj`` rebuilt with ``fn(x)`` in place of every leaf ``x`` inside nested dicts, lists and
    plain tuples: an ``x`` of type ``leaf``, or, when ``leaf`` is a test, one it accepts (a dict
    can be a leaf: it is tested before it is walked). Named tuples and every other object are
    returned as they are (not copied), and so is what they hold."""
    is_leaf: Callable[[object], bool] = (lambda x: isinstance(x, leaf)) if isinstance(leaf, type) else leaf

    def walk(x: object) -> object:
        if is_leaf(x):
            return fn(cast("Leaf", x))
        # isinstance cannot bind a container's item types: the casts say what any item is.
        if isinstance(x, dict):
            return {k: walk(v) for k, v in cast("dict[object, object]", x).items()}
        if isinstance(x, list):
            return [walk(v) for v in cast("list[object]", x)]
        if isinstance(x, tuple):
            items = cast("tuple[object, ...]", x)
            return items if hasattr(items, "_fields") else tuple(walk(v) for v in items)
        return x

    return walk(obj)
