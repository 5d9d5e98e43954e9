"""What a one-token forward shows of a model's attention: the cache objects it is handed, what
each layer writes, what each attention reads, and the layout the pages must then have.

The adapter hands the model one ``ProbeCache`` per attention cache mlx-lm would keep
(``make_cache``'s entries) and runs its forward on one token without evaluating it. A layer's
writes give the page shapes; each attention call gives the K/V it reads, found by identity: a
layer handed another layer's K/V array (Gemma 4's KV-shared layers, IQuest-Loop-Coder's second
loop attending over the first loop's keys) reads that layer's pages, and a cache several layers
share (Gemma 3n) is one store layer. ``update_and_fetch`` returns head-numbered stand-ins for the
K/V, so a model that widens its K/V heads itself before attending (PLaMo tiles them) shows
which K/V head each query head reads, the one part of the probe that is evaluated (it reads no
weights). Anything else unexpected becomes an ``UnsupportedModelError`` naming the layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import base as mlx_base

from macbatch.engine.model.hooks import direct_attention
from macbatch.engine.model.hooks.attention import EngineAttention, unpaged_calls
from macbatch.engine.model.pool_indexer import page_width
from macbatch.engine.stores.pages import LayerShape


class UnsupportedModelError(ValueError):
    """The model's architecture cannot be served through the paged engine."""


class ProbeCache(EngineAttention):
    """Records what one attention cache sees during the probe's one-token forward."""

    def __init__(self, peers: list[ProbeCache]) -> None:
        self.offset = mx.array([0], dtype=mx.int32)
        self.peers = peers  # every probe cache of the forward, this one too
        peers.append(self)
        self.shape: LayerShape | None = None
        self.dtype: mx.Dtype | None = None
        self.keys: mx.array | None = None  # the very object handed in: shared K/V is the same one
        self.fetched: tuple[mx.array, mx.array] | None = None  # what it handed back
        self.reads: list[tuple[ProbeCache, int | None]] = []  # per attention: whose K/V, window
        self.head_maps: list[tuple[int, ...] | None] = []  # per attention: K/V head per query head
        self.indexer: Any = None  # a sparse MLA layer's lightning indexer

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.shape = LayerShape(num_kv_heads=keys.shape[1], head_dim=keys.shape[-1])
        self.keys = keys
        self.dtype = keys.dtype
        self.fetched = (_numbered(keys), _numbered(values))
        direct_attention.fetched(self)
        return self.fetched

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """What a layer reusing this cache's K/V reads (Gemma 3n's KV-shared layers)."""
        if self.fetched is None:
            raise UnsupportedModelError("a layer read a cache's K/V before any layer wrote them")
        return self.fetched

    def attend(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        scale: float,
        window: int | None,
        sinks: Any,
        softcap: float | None = None,
        selected: mx.array | None = None,
    ) -> mx.array:
        """Records whose K/V the call reads, its window and its heads' K/V heads."""
        owner = owner_of(self.peers, keys, self)
        self.reads.append((owner, window))
        self.head_maps.append(_head_map(owner, keys, values))
        return mlx_base.scaled_dot_product_attention(
            queries, keys, values, None, scale, None, sinks
        )

    def attend_latent(
        self,
        queries: mx.array,
        row: mx.array,
        scale: float,
        value_dim: int,
        selected: mx.array | None = None,
        sinks: mx.array | None = None,
    ) -> mx.array:
        """Records a latent layer's one-row pages; a lone token attends to itself alone, so
        every head's output is its row's values."""
        self.update_and_fetch(row, row)
        self.shape = LayerShape(1, row.shape[-1], value_dim=value_dim)
        self.reads.append((self, None))
        self.head_maps.append(None)
        n, heads = queries.shape[:2]
        return mx.broadcast_to(row[..., :value_dim], (n, heads, 1, value_dim))

    def select(self, indexer: Any, x: mx.array, qr: mx.array) -> mx.array | None:
        """Records the layer's indexer (its keys get pages of their own); a lone token's one
        position needs no selection."""
        self.indexer = indexer
        return None

    def select_blocks(self, indexer: Any, x: mx.array) -> mx.array | None:
        """Records a block-sparse layer's indexer, as ``select`` does."""
        self.indexer = indexer
        return None

    def select_pools(self, indexer: Any, x: mx.array, qr: mx.array) -> mx.array | None:
        """Records a pooling indexer, as ``select`` does."""
        self.indexer = indexer
        return None


def owner_of(peers: list[Any], keys: mx.array | None, default: Any) -> Any:
    """The cache among ``peers`` whose K/V ``keys`` is (handed in or back), else ``default``."""
    for peer in peers:
        fetched = peer.fetched
        if keys is peer.keys or fetched is not None and keys is fetched[0]:
            return peer
    return default


@dataclass(frozen=True)
class Layout:
    """The pages an attention model needs, as the probe found them."""

    shapes: list[LayerShape]  # one per store layer (a layer computing its own K/V)
    kv_layers: list[int]  # per attention cache: the store layer it writes (or shares)
    dtype: mx.Dtype
    windows: list[int | None]  # per store layer: its window (None: some read sees it all)
    # per attention cache: the order of its query heads that groups them by K/V head as the
    # kernels do (None: they are grouped so already)
    head_orders: list[tuple[int, ...] | None]
    # per attention cache: the store layer of its lightning indexer's keys (None: it attends
    # densely; DeepSeek V3.2, GLM-5), and one of the indexers (their top-k and heads)
    index_layers: list[int | None] = field(default_factory=list)
    indexer: Any = None


