"""Recurrent layers (Gated DeltaNet, Mamba 2, short convolutions) inside the packed step.

A hybrid model's recurrent layer keeps a fixed-size state per sequence (mlx-lm's ``ArraysCache``:
a convolution window, an SSM or delta-rule matrix) instead of K/V per token. Every running request
owns one *slot* of every recurrent layer's state (``StateStore``), held from its first scheduled
chunk until it finishes or is preempted (a preempted request recomputes from its first token).

The packed step feeds the model one token per batch row; attention layers read their pages per
row, but a recurrent layer must see each request's tokens in order. So each recurrent layer runs
its own mlx-lm code on the step's requests as mlx-lm would batch them: the rows of one-token chunks
(every decode) together as a batch of sequences of length 1, and each longer prefill chunk as one
sequence, each from its slot's state (zeros for a chunk that starts a request). Their new states
go back to the slots in one scatter per state array, and their outputs back to the step's rows.
No other slot is read or written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class StateShape:
    """One recurrent layer's state: the shape (without the batch axis) and dtype of each of the
    arrays mlx-lm keeps in its ``ArraysCache``."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[mx.Dtype, ...]

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(s)) * d.size for s, d in zip(self.shapes, self.dtypes))


class StateStore:
    """Every recurrent layer's state arrays, ``num_slots`` sequences each."""

    def __init__(self, layers: Sequence[StateShape], num_slots: int) -> None:
        self.layers = list(layers)
        self.num_slots = num_slots
        self.states: list[list[mx.array]] = [
            [mx.zeros((num_slots, *shape), dtype) for shape, dtype in zip(s.shapes, s.dtypes)]
            for s in self.layers
        ]

    @property
    def bytes_per_slot(self) -> int:
        return sum(s.nbytes for s in self.layers)

    @property
    def nbytes(self) -> int:
        return self.bytes_per_slot * self.num_slots

    def arrays(self) -> list[mx.array]:
        """What a step writes (evaluated with it, like the K/V pages)."""
        return [a for layer in self.states for a in layer]


@dataclass(frozen=True)
class StateRows:
    """How one step's rows map onto sequences for the recurrent layers (built by the packer)."""

    singles: mx.array | None  # [S] rows of one-token chunks; None: rows 0..S-1
    num_singles: int
    single_slots: mx.array  # [S] their slots
    single_keep: mx.array  # [S] float32: 0 where the chunk starts its request (zero state)
    chunks: tuple[tuple[int, int, int, bool], ...]  # (first row, length, slot, starts request)
    write_slots: mx.array  # [S + len(chunks)] every slot written, in piece order
    restore: mx.array | None  # rows from piece order; None: pieces are already in row order

    @classmethod
    def build(cls, lengths: np.ndarray, starts: np.ndarray, slots: Sequence[int]) -> StateRows:
        """``lengths``, ``starts`` and ``slots`` of the step's chunks, in row order."""
        first_rows = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        single = lengths == 1
        slot_array = np.asarray(slots, dtype=np.int32)
        single_rows = first_rows[single]
        num_singles = int(single.sum())
        in_order = bool(single[:num_singles].all()) if num_singles else True
        chunks = tuple(
            (int(first_rows[i]), int(lengths[i]), int(slot_array[i]), bool(starts[i] == 0))
            for i in np.flatnonzero(~single)
        )
        pieces = [single_rows] + [np.arange(r, r + n) for r, n, _, _ in chunks]
        order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        restore = None if in_order else mx.array(np.argsort(order).astype(np.int32))
        return cls(
            singles=None if in_order else mx.array(single_rows.astype(np.int32)),
            num_singles=num_singles,
            single_slots=mx.array(slot_array[single]),
            single_keep=mx.array((starts[single] > 0).astype(np.float32)),
            chunks=chunks,
            write_slots=mx.array(np.concatenate([slot_array[single], slot_array[~single]])),
            restore=restore,
        )


