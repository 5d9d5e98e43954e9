"""Attention layers that rotate by a RoPE table cut at their cache's offset as one number
(mlx-vlm's HunYuan VL: ``cos[-L:]`` of a table ``cache_position_offset(cache) + L`` long, the
largest of a batch's offsets): a class swap, so that handed the engine's cache (whose offset is
every row's own position) each row is rotated at its own position.

The swapped ``__call__`` reads the layer's own table (``rotary_emb``, grown to the config's
``max_position_embeddings`` once) at each row's position and rotates as mlx-vlm's decode path
does (float32, ``rotate_half``); text rows of its XD-RoPE prefill have every axis at the row's
position, the same angles. Handed any other cache it is the library's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.attention import EngineAttention, heads_first

_SWAPPED: dict[type, type] = {}


def install(attentions: Sequence[Any]) -> None:
    """Swap the class of ``attentions`` (each decoder layer's, as the family's record names
    them; empty for another family)."""
    for module in attentions:
        swap_call(module, _SWAPPED, _attention_call)


def _rotated(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """``x`` ``[N, heads, L, D]`` rotated by the rows' angles (``[N, 1, L, D]``) as mlx-vlm
    rotates, in float32."""
    from mlx_vlm.models.rope_utils import rotate_half

    x32 = x.astype(mx.float32)
    return (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)


def _attention_call(
    self: Any, x: mx.array, mask: Any = None, cache: Any = None, position_ids: Any = None
) -> mx.array:
    if not isinstance(cache, EngineAttention):
        return super(type(self), self).__call__(x, mask, cache, position_ids)
    n, length, _ = x.shape
    queries, keys, values = heads_first(self, x)
    table = self.rotary_emb(values, seq_len=self.rotary_emb.max_position_embeddings)
    positions = cache.offset.reshape(n, 1) + mx.arange(length)
    cos, sin = (t[positions][:, None].astype(mx.float32) for t in table)
    queries, keys = _rotated(queries, cos, sin), _rotated(keys, cos, sin)
    if self.config.use_qk_norm:
        queries, keys = self.query_layernorm(queries), self.key_layernorm(keys)
    keys, values = cache.update_and_fetch(keys, values)
    out = cache.attend(queries, keys, values, self.scale, None, None)
    return self.o_proj(out.transpose(0, 2, 1, 3).reshape(n, length, -1))
