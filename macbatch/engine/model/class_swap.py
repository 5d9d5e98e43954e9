"""Swapping a loaded module's class for a subclass with one ``__call__`` of the engine's, the way
the hooks patch a layer (parameters and their names untouched); here beside ``reroute.py``, the
hooks' other helper, since every module of ``hooks/`` is a hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def swap_call(module: Any, made: dict[type, type], call_over: Callable[[type], Callable]) -> None:
    """Give ``module`` the subclass of its class whose ``__call__`` is ``call_over(its class)``,
    made once per class into ``made`` (a module swapped already is left as it is)."""
    cls = type(module)
    if cls in made.values():
        return
    if cls not in made:
        made[cls] = type(cls.__name__, (cls,), {"__call__": call_over(cls)})
    module.__class__ = made[cls]
