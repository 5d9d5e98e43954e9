"""DeepSeek V4's uncompressed attention (mlx-vlm's ``LocalAttention``, its MTP layer's) over the
engine's pages: a swap of its ``_attend``, the part after its queries and key are rotated.

mlx-vlm's ``_attend`` writes the one shared key, which is also its value, to its cache with an
empty value, and attends through ``scaled_dot_product_attention`` with its window's array mask
(an ``AttentionWindow`` has no shape to align). Handed an engine cache (``EngineAttention``),
the swapped one writes that row as the key and the value of the layer's one K/V head and attends
over the pages with the layer's window (``sliding_window``) and sinks, as mlx-vlm's rotating
window and mask do. The target's own layers are handed held library caches
(model/held_attention.py), with which it is mlx-vlm's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.attention import EngineAttention

_SWAPPED: dict[type, type] = {}


def install(layers: Sequence[Any]) -> None:
    """Swap every mlx-vlm DeepSeek V4 uncompressed attention among ``layers``' ``attn``."""
    for layer in layers:
        attention = getattr(layer, "attn", None)
        if attention is not None and _is_local_v4(attention):
            swap_call(attention, _SWAPPED, _attend, name="_attend")


def _is_local_v4(module: Any) -> bool:
    cls = type(module)
    return (
        cls.__module__.startswith("mlx_vlm.models.deepseek_v4")
        and getattr(module, "compress_ratio", None) == 0
        and hasattr(module, "attn_sink")
    )


def _attend(
    self: Any,
    x: mx.array,
    q: mx.array,
    kv: mx.array,
    q_residual: mx.array,
    mask: Any,
    cache: Any,
    offset: Any,
) -> mx.array:
    if not isinstance(cache, EngineAttention):  # mlx-vlm's, past this swap (and any after it)
        library: Any = next(c for c in type(self).__mro__ if c in _SWAPPED)
        out: mx.array = library._attend(self, x, q, kv, q_residual, mask, cache, offset)
        return out
    keys, values = cache.update_and_fetch(kv, kv)
    sinks = self.attn_sink.astype(q.dtype)
    return cache.attend(q, keys, values, self.scale, self.config.sliding_window, sinks)
