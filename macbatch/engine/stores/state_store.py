"""The recurrent-state arrays of a hybrid model: one row per slot, every recurrent layer's state.

A row is a request's slot (followed by its snapshot when the engine speculates: ``snapshot_of``)
or a prefix-cache checkpoint, in the order they were taken. Rows are only ever appended, so
growing the store for either kind moves no row a request, a checkpoint or a step in flight holds;
``compact`` (only when nothing holds a request slot) is the one way rows are renumbered.

A step does not write its new states into the allocated rows: it reads its sequences' states as
slices, and MLX's CPU backend keeps every buffer a step has read referenced until the stream
thread has run past it, so a slice update of the same array in that step cannot write in place
and copies the whole array first (on the Qwen3.5-shaped benchmark model 48 MiB a layer, in a
fresh mapping: 110 of a 4-layer 32-row decode step's 250 ms). Instead a row *points* at the row
of the step's own output that holds its latest state (``write``), and a step reads a stretch of
rows (``read``) as a slice of that output when they are consecutive rows of one output (a decode
batch whose requests stay the same: every step after the first), as a concatenation of the
pieces otherwise, and from the allocated rows where no step wrote. While requests run their
states are held twice at most (the allocated rows are stale); ``states`` is current only after
``settle``, which ``append`` and ``compact`` call first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

# A row's latest state: an output's arrays (one per state array of the layer) and its row in them.
Where = tuple[tuple[mx.array, ...], int]


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
        self._where: list[dict[int, Where]] = [{} for _ in self.layers]

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

    def read(self, layer: int, row: int, n: int) -> list[mx.array]:
        """Rows ``row`` to ``row + n - 1`` of ``layer`` (one array per state array); row -1
        reads ``n`` rows of zeros."""
        if row < 0:
            return [mx.zeros((n, *a.shape[1:]), a.dtype) for a in self.states[layer]]
        where = self._where[layer]
        runs: list[list] = []  # [arrays or None (allocated rows), first row, rows]
        for r in range(row, row + n):
            arrays, at = where.get(r, (None, r))
            last = runs[-1] if runs else None
            if last is not None and last[0] is arrays and last[1] + last[2] == at:
                last[2] += 1
            else:
                runs.append([arrays, at, 1])
        out = []
        for e, allocated in enumerate(self.states[layer]):
            parts = [_rows(allocated if a is None else a[e], at, k) for a, at, k in runs]
            out.append(parts[0] if len(parts) == 1 else mx.concatenate(parts))
        return out

    def write(self, layer: int, row: int, arrays: Sequence[mx.array], first: int, n: int) -> None:
        """Rows ``row`` to ``row + n - 1`` of ``layer`` now hold rows ``first`` to
        ``first + n - 1`` of ``arrays`` (a step's output: one array per state array)."""
        dtypes = [a.dtype for a in self.states[layer]]
        kept = tuple(a.astype(d) for a, d in zip(arrays, dtypes))
        where = self._where[layer]
        for i in range(n):
            where[row + i] = (kept, first + i)

    def settle(self) -> None:
        """Copy every pointed-at state into its allocated row (one concatenation per array)."""
        for layer, where in enumerate(self._where):
            if where:
                self.states[layer] = self.read(layer, 0, self.rows)
                where.clear()

    def append(self, count: int) -> list[int]:
        """``count`` new rows of zeros after the others; their numbers. Lazy: a step in flight
        holds the old arrays, and its writes are part of what the new ones copy."""
        self.settle()
        first = self.rows
        for layer in self.states:
            for e, array in enumerate(layer):
                pad = mx.zeros((count, *array.shape[1:]), array.dtype)
                layer[e] = mx.concatenate([array, pad])
        return list(range(first, first + count))

    def compact(self, fresh: int, kept: Sequence[int]) -> None:
        """Down to ``fresh`` rows of zeros followed by the rows ``kept`` (in that order)."""
        self.settle()
        index = mx.array(np.asarray(kept, np.int32)) if kept else None
        for layer in self.states:
            for e, array in enumerate(layer):
                zeros = mx.zeros((fresh, *array.shape[1:]), array.dtype)
                layer[e] = zeros if index is None else mx.concatenate([zeros, array[index]])

    def slab_bytes(self) -> list[int]:
        """Bytes of one row in each state array, layer by layer (a checkpoint on disk is these
        slabs, one after another: ``gather_rows``)."""
        return [
            int(np.prod(shape)) * dtype.size
            for layer in self.layers
            for shape, dtype in zip(layer.shapes, layer.dtypes)
        ]

    def gather_rows(self, rows: Sequence[int]) -> list[mx.array]:
        """Each state array's ``rows`` as bytes, ``[len(rows), slab]`` uint8 (lazy: evaluated
        with the next step, like the pages' ``gather_blocks``)."""
        out = []
        for layer in range(len(self.layers)):
            per_row = [self.read(layer, row, 1) for row in rows]
            for e in range(len(self.states[layer])):
                parts = [arrays[e].view(mx.uint8).reshape(1, -1) for arrays in per_row]
                out.append(parts[0] if len(parts) == 1 else mx.concatenate(parts))
        return out

    def scatter_row(self, row: int, slabs: Sequence[np.ndarray]) -> None:
        """Row ``row`` of every state array from bytes (``slabs[i]``: array i's row, as
        ``gather_rows`` made it)."""
        data = iter(slabs)
        for layer, shape in enumerate(self.layers):
            arrays = [
                mx.array(next(data)).view(dtype).reshape(1, *dims)
                for dims, dtype in zip(shape.shapes, shape.dtypes)
            ]
            self.write(layer, row, arrays, 0, 1)

    def arrays(self) -> list[mx.array]:
        """What a step writes (evaluated with it, like the K/V pages): the allocated arrays,
        then the outputs rows point at."""
        held = {id(a): a for where in self._where for arrays, _ in where.values() for a in arrays}
        return [a for layer in self.states for a in layer] + list(held.values())


def _rows(array: mx.array, first: int, n: int) -> mx.array:
    return array if first == 0 and n == array.shape[0] else array[first : first + n]
