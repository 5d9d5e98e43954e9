"""Llama 4's inner model and attention read a cache's offset as one number: class swaps of both,
so that handed the engine's caches (whose offset is every row's own position) they run the
packed step.

mlx-lm's llama4 builds its chunk masks with ``mx.arange`` from ``cache[0].offset`` and trims its
``ChunkedKVCache``s before each forward, and its attention layers without RoPE scale their
queries by ``log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1`` (temperature tuning)
from ``mx.arange(offset + 1, ...)``. Handed engine caches, the swapped inner model runs its layers
with no mask (each chunked layer's cache attends within its chunk itself:
``model/attention_chunks.py``) and the swapped attention scales each row's queries by its own
position, the same ops on the ``(N,)`` offsets; handed any other cache both are mlx-lm's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.attention import EngineAttention, heads_first

_SWAPPED: dict[type, type] = {}


def install(inner: Any, attentions: Sequence[Any]) -> None:
    """Swap the class of the inner transformer ``inner`` and of ``attentions`` (each decoder
    layer's attention, as the family's record names them); nothing when ``attentions`` is
    empty (another family)."""
    if attentions:
        swap_call(inner, _SWAPPED, _inner_call)
    for module in attentions:
        swap_call(module, _SWAPPED, _attention_call)


def _inner_call(self: Any, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
    if cache is None or not isinstance(cache[0], EngineAttention):
        return super(type(self), self).__call__(inputs, cache, **kwargs)
    h = self.embed_tokens(inputs)
    for layer, layer_cache in zip(self.layers, cache):
        h = layer(h, None, cache=layer_cache)
    return self.norm(h)


def _attention_call(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    if not isinstance(cache, EngineAttention) or self.use_rope or not self.attn_temperature_tuning:
        return super(type(self), self).__call__(x, mask, cache)
    n, length, _ = x.shape
    queries, keys, values = heads_first(self, x)
    position = cache.offset.reshape(-1, 1, 1, 1)
    scales = mx.log(mx.floor((position + 1) / self.floor_scale) + 1.0) * self.attn_scale + 1.0
    queries = (queries * scales).astype(queries.dtype)
    keys, values = cache.update_and_fetch(keys, values)
    out = cache.attend(queries, keys, values, self.scale, None, None)
    return self.o_proj(out.transpose(0, 2, 1, 3).reshape(n, length, -1))