@contextmanager
def refused_if_unreadable(model_type: str) -> Iterator[None]:
    """Any error while reading the model's structure (its caches, its layers, the probe) as a
    refusal with its reason: a model the engine cannot read is refused, never a crash."""
    try:
        yield
    except UnsupportedModelError as exc:
        prefix = f"model type '{model_type}'"
        if str(exc).startswith(prefix):
            raise
        raise UnsupportedModelError(f"{prefix}: {exc}") from exc
    except Exception as exc:  # whatever the model's code assumed of its cache
        raise UnsupportedModelError(
            f"model type '{model_type}': its forward failed on the engine's paged cache "
            f"({type(exc).__name__}: {exc}); macbatch runs layers that use their cache as "
            "mlx-lm's KVCache and ArraysCache do"
        ) from exc


@contextmanager
def probing(model_type: str) -> Iterator[list[ProbeCache]]:
    """The probe caches' list, while the forward runs (in ``refused_if_unreadable``): attention
    that bypasses the caches (handed a cache of None: AFM 7's KV-reuse layers) is refused."""
    peers: list[ProbeCache] = []
    with unpaged_calls() as bypasses:
        yield peers
    if bypasses:
        raise UnsupportedModelError(
            f"model type '{model_type}' has {len(bypasses)} attention call(s) handed no cache "
            f"of the engine's (a cache of {bypasses[0]}: layers attending over K/V kept "
            "outside their cache); macbatch cannot page them"
        )


def layout_of(attention: list[ProbeCache], model_type: str) -> Layout:
    """The pages of the probed ``attention`` caches (in the model's cache order)."""
    for i, cache in enumerate(attention):
        if cache.shape is None or not cache.reads:
            raise UnsupportedModelError(
                f"model type '{model_type}': attention cache {i} is never "
                f"{'written' if cache.shape is None else 'attended'} through mlx-lm's "
                "scaled_dot_product_attention; macbatch cannot page its KV cache"
            )
    shapes: list[LayerShape] = []
    kv_layers: list[int] = []
    owners: list[ProbeCache] = []  # the cache writing each store layer
    for cache in attention:
        assert cache.shape is not None
        shared = next((i for i, o in enumerate(owners) if owner_of([o], cache.keys, None)), None)
        if shared is None:
            shared = len(shapes)
            shapes.append(cache.shape)
            owners.append(cache)
        kv_layers.append(shared)
    store_of = {id(cache): kv_layers[i] for i, cache in enumerate(attention)}
    seen: list[list[int | None]] = [[] for _ in shapes]
    for cache in attention:
        for owner, window in cache.reads:
            seen[store_of[id(owner)]].append(window)
    windows = [None if None in w or not w else max(w) for w in seen]  # type: ignore[type-var]
    orders = [_head_order(cache, i, model_type) for i, cache in enumerate(attention)]
    # after the attention layers' pages, a store layer of key rows (value_dim 0) for each
    # layer with a lightning indexer, in the same blocks (kv/indexer_keys.py)
    index_layers: list[int | None] = []
    for cache in attention:
        index_layers.append(None if cache.indexer is None else len(shapes))
        if cache.indexer is not None:
            shapes.append(LayerShape(1, page_width(cache.indexer), value_dim=0))
            windows.append(None)
    indexer = next((c.indexer for c in attention if c.indexer is not None), None)
    assert attention[0].dtype is not None
    dtype = attention[0].dtype
    return Layout(shapes, kv_layers, dtype, windows, orders, index_layers, indexer)


def _numbered(x: mx.array) -> mx.array:
    """A stand-in of ``x`` ``[B, heads, L, D]`` whose every entry is its head's number."""
    heads = mx.arange(x.shape[1], dtype=mx.float32).astype(x.dtype)
    return mx.broadcast_to(heads.reshape(1, -1, 1, 1), x.shape)


def _head_map(owner: ProbeCache, keys: mx.array, values: mx.array) -> tuple[int, ...] | None:
    """Which of ``owner``'s K/V heads each of the ``keys`` an attention reads is, where the
    model widened them past the heads it wrote (None where it did not)."""
    if owner.shape is None or keys.shape[1] == owner.shape.num_kv_heads:
        return None
    key_heads, value_heads = (np.array(a[0, :, 0, 0].astype(mx.float32)) for a in (keys, values))
    if not (key_heads == value_heads).all():
        raise UnsupportedModelError("a layer's attention reads its keys and values by other heads")
    return tuple(int(h) for h in key_heads)


def _head_order(cache: ProbeCache, index: int, model_type: str) -> tuple[int, ...] | None:
    """The query-head order that puts each K/V head's query heads together, in K/V head order
    (None: the kernels' grouping, query head h reads K/V head h // group, already holds)."""
    maps = set(cache.head_maps)
    if maps == {None}:
        return None
    heads = next(h for h in maps if h is not None)
    counts = np.bincount(heads)
    if len(maps) > 1 or len(set(counts.tolist())) != 1:
        raise UnsupportedModelError(
            f"model type '{model_type}': attention cache {index}'s query heads read its K/V "
            "heads unevenly; macbatch's kernels read one K/V head per equal group of query heads"
        )
    order = tuple(int(h) for h in np.argsort(np.array(heads), kind="stable"))
    return None if order == tuple(range(len(heads))) else order
