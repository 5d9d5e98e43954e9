"""Where a model library's own caches are handed a sparse-attention indexer's keys, and those
writes rounded: the load-time self-check rounds them as fp8 pages do (``self_check.py``), the
tests through a numpy oracle of the format, so the library's indexer selects over the keys the
engine's pages hold.

Each library keeps the keys its own way (one page row of the engine's is what one call hands over,
so a row's pieces are rounded side by side, as the engine's page row is):

- mlx-lm's DeepSeek V3.2 and GLM-5 write ``update_and_fetch(k, k)`` to their two-part
  ``CacheList``'s second cache, mlx-vlm's Hunyuan V4 ``update_and_fetch(k, zeros [.., 0])`` on
  its "full" layers (both indexers read the keys alone);
- mlx-vlm's Qwen4-exp hands its raw keys to its ``QSAKVCache``'s ``update_indexer(keys,
  positions)``;
- mlx-vlm's GLM5-next hands each token's key and pooling gate to the ``PoolingCache`` of its
  four-part list, ``accumulate_windows(keys, gates, offset)`` (the engine pages the two side by
  side).

Layers without an indexer of their own (recurrent ones, and those sharing another layer's
selection: Hunyuan V4's and GLM5-next's "shared" layers, whose lists hold the latent and its
projections) have no keys to round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import mlx.core as mx

Rounding = Callable[[mx.array], mx.array]


def round_indexer_keys(layers: Sequence[Any], caches: Sequence[Any], rounding: Rounding) -> None:
    """Every indexer-key write of ``caches`` (one per layer of ``layers``, the model's decoder
    layers) made with its row first passed through ``rounding``, in place."""
    for layer, cache in zip(layers, caches):
        if getattr(getattr(layer, "self_attn", None), "indexer", None) is not None:
            owner, method, count = _key_write(cache)
            _round_args(owner, method, count, rounding)


def _key_write(cache: Any) -> tuple[Any, str, int]:
    """The object a layer's cache takes its indexer's keys through, the method, and how many
    leading arguments make up one page row."""
    if hasattr(cache, "update_indexer"):
        return cache, "update_indexer", 1
    parts: Sequence[Any] = cache.caches
    pooling = [part for part in parts if hasattr(part, "accumulate_windows")]
    if pooling:
        return pooling[0], "accumulate_windows", 2
    return parts[1], "update_and_fetch", 1


def _round_args(owner: Any, method: str, count: int, rounding: Rounding) -> None:
    """``owner.method``'s first ``count`` arguments rounded first, as one row side by side (in
    place of the instance's own call, whatever another wrapper had made of it)."""
    write = getattr(type(owner), method).__get__(owner)

    def rounded(*args: Any) -> Any:
        pieces = list(args[:count])
        row = rounding(mx.concatenate(pieces, axis=-1))
        back = mx.split(row, list(accumulate(p.shape[-1] for p in pieces[:-1])), axis=-1)
        return write(*(b.astype(p.dtype) for b, p in zip(back, pieces)), *args[count:])

    setattr(owner, method, rounded)
