"""The state cache a recurrent layer is handed, with mlx-vlm's calls beside mlx-lm's.

mlx-lm's recurrent layers assign their ``ArraysCache``'s arrays; mlx-vlm's Gated DeltaNet
(Qwen3.5's, which Qwen4-exp's is) and Qwen4-exp's per-layer n-gram embedding hand the cache the
whole window input and keep its trailing rows (``update_window``), and hand it the recurrence to
run from its state (``update_recurrent``), so that mlx-vlm's own speculative decoding can record
every token's state. The engine keeps no such history (a rejected draft's state is restored from
the step's checkpoints, ``recurrent.py``), so both calls come down to mlx-lm's assignment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache


class StateCache(ArraysCache):
    """mlx-lm's ``ArraysCache`` that also answers mlx-vlm's recurrent cache calls."""

    def update_window(
        self, index: int, source: mx.array, width: int, *, lengths: mx.array | None = None
    ) -> mx.array:
        """Keep the trailing ``width`` rows of ``source [B, T, ...]`` as array ``index`` (every
        sequence the engine hands a layer is whole: ``lengths``, mlx-vlm's padded batches', is
        never set)."""
        assert lengths is None, "the engine's sequences are never padded"
        state = source[:, source.shape[1] - int(width) :]
        self[index] = state
        return state

    def update_recurrent(
        self, index: int, length: int, update: Callable[[Any, None], tuple]
    ) -> tuple[mx.array, mx.array]:
        """Run ``update`` (the recurrence over ``length`` tokens) from array ``index``, which
        then holds the state it leaves; returns its output and that state."""
        output, state = update(self.cache[index], None)[:2]
        self[index] = state
        return output, state
