"""The recurrent-state arrays of a hybrid model: one row per slot, every recurrent layer's state.

A row is a request's slot (followed by its snapshot when the engine speculates: ``snapshot_of``)
or a prefix-cache checkpoint, in the order they were taken. Rows are only ever appended, so
growing the store for either kind moves no row a request, a checkpoint or a step in flight holds;
``compact`` (only when nothing holds a request slot) is the one way rows are renumbered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def slot_stride(snapshots: bool) -> int:
    """Rows a request slot takes: itself, then its snapshot when the engine speculates."""
    return 2 if snapshots else 1


class StateStore:
    """Every recurrent layer's state arrays, ``rows`` rows of them (zeros at first)."""

    def __init__(self, layers: Sequence[StateShape], rows: int, snapshots: bool = False) -> None:
        self.layers = list(layers)
        self.stride = slot_stride(snapshots)
        self.states: list[list[mx.array]] = [
            [mx.zeros((rows, *shape), dtype) for shape, dtype in zip(s.shapes, s.dtypes)]
            for s in self.layers
        ]

    @property
    def rows(self) -> int:
        return self.states[0][0].shape[0]

    @property
    def bytes_per_slot(self) -> int:
        return sum(s.nbytes for s in self.layers)

    @property
    def nbytes(self) -> int:
        return self.bytes_per_slot * self.rows

    def snapshot_of(self, slot: int) -> int:
        """The row that keeps request slot ``slot``'s state from before its verified drafts."""
        assert self.stride == 2, "no snapshot slots: the engine does not speculate"
        return slot + 1

    def append(self, count: int) -> list[int]:
        """``count`` new rows of zeros after the others; their numbers. Lazy: a step in flight
        holds the old arrays, and its writes are part of what the new ones copy."""
        first = self.rows
        for layer in self.states:
            for e, array in enumerate(layer):
                pad = mx.zeros((count, *array.shape[1:]), array.dtype)
                layer[e] = mx.concatenate([array, pad])
        return list(range(first, first + count))

    def compact(self, fresh: int, kept: Sequence[int]) -> None:
        """Down to ``fresh`` rows of zeros followed by the rows ``kept`` (in that order)."""
        index = mx.array(np.asarray(kept, np.int32)) if kept else None
        for layer in self.states:
            for e, array in enumerate(layer):
                zeros = mx.zeros((fresh, *array.shape[1:]), array.dtype)
                layer[e] = zeros if index is None else mx.concatenate([zeros, array[index]])

    def arrays(self) -> list[mx.array]:
        """What a step writes (evaluated with it, like the K/V pages)."""
        return [a for layer in self.states for a in layer]
