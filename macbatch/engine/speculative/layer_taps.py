"""The target's decoder-layer outputs, recorded as its forward runs, for a drafter that reads
the target's features at several of its layers (DFlash, Eagle-3): those layer objects' class
gains a recording ``__call__``, so the target runs as it always does, in one call. A recording
is a side effect that ``mx.compile`` would not replay, so the compiled decode step returns the
recorded outputs as outputs of its graph (``recorded`` while it is traced) and puts each step's
back (``replay``): a drafting engine's plain decode steps run compiled too
(worker/compiled_step.py)."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn


class LayerTaps:
    """Records the outputs of the target's decoder layers ``ids`` in each forward."""

    def __init__(self, layers: Sequence[nn.Module], ids: Sequence[int], reader: str) -> None:
        """``reader``: who reads them, named in the ``ValueError`` of an id the target lacks."""
        bad = [i for i in ids if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"{reader} reads target layers {bad}; the target has {len(layers)}")
        self.ids = list(ids)
        self.layers = sorted(set(self.ids))  # each tapped layer once
        self.outputs: dict[int, mx.array] = {}
        for index in self.layers:
            _record(layers[index], index, self.outputs)

    def features(self) -> mx.array:
        """The last forward's recorded outputs, concatenated in ``ids`` order ``[N, 1, k*H]``."""
        found = [self.outputs[i] for i in self.ids]
        self.outputs.clear()
        return mx.concatenate(found, axis=-1)

    def recorded(self) -> list[mx.array]:
        """The last forward's outputs, one per tapped layer in ``layers`` order, taken out (a
        compiled graph returns them: traced, they are its arrays, not a step's)."""
        return [self.outputs.pop(i) for i in self.layers]

    def replay(self, outputs: Sequence[mx.array]) -> None:
        """Record ``outputs`` (``recorded``'s order) as the last forward's: a compiled step's."""
        self.outputs.update(zip(self.layers, outputs))


def _record(layer: nn.Module, index: int, sink: dict[int, mx.array]) -> None:
    base = type(layer)

    def call(self: nn.Module, *args: object, **kwargs: object) -> mx.array:
        out = base.__call__(self, *args, **kwargs)
        sink[index] = out
        return out

    layer.__class__ = type(f"Recorded{base.__name__}", (base,), {"__call__": call})
