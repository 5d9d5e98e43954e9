"""Per-request caches of the model library's own kind, held beside a state store's rows.

DeepSeek V4's attention (mlx-lm's ``deepseek_v41``) keeps a cache per layer that neither pages
nor a fixed-size state hold: its sliding window, its compressed rows (one per ``m`` tokens, so
growing with the context) with their indexer keys, and the projections of the group not closed
yet. Until those have cache kinds of their own, each state-store row (a request slot, its
snapshot, a prefix-cache checkpoint) also names the library's cache objects of every layer, as
the library made them (mlx-vlm's ``deepseek_v4`` too: a ``CacheList`` of a rotating window and
pooling caches per layer). A snapshot of a row is a copy of each cache object whose arrays are
new handles of the same data (``snapshot``): mlx-lm's cache replaces its arrays on every call,
mlx-vlm's write some in place (a window's slots, the open group), and either way the copy keeps
what it had, so a checkpoint costs no copy of its arrays until one is written. The rows' own
arrays are one placeholder number per layer (the sizing and slot machinery of the recurrent
state are reused as they are); the engine's stats count the held arrays (``held_bytes``), the
KV pool's sizing does not.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.stores.state_store import StateShape, StateStore

# what a row keeps in the store's own arrays, per layer: nothing is read from it
PLACEHOLDER = StateShape(((1,),), (mx.int32,))


class HeldCaches(StateStore):
    """A state store whose rows each also hold the library's caches of every layer (a list, one
    object per layer; a row no step wrote holds none)."""

    def __init__(
        self,
        layers: Sequence[StateShape],
        rows: int,
        snapshots: bool = False,
        new_caches: Callable[[], list[Any]] | None = None,
    ) -> None:
        """``new_caches``: new caches of the family's kind, every layer's (a checkpoint read
        from disk is rebuilt into them: ``held_bytes.rebuild``)."""
        super().__init__(layers, rows, snapshots)
        self.held: dict[int, list[Any]] = {}
        self.new_caches = new_caches

    def copy_of(self, row: int) -> list[Any]:
        """A snapshot of row ``row``'s caches that a step may extend without changing the row."""
        return [snapshot(cache) for cache in self.held[row]]

    def hold(self, row: int, caches: list[Any]) -> None:
        self.held[row] = caches

    def release(self, row: int) -> None:
        """A request slot given back: its caches go (a checkpoint's stay until compacted)."""
        self.held.pop(row, None)

    def held_bytes(self) -> int:
        """The bytes of the arrays the held caches reference, each once (a checkpoint shares most
        of its arrays with the slot it was copied from)."""
        arrays = {
            id(a): a
            for caches in self.held.values()
            for cache in caches
            if cache is not None
            for part in cache_parts(cache)
            for a in vars(part).values()
            if isinstance(a, mx.array)
        }
        return sum(a.nbytes for a in arrays.values())

    def compact(self, fresh: int, kept: Sequence[int]) -> None:
        """The rows ``kept`` move after ``fresh`` new ones (``StateStore.compact``); the request
        slots' caches go."""
        super().compact(fresh, kept)
        self.held = {fresh + i: self.held[row] for i, row in enumerate(kept) if row in self.held}


def cache_parts(cache: Any) -> list[Any]:
    """The cache objects in one layer's ``cache``: its parts where it is a list of caches (an
    mlx-vlm ``CacheList``, which keeps them in ``caches``), else itself."""
    parts = getattr(cache, "caches", None)
    if isinstance(parts, tuple):
        return [p for part in parts for p in cache_parts(part)]
    return [cache]


def snapshot(cache: Any) -> Any:
    """A copy of one layer's ``cache`` that later calls on either leave the other as it was:
    each cache object copied, each of its arrays a new handle of the same data, a list of caches
    (``caches``) copied part by part."""
    copied = copy.copy(cache)
    parts = getattr(cache, "caches", None)
    if isinstance(parts, tuple):
        copied.caches = tuple(snapshot(part) for part in parts)
        return copied
    for name, value in vars(cache).items():
        if isinstance(value, mx.array):
            setattr(copied, name, copy.copy(value))
    return copied
