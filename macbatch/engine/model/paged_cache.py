"""The cache object each attention layer is handed in a packed step: it writes the layer's K/V
into its cache group's pages and attends over the pages of the layer whose K/V it is handed,
through ``macbatch.metal.paged_attention`` (the attention hook hands it the queries:
``hooks/attention.py``). Which pages and head order each layer reads was learnt at load
(``kv_probe.py``); the adapter builds one per layer per step (``ModelAdapter.hidden_states``)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

import macbatch.metal
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.hooks import direct_attention
from macbatch.engine.model.hooks.attention import EngineAttention
from macbatch.engine.model.image_blocks import attend_blocks
from macbatch.engine.model.kv_probe import owner_of
from macbatch.engine.model.pool_indexer import pool_indexer_rows, select_pools
from macbatch.engine.model.qsa_indexer import block_indexer_rows, select_blocks
from macbatch.engine.model.sparse_indexer import SelectionPlan, indexer_rows, select
from macbatch.engine.stores.pages import KVStore, KVStores


class PagedLayerCache(EngineAttention):
    """The per-layer cache object a model sees during a packed forward: its cache group's pages,
    write rows and block tables (a sliding-window layer's group holds only the window); a sparse
    MLA layer's also its indexer keys' store layer and the step's ``SelectionPlan``."""

    def __init__(
        self,
        stores: KVStores,
        layer: int,
        batch: PackedBatch,
        writes: bool,
        peers: list[PagedLayerCache] | None = None,
        head_order: tuple[int, ...] | None = None,
        index_layer: int | None = None,
        plan: SelectionPlan | None = None,
        chunk: int | None = None,
    ) -> None:
        windowed, self.layer = stores.slots[layer]  # the group's layer whose pages it reads
        store = stores.window if windowed else stores.full
        assert store is not None
        self.store: KVStore = store
        self.rows = batch.window_write_rows if windowed else batch.kv_write_rows
        self.batch = batch
        self.windowed = windowed
        self.writes = writes  # False for a layer that reuses an earlier layer's K/V
        self.offset = batch.positions if batch.rope_positions is None else batch.rope_positions
        # the step's caches, this one too: an attention handed another layer's K/V reads its pages
        self.peers = [] if peers is None else peers
        self.peers.append(self)
        self.keys: mx.array | None = None
        self.fetched: tuple[mx.array, mx.array] | None = None
        # the query heads grouped by the K/V head they read, where the model widened its K/V
        # heads itself in another order (PLaMo tiles them), with its inverse
        self.head_order = None if head_order is None else mx.array(head_order)
        self.head_restore = None if head_order is None else mx.array(np.argsort(head_order))
        self.index_layer = index_layer
        self.plan = plan
        self.chunk = chunk  # a chunked layer attends within its chunk of positions (Llama 4)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.writes:
            assert self.rows is not None
            rows = self.rows[self.store.shapes[self.layer].num_kv_heads]
            self.store.write(self.layer, rows, keys, values)
        self.keys, self.fetched = keys, (keys, values)
        direct_attention.fetched(self)
        return keys, values

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """This step's K/V, for a layer that reuses them (Gemma 3n's KV-shared layers): it
        attends through this cache, over its pages."""
        assert self.fetched is not None
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
        """The layer's paged attention over the pages of the layer whose K/V it is handed (its
        own, usually; they are in the pages by now)."""
        source = self if keys is self.keys else owner_of(self.peers, keys, self)
        k_pages, v_pages = source.store.pages(source.layer)
        layer = macbatch.metal.LayerParams(scale, window, softcap, sinks, selected=selected)
        meta = self.batch.window_attention if source.windowed else self.batch.attention
        if self.chunk is not None:
            meta = self.batch.chunk_attention(self.chunk, source.store.block_size)
        q = queries[:, :, 0, :] if self.head_order is None else queries[:, self.head_order, 0, :]
        out = macbatch.metal.paged_attention(q, k_pages, v_pages, meta, layer)
        if self.batch.image_blocks is not None:  # Gemma 4: image rows attend both ways
            pages = (k_pages, v_pages)
            blocks = self.batch.image_blocks
            out = attend_blocks(out, q, pages, meta.block_tables, blocks, layer)
        if self.head_restore is not None:
            out = out[:, self.head_restore]
        return out[:, :, None, :]

    def attend_latent(
        self,
        queries: mx.array,
        row: mx.array,
        scale: float,
        value_dim: int,
        selected: mx.array | None = None,
        sinks: mx.array | None = None,
    ) -> mx.array:
        """An MLA layer's attention over its latent pages, this step's rows written first."""
        if self.writes:
            assert self.rows is not None
            self.store.write(self.layer, self.rows[1], row, None)
        k_pages, v_pages = self.store.pages(self.layer)
        layer = macbatch.metal.LayerParams(
            scale, sinks=sinks, value_dim=value_dim, selected=selected
        )
        out = macbatch.metal.paged_attention(
            queries[:, :, 0, :], k_pages, v_pages, self.batch.attention, layer
        )
        return out[:, :, None, :]

    def select(self, indexer: Any, x: mx.array, qr: mx.array) -> mx.array | None:
        """The indexer's keys of this step's rows written to their pages, then each row's top-k
        positions over its sequence's keys (None: the step attends densely)."""
        assert self.index_layer is not None and self.plan is not None and self.rows is not None
        rows = indexer_rows(indexer, x, qr, self.offset)
        self.store.write(self.index_layer, self.rows[1], rows.keys, None)
        return select(rows, self.store.key_pages(self.index_layer), self.plan)

    def select_blocks(self, indexer: Any, x: mx.array) -> mx.array | None:
        """The indexer's raw keys of this step's rows written to their pages, then each row's
        positions by its best blocks (None: the step attends densely)."""
        assert self.index_layer is not None and self.plan is not None and self.rows is not None
        rows = block_indexer_rows(indexer, x, self.offset)
        self.store.write(self.index_layer, self.rows[1], rows.keys, None)
        return select_blocks(rows, self.store.key_pages(self.index_layer), indexer, self.plan)

    def select_pools(self, indexer: Any, x: mx.array, qr: mx.array) -> mx.array | None:
        """The pooling indexer's keys and gates of this step's rows written to their pages, then
        each row's positions by its best pools (None: the step attends densely)."""
        assert self.index_layer is not None and self.plan is not None and self.rows is not None
        rows = pool_indexer_rows(indexer, x, qr)
        self.store.write(self.index_layer, self.rows[1], rows.pages, None)
        return select_pools(rows, self.store.key_pages(self.index_layer), indexer, self.plan)
