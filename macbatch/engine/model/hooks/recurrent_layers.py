"""Recurrent layers that run the step's sequences apart: a class swap of a hybrid model's layers.

mlx-lm's recurrent layers (Gated DeltaNet, Mamba 2, short convolutions) read their cache as one
batch of equal-length sequences; the packed step hands them one token per row of many requests.
``install`` swaps each such layer's class for a subclass whose ``__call__`` hands the layer's own
``__call__`` to the cache when that cache is the engine's (a ``SequenceRunner``: the step's
``PagedStateCache``, model/recurrent.py), which runs it per sequence; with any other cache (mlx-lm's
own generation in the same process) the layer runs exactly as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx


class SequenceRunner:
    """A cache that runs its layer over the step's sequences apart (a base class the swapped
    layers know)."""

    def run(
        self, call: Callable[..., mx.array], x: mx.array, args: tuple, kwargs: dict
    ) -> mx.array:
        raise NotImplementedError


_PACKED_CLASSES: dict[type, type] = {}


def install(layers: Sequence[Any]) -> None:
    """Make each of ``layers`` run its sequences apart whenever it is handed a
    ``SequenceRunner``, and exactly as before otherwise (its class is swapped for a subclass with
    that one ``__call__``; parameters and their names are untouched)."""
    for layer in layers:
        cls = type(layer)
        if cls in _PACKED_CLASSES.values():
            continue
        if cls not in _PACKED_CLASSES:
            _PACKED_CLASSES[cls] = type(cls.__name__, (cls,), {"__call__": _packed_call(cls)})
        layer.__class__ = _PACKED_CLASSES[cls]


def _packed_call(base: type) -> Callable[..., mx.array]:
    """The swapped class's ``__call__`` over ``base``'s (named, not ``super(type(self))``: a
    further subclass, such as a DFlash drafter's recording of a layer, must not recurse)."""

    def call(self: Any, *args: Any, **kwargs: Any) -> mx.array:
        return _run_packed(base.__call__.__get__(self), *args, **kwargs)

    return call


def _run_packed(original: Callable[..., mx.array], *args: Any, **kwargs: Any) -> mx.array:
    cache = kwargs.get("cache")
    if isinstance(cache, SequenceRunner):
        if not args:  # the input handed by name (Falcon-H1's mixer: ``input_states=``)
            args = (kwargs.pop(next(iter(_signature(original).parameters))),)
        return cache.run(original, args[0], args[1:], kwargs)
    if any(isinstance(a, SequenceRunner) for a in args):
        # the cache handed by position (Bailing's and RWKV-7's decoder layers): every argument
        # by the name the layer gives it, so the runner can hand each call its own cache
        named = dict(_signature(original).bind(*args, **kwargs).arguments)
        x = named.pop(next(iter(named)))
        runner = named.pop("cache")
        return runner.run(original, x, (), named)
    return original(*args, **kwargs)


def _signature(call: Callable[..., Any]) -> inspect.Signature:
    """The parameters of a layer class's own ``__call__`` (read once per class)."""
    function = getattr(call, "__func__", call)
    if function not in _SIGNATURES:
        _SIGNATURES[function] = inspect.signature(call)
    return _SIGNATURES[function]


_SIGNATURES: dict[Any, inspect.Signature] = {}
