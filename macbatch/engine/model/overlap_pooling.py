"""DeepSeek V4's compressed rows as its reference computes them, whatever the calls' cuts.

At ratio 4 a compressed row pools ``2m`` tokens: its own group on one half of a doubled
projection and the previous group on the other (DeepSeek's published inference code keeps that
previous group's projections in its compressor's ``kv_state`` / ``score_state`` from call to
call). mlx-vlm 0.7.10's ``PoolingCache`` keeps only the open group, so the first group closed by
each call pools zeros for its previous one (``_overlap_compress_kv``): its own generation,
which prefills all but the last prompt token in one call and then runs one token a call, differs
from the reference at every group closed after that first call, and a chunked step would differ
again at every cut (docs/engine.md, "DeepSeek V4").

``ReferencePoolingCache`` is mlx-vlm's cache that also keeps the last closed group's
projections and hands them back before the next call's groups, with the pool base one group
earlier: mlx-vlm's compressor (unmodified) then pools that group again as the one before, with
its real previous group, and the row it makes for it is dropped (it is kept already). The rows
then equal one call over the whole sequence, which is the reference's prefill.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import CacheList, PoolingCache


class ReferencePoolingCache(PoolingCache):
    """mlx-vlm's ``PoolingCache`` of an overlapping compressor that keeps the previous group."""

    def __init__(self, ratio: int) -> None:
        super().__init__(ratio)
        self.last_kv: mx.array | None = None  # the last closed group's projections [B, m, 2D]
        self.last_gate: mx.array | None = None
        self._again = 0  # rows the compressor makes again at the next ``update_and_fetch``

    def accumulate_windows(self, kv: mx.array, gate: mx.array, offset: Any) -> tuple:
        ready_kv, ready_gate, base = super().accumulate_windows(kv, gate, offset)
        self._again = 0
        if ready_kv.shape[1] == 0:
            return ready_kv, ready_gate, base
        if self.last_kv is not None and self.last_gate is not None:
            ready_kv = mx.concatenate([self.last_kv, ready_kv], axis=1)
            ready_gate = mx.concatenate([self.last_gate, ready_gate], axis=1)
            base, self._again = base - self.ratio, 1
        self.last_kv = ready_kv[:, -self.ratio :]
        self.last_gate = ready_gate[:, -self.ratio :]
        return ready_kv, ready_gate, base

    def update_and_fetch(self, px: mx.array) -> mx.array:
        return super().update_and_fetch(px[:, self._again :])


def reference_caches(language_model: Any) -> list[Any]:
    """mlx-vlm's caches of ``language_model`` (``make_cache``), each pooling cache of an
    overlapping compressor (the attention's own, its indexer's) a ``ReferencePoolingCache``."""
    caches = language_model.make_cache()
    for layer, cache in zip(language_model.layers, caches, strict=True):
        if not isinstance(cache, CacheList):
            continue
        attention = layer.attn
        indexer = getattr(attention, "indexer", None)
        compressors = [attention.compressor, *([indexer.compressor] if indexer else [])]
        parts = list(cache.caches)
        for i, compressor in enumerate(compressors, start=1):
            if compressor.overlap:
                parts[i] = ReferencePoolingCache(compressor.compress_ratio)
        cache.caches = tuple(parts)
    return caches
