"""Every recurrent layer's state slots (``StateStore``): where each slot's latest state is.

The store allocates one array per state array of each recurrent layer, a row per slot (the
checkpoints, then the request slots). A step does not write its new states into those rows:
it reads its sequences' states as slices, and MLX's CPU backend keeps every buffer a step has
read referenced until the stream thread has run past it, so a slice update of the same array in
that step cannot write in place and copies the whole array first (on the Qwen3.5-shaped
benchmark model 48 MiB a layer, in a fresh mapping: 110 of a 4-layer 32-row decode step's 250
ms). Instead a slot *points* at the row of the step's own output that holds its latest state
(``write``), and a step reads a stretch of slots (``read``) as a slice of that output when they
are consecutive rows of one output (a decode batch whose requests stay the same: every step
after the first), as a concatenation of the pieces otherwise, and from the allocated rows where
no step wrote. While requests run their states are held twice at most (the allocated rows are
stale); ``resize`` first copies the pointed-at rows in (``settle``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

# A slot's latest state: an output's arrays (one per state array of the layer) and its row in
# them.
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


class StateStore:
    """Every recurrent layer's state arrays: first ``num_checkpoints`` slots for the prefix
    cache's checkpoints, then ``num_slots`` request slots (``slot(k)``), each followed, with
    ``snapshots``, by its snapshot for speculative decoding (``snapshot_of``). Request slots come
    last so that ``resize`` grows or cuts them without moving any other slot."""

    def __init__(
        self,
        layers: Sequence[StateShape],
        num_slots: int,
        num_checkpoints: int,
        snapshots: bool = False,
    ) -> None:
        self.layers = list(layers)
        self.num_slots = num_slots
        self.num_checkpoints = num_checkpoints
        self.stride = 2 if snapshots else 1  # a request slot, then its snapshot
        total = self._rows(num_slots)
        self.states: list[list[mx.array]] = [
            [mx.zeros((total, *shape), dtype) for shape, dtype in zip(s.shapes, s.dtypes)]
            for s in self.layers
        ]
        self._where: list[dict[int, Where]] = [{} for _ in self.layers]

    def _rows(self, num_slots: int) -> int:
        return self.num_checkpoints + num_slots * self.stride

    @property
    def num_snapshots(self) -> int:
        return self.num_slots if self.stride == 2 else 0

    @property
    def bytes_per_slot(self) -> int:
        return sum(s.nbytes for s in self.layers)

    @property
    def nbytes(self) -> int:
        return self.bytes_per_slot * self._rows(self.num_slots)

    def slot(self, k: int) -> int:
        """The row of the ``k``-th request slot."""
        return self.num_checkpoints + k * self.stride

    def snapshot_of(self, slot: int) -> int:
        """The slot that keeps request slot ``slot``'s state from before its verified drafts."""
        assert self.stride == 2, "no snapshot slots: the engine does not speculate"
        return slot + 1

    def read(self, layer: int, slot: int, n: int) -> list[mx.array]:
        """Slots ``slot`` to ``slot + n - 1`` of ``layer`` (one array per state array); slot -1
        reads ``n`` rows of zeros."""
        if slot < 0:
            return [mx.zeros((n, *a.shape[1:]), a.dtype) for a in self.states[layer]]
        where = self._where[layer]
        runs: list[list] = []  # [arrays or None (allocated rows), first row, rows]
        for s in range(slot, slot + n):
            arrays, row = where.get(s, (None, s))
            last = runs[-1] if runs else None
            if last is not None and last[0] is arrays and last[1] + last[2] == row:
                last[2] += 1
            else:
                runs.append([arrays, row, 1])
        out = []
        for e, allocated in enumerate(self.states[layer]):
            parts = [_rows(allocated if a is None else a[e], row, k) for a, row, k in runs]
            out.append(parts[0] if len(parts) == 1 else mx.concatenate(parts))
        return out

    def write(self, layer: int, slot: int, arrays: Sequence[mx.array], first: int, n: int) -> None:
        """Slots ``slot`` to ``slot + n - 1`` of ``layer`` now hold rows ``first`` to
        ``first + n - 1`` of ``arrays`` (a step's output: one array per state array)."""
        dtypes = [a.dtype for a in self.states[layer]]
        kept = tuple(a.astype(d) for a, d in zip(arrays, dtypes))
        where = self._where[layer]
        for i in range(n):
            where[slot + i] = (kept, first + i)

    def settle(self) -> None:
        """Copy every pointed-at state into its allocated row (one concatenation per array)."""
        for layer, where in enumerate(self._where):
            if where:
                self.states[layer] = self.read(layer, 0, self.states[layer][0].shape[0])
                where.clear()

    def resize(self, num_slots: int) -> None:
        """Grow (zeros after the old rows) or cut the request slots; checkpoints stay. Lazy: a
        step in flight holds the old arrays, and its writes are part of what the new ones copy."""
        self.settle()
        rows = self._rows(num_slots)
        for layer in self.states:
            for e, array in enumerate(layer):
                if rows > array.shape[0]:
                    pad = mx.zeros((rows - array.shape[0], *array.shape[1:]), array.dtype)
                    layer[e] = mx.concatenate([array, pad])
                else:
                    layer[e] = array[:rows]
        self.num_slots = num_slots

    def arrays(self) -> list[mx.array]:
        """What a step writes (evaluated with it, like the K/V pages): the allocated arrays,
        then the outputs slots point at."""
        held = {id(a): a for where in self._where for arrays, _ in where.values() for a in arrays}
        return [a for layer in self.states for a in layer] + list(held.values())


def _rows(array: mx.array, first: int, n: int) -> mx.array:
    return array if first == 0 and n == array.shape[0] else array[first : first + n]
