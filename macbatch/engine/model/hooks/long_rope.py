"""LongRoPE (Phi-3.5, Phi-3.5-MoE, Phi-4-mini, Phi-4-multimodal, MiniCPM3: ``rope_scaling.type:
longrope``) chosen per request, as transformers' Phi-3 chooses it for one sequence.

The reference rotates by the short factors while the sequence is within
``original_max_position_embeddings`` and by the long ones past it: a prompt longer than that is
rotated long throughout; a shorter one short, and once its sequence reaches a position past them
transformers' Phi-3 drops its cache and computes the whole sequence again, long
(``Phi3ForCausalLM.prepare_inputs_for_generation``). mlx-lm's ``SuScaledRoPE`` always rotates
long, and mlx-vlm's by the furthest position of its call, which in a packed step is the furthest
of every request in it. The scheduler decides each request's set (``Request.long_rope``: from a
long prompt, or when the sequence crosses, its blocks released and computed anew) and the packed
step carries it per row (``PackedBatch.long_rope_rows``). ``install`` replaces each decoder
layer's ``SuScaledRoPE`` by ``RowLongRoPE``: in the engine's step (``note_step``) each row is
rotated by its request's set; any other call (the self-check's library forward, one sequence) is
rotated long iff its furthest position passes the original ones, the reference's rule for one
sequence whose prompt is one call. Both scale by the library's attention factor (mscale), which
transformers applies to both sets.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

_STEP = threading.local()  # the engine step's (positions, long rows), per thread


def note_step(positions: mx.array, long_rows: mx.array | None) -> None:
    """Notes the step the adapter is about to run: each row's position (the offset its caches
    hand the rope) and whether its request is rotated long (None: the model has no LongRoPE)."""
    _STEP.rows = None if long_rows is None else (positions, long_rows)


def _long_rows(offset: Any) -> mx.array | None:
    """The step's long rows when ``offset`` is the noted step's positions, else None."""
    rows = getattr(_STEP, "rows", None)
    return rows[1] if rows is not None and rows[0] is offset else None


class RowLongRoPE(nn.Module):
    """A LongRoPE whose factor set is chosen per row in the engine's step (module docstring)."""

    def __init__(
        self,
        dims: int,
        original: int,
        freqs: tuple[mx.array, mx.array],
        scales: tuple[float, float],
    ) -> None:
        super().__init__()
        self.dim = dims
        self.original_max_position_embeddings = original
        self._short_freqs, self._long_freqs = freqs
        self._short_scale, self._long_scale = scales

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        rows = _long_rows(offset)
        if rows is None:
            end = mx.max(mx.array(offset, dtype=mx.int32)) + x.shape[-2]
            long = end > self.original_max_position_embeddings
            freqs = mx.where(long, self._long_freqs, self._short_freqs)
            scale = mx.where(long, self._long_scale, self._short_scale).astype(x.dtype)
            return self._rotated(x, offset, freqs, scale)
        short = self._rotated(x, offset, self._short_freqs, self._short_scale)
        return mx.where(
            rows.reshape(-1, 1, 1, 1) > 0,
            self._rotated(x, offset, self._long_freqs, self._long_scale),
            short,
        )

    def _rotated(
        self, x: mx.array, offset: int | mx.array, freqs: mx.array, scale: float | mx.array
    ) -> mx.array:
        return mx.fast.rope(
            x.at[..., : self.dim].multiply(scale),
            self.dim,
            traditional=False,
            base=None,
            scale=1.0,
            offset=offset,
            freqs=freqs,
        )


def _row_rope(args: Any, rope: Any) -> RowLongRoPE | None:
    """``rope`` as a ``RowLongRoPE``, or None when it is no library's ``SuScaledRoPE`` (or one
    whose short factors cannot be read from the model's ``args``)."""
    kind = type(rope)
    if kind.__name__ != "SuScaledRoPE":
        return None
    original = rope.original_max_position_embeddings
    if kind.__module__ == "mlx_vlm.models.rope_utils":  # it keeps both factor sets
        freqs = (rope._short_freqs, rope._long_freqs)
        scales = (float(rope._short_scale), float(rope._long_scale))
        return RowLongRoPE(rope.dim, original, freqs, scales)
    scaling = getattr(args, "rope_scaling", None) or {}  # mlx-lm's keeps the long ones alone
    if kind.__module__ != "mlx_lm.models.rope_utils" or "short_factor" not in scaling:
        return None
    base = args.rope_theta ** (mx.arange(0, rope.dim, 2, dtype=mx.float32) / rope.dim)
    short = mx.array(scaling["short_factor"], dtype=mx.float32) * base
    # its scale is the long set's (PhiMoE's long_mscale); the short set's is its own where the
    # config names one (PhiMoE's short_mscale), else the same attention factor (Phi-3's)
    short_scale = scaling.get("short_mscale") or rope._scale
    return RowLongRoPE(rope.dim, original, (short, rope._freqs), (short_scale, rope._scale))


def install(layers: Sequence[Any], inner: Any) -> None:
    """Replace the ``SuScaledRoPE`` of each decoder layer's attention (none: nothing to do).
    ``inner``: the inner transformer, whose ``args`` hold the factors (PhiMoE's decoder layers
    keep no ``args``)."""
    args = getattr(inner, "args", None)
    for layer in layers:
        attention: Any = getattr(layer, "self_attn", None)
        rope = _row_rope(args, getattr(attention, "rope", None))
        if rope is not None:
            attention.rope = rope


def original_positions(layers: Sequence[Any]) -> int | None:
    """The original positions of the model's ``RowLongRoPE`` (None: it has none), read once at
    load: the scheduler decides each request's set by them, the packer hands it to each row."""
    for layer in layers:
        rope = getattr(getattr(layer, "self_attn", None), "rope", None)
        if isinstance(rope, RowLongRoPE):
            return rope.original_max_position_embeddings
    return None