class PagedStateCache:
    """What a recurrent layer is handed during a packed forward in place of an ``ArraysCache``:
    the store layer whose slots hold its state, and the step's rows."""

    def __init__(self, store: StateStore, layer: int, rows: StateRows) -> None:
        self.store = store
        self.layer = layer
        self.rows = rows

    def make_mask(self, n: int, *args: Any, **kwargs: Any) -> None:
        """No padding anywhere: every sequence a recurrent layer sees is whole."""
        return None

    def run(self, call: LayerCall, x: mx.array, args: tuple, kwargs: dict) -> mx.array:
        """``call`` (the layer's own ``__call__``) over the step's sequences; ``x``: ``[N, 1, H]``
        rows, the result in the same rows."""
        rows = self.rows
        pieces: list[tuple[mx.array, Any]] = []  # (output rows, the cache it left)
        if rows.num_singles:
            pieces.append(self._singles(call, x, args, kwargs))
        for chunk in rows.chunks:
            pieces.append(self._chunk(call, x, chunk, args, kwargs))
        self._write_back([cache for _, cache in pieces])
        outs = [out for out, _ in pieces]
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        return out if rows.restore is None else out[rows.restore]

    def _singles(self, call: LayerCall, x: mx.array, args: tuple, kwargs: dict) -> tuple:
        """Every one-token chunk as a batch of length-1 sequences, each from its slot (zeroed
        where the chunk starts its request)."""
        rows, cache = self.rows, _new_cache(len(self.store.states[self.layer]))
        for e, state in enumerate(self.store.states[self.layer]):
            picked = state[rows.single_slots]
            keep = rows.single_keep.reshape(-1, *([1] * (picked.ndim - 1))).astype(picked.dtype)
            cache[e] = picked * keep
        if rows.singles is not None:
            part = x[rows.singles]
        else:
            part = x if rows.num_singles == x.shape[0] else x[: rows.num_singles]
        return call(part, *args, **dict(kwargs, cache=cache)), cache

    def _chunk(
        self, call: LayerCall, x: mx.array, chunk: tuple[int, int, int, bool], args: tuple,
        kwargs: dict,
    ) -> tuple:  # fmt: skip
        """One prefill chunk as one sequence, from its slot's state (none when it starts)."""
        first, length, slot, starts = chunk
        cache = _new_cache(len(self.store.states[self.layer]))
        if not starts:
            for e, state in enumerate(self.store.states[self.layer]):
                cache[e] = state[slot : slot + 1]
        sequence = x[first : first + length].reshape(1, length, -1)
        out = call(sequence, *args, **dict(kwargs, cache=cache))
        return out.reshape(length, 1, -1), cache

    def _write_back(self, caches: list[Any]) -> None:
        """Each sequence's new state into its slot: one scatter per state array."""
        for e, state in enumerate(self.store.states[self.layer]):
            parts = [cache[e].astype(state.dtype) for cache in caches]
            state[self.rows.write_slots] = parts[0] if len(parts) == 1 else mx.concatenate(parts)


LayerCall = Callable[..., mx.array]


def _new_cache(size: int) -> Any:
    """An empty mlx-lm ``ArraysCache`` of ``size`` arrays, as the layer's own code expects."""
    from mlx_lm.models.cache import ArraysCache

    return ArraysCache(size)


_PACKED_CLASSES: dict[type, type] = {}


def run_packed_layers(layers: Sequence[Any]) -> None:
    """Make each of ``layers`` (a model's decoder layers) run its sequences apart whenever it is
    handed a ``PagedStateCache``, and exactly as before otherwise (its class is swapped for a
    subclass with that one ``__call__``; parameters and their names are untouched)."""
    for layer in layers:
        cls = type(layer)
        if cls in _PACKED_CLASSES.values():
            continue
        if cls not in _PACKED_CLASSES:
            _PACKED_CLASSES[cls] = type(cls.__name__, (cls,), {"__call__": _packed_call})
        layer.__class__ = _PACKED_CLASSES[cls]


def _packed_call(self: Any, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    cache = kwargs.get("cache")
    original = super(type(self), self).__call__
    if isinstance(cache, PagedStateCache):
        return cache.run(original, x, args, kwargs)
    return original(x, *args, **kwargs)
