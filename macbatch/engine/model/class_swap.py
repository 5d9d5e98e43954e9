"""The other way the hooks (``hooks/``) patch mlx-lm: a loaded module's class swapped for a
subclass with one ``__call__`` of the engine's, which runs the library's own for any cache but
the engine's (``reroute.py`` is the first way)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def swap_call(
    module: Any, swapped: dict[type, type], call: Callable[..., Any], name: str = "__call__"
) -> None:
    """Swap ``module``'s class for a subclass whose method ``name`` (``__call__``) is ``call``
    (made once per class, kept in ``swapped``: a hook's own table); a module swapped already is
    left as it is. Parameters and their names are untouched."""
    cls = type(module)
    if cls in swapped.values():
        return
    if cls not in swapped:
        swapped[cls] = type(cls.__name__, (cls,), {name: call})
    module.__class__ = swapped[cls]
