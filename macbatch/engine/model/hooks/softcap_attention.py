"""Attention with a logit softcap computed inline (Gemma 2): a class swap of the attention
modules, so the packed step attends over the pages with the softcap the kernel takes.

mlx-lm's gemma2 attention multiplies the queries by the keys itself and caps the scores with
``tanh(scores / cap) * cap``: it never calls ``scaled_dot_product_attention``, so the attention
hook never sees it. Handed an engine cache, the swapped class does what mlx-lm's does up to the
scores (projections, RoPE at each row's position, the cache's write) and hands the cache its
queries with the cap (``LayerParams.softcap``); handed any other cache it is mlx-lm's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.attention import AttentionWindow, EngineAttention, heads_first

_SOFTCAPPED: dict[type, type] = {}


def install(modules: Sequence[Any]) -> None:
    """Swap the class of each of ``modules`` (attention modules with an inline softcap, as the
    family's record names them) for one that attends through an engine cache."""
    for module in modules:
        swap_call(module, _SOFTCAPPED, _softcapped_call)


def _softcapped_call(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    if not isinstance(cache, EngineAttention):
        return super(type(self), self).__call__(x, mask, cache)
    n, length, _ = x.shape
    queries, keys, values = heads_first(self, x)
    queries = self.rope(queries, offset=cache.offset)
    keys = self.rope(keys, offset=cache.offset)
    keys, values = cache.update_and_fetch(keys, values)
    window = mask.size if isinstance(mask, AttentionWindow) else None
    out = cache.attend(
        queries, keys, values, self.scale, window, None, softcap=self.attn_logit_softcapping
    )
    return self.o_proj(out.transpose(0, 2, 1, 3).reshape(n, length, -1))
