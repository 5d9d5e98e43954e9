"""GLM5-next's sparse attention in the packed step: a class swap of mlx-vlm's
``Glm5NextAttention`` modules (NoPE multi-head latent attention whose pooling indexer picks each
query's positions, or which reads the selection of the layer before it).

mlx-vlm's module keeps its latent, its indexer's validity, pooled keys and projected keys in
caches of its own (a ``CacheList`` with a ``PoolingCache``) and attends over gathered latent
rows; none of it reaches the paged pool. ``install`` swaps each such module's class for a
subclass whose ``__call__``, when handed an engine cache (``EngineAttention``), runs the absorbed
form with the module's own projections: the normed latent is the row written to the latent
pages, each head's query is absorbed into the latent space (``embed_q``), the indexer's keys and
gates are written and each row's positions selected (``EngineAttention.select_pools``,
``model/pool_indexer.py``) or the last layer's selection taken ("shared" layers), one attention
over the latent pages reads those positions alone, and ``unembed_out`` and ``o_proj`` map its
output back. It returns the selection beside the output, as mlx-vlm's decoder loop expects.
With any other cache (mlx-vlm's own generation in the same process) it runs exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from macbatch.engine.model.class_swap import swap_call
from macbatch.engine.model.hooks.attention import EngineAttention

# what marks a module as GLM5-next's sparse attention (its fused query/latent projection, its
# absorbed up-projections and whether it shares the selection of the layer before it)
_MARKS = ("qkv_a_proj", "kv_a_layernorm", "embed_q", "unembed_out", "skip_topk")

_POOLED_CLASSES: dict[type, type] = {}


def is_pooled_attention(module: Any) -> bool:
    """Whether ``module`` is GLM5-next's sparse latent attention (its class swapped or not)."""
    return module is not None and all(hasattr(module, name) for name in _MARKS)


def install(layers: Sequence[Any]) -> None:
    """Swap the class of every decoder layer's ``self_attn`` that is GLM5-next's sparse
    attention (parameters and their names untouched)."""
    for layer in layers:
        attention = getattr(layer, "self_attn", None)
        if is_pooled_attention(attention):
            swap_call(attention, _POOLED_CLASSES, _pooled_call)


def _pooled_call(self: Any, x: mx.array, *args: Any, **kwargs: Any) -> Any:
    cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
    if not isinstance(cache, EngineAttention):
        return super(type(self), self).__call__(x, *args, **kwargs)
    shared = kwargs.get("prev_topk_indices", args[2] if len(args) > 2 else None)
    return _attend(self, x, cache, shared)


def _attend(
    attention: Any, x: mx.array, cache: EngineAttention, shared: mx.array | None
) -> tuple[mx.array, mx.array | None]:
    """One layer over packed rows ``x [N, 1, hidden]``; ``shared``: the selection a layer
    without an indexer reads. Returns the output and the positions the rows read (None: every
    visible one)."""
    n, length, _ = x.shape
    q_a, kv_a = mx.split(attention.qkv_a_proj(x), [attention.q_lora_rank], axis=-1)
    qr = attention.q_a_layernorm(q_a)
    q = attention.q_b_proj(qr).reshape(n, length, attention.num_heads, -1).transpose(0, 2, 1, 3)
    row = attention.kv_a_layernorm(kv_a)[:, None]  # [N, 1, 1, rank]
    indexer = attention.indexer
    selected = shared if indexer is None else cache.select_pools(indexer, x, qr)
    rank = int(attention.kv_lora_rank)
    out = cache.attend_latent(attention.embed_q(q), row, attention.scale, rank, selected)
    out = attention.unembed_out(out).transpose(0, 2, 1, 3).reshape(n, length, -1)
    return attention.o_proj(out), selected
