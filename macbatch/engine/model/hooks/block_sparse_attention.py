"""Qwen Sparse Attention (QSA) in the packed step: a class swap of mlx-vlm's Qwen4-exp attention
modules, whose indexer picks blocks of keys.

mlx-vlm's ``Qwen4ExpAttention`` first has its indexer append the step's keys to its own cache
(``QSAKVCache.update_indexer``) and pick each query's blocks, then attends through its QSA kernel
or a mask of the picked tokens; neither reaches the paged pool. ``install`` swaps each such
module's class for a subclass whose ``__call__``, when handed an engine cache
(``EngineAttention``), has the cache write the indexer's keys and select each row's positions
(``EngineAttention.select_blocks``, ``model/qsa_indexer.py``), prepares the queries, keys and
values with the module's own code (Qwen3.5's gated queries, QK norms and partial M-RoPE at the
cache's offsets, its K/V written through ``update_and_fetch``), and attends over the pages reading
those positions alone (``LayerParams.selected``); the output gate and projection are its own.
With any other cache (mlx-vlm's own generation in the same process) it runs exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.attention import EngineAttention
from macbatch.engine.model.qsa_indexer import is_block_indexer

_SPARSE_CLASSES: dict[type, type] = {}


def install(layers: Sequence[Any]) -> None:
    """Swap the class of every decoder layer's ``self_attn`` whose indexer picks blocks of keys
    (parameters and their names untouched)."""
    for layer in layers:
        attention = getattr(layer, "self_attn", None)
        if is_block_indexer(getattr(attention, "indexer", None)):
            swap_call(attention, _SPARSE_CLASSES, _sparse_call)


def _sparse_call(self: Any, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
    cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
    if not isinstance(cache, EngineAttention):
        return super(type(self), self).__call__(x, *args, **kwargs)
    return _attend(self, x, cache)


def _attend(attention: Any, x: mx.array, cache: EngineAttention) -> mx.array:
    """One QSA layer over packed rows ``x [N, 1, hidden]`` (one token each, at
    ``cache.offset``)."""
    n, length, _ = x.shape
    selected = cache.select_blocks(attention.indexer, x)
    projected = (attention.q_proj(x), attention.k_proj(x), attention.v_proj(x))
    queries, keys, values, gate, _ = attention._prepare_projected_qkv(
        *projected, cache, None, None, None
    )
    out = cache.attend(queries, keys, values, attention.scale, None, None, selected=selected)
    out = out.transpose(0, 2, 1, 3).reshape(n, length, -1)
    return attention.o_proj(out * mx.sigmoid(gate))
