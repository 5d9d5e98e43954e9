"""GLM5-next's pooling indexer in the packed step (mlx-vlm's ``glm5_next``): each query row's
positions of its own sequence, which its latent attention then reads alone
(``macbatch.metal.LayerParams.selected``).

mlx-vlm's ``Glm5NextIndexer`` projects each token to one key (``k_norm(wk(x))``) and one gate
(``x @ index_kpool_compress_gate.T``, in the key's dtype once cached) and pools them in windows of
``index_kpool`` tokens (its ``PoolingCache``): a whole window's key is the sum of its keys
weighted by the softmax, over the window, of the gates plus a learnt per-offset bias
(``index_kpool_compress_ape``). A query scores the whole pools it sees by
``sum_h relu(q_h . k_p) * w_h / sqrt(head_dim)`` (``q``: ``wq_b`` of the attention's normed
query latent; ``w``: ``weights_proj(x) / sqrt(heads)``; no RoPE) and reads the tokens of its
best ``index_topk // index_kpool`` pools and those after its last whole pool (its own among
them): the rule of Qwen4-exp's blocks (``qsa_indexer.block_positions``), so ``width`` positions
hold any row's list, and a row that sees no more pools than it keeps reads every position.

The pages hold each token's key and gate side by side (``page_width``: ``2 * head_dim``); the
pools are summed from them for each step, so a chunk cut anywhere pools what mlx-vlm pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from macbatch.engine.model import qsa_indexer
from macbatch.engine.model.sparse_indexer import SelectionPlan, gather_keys
from macbatch.metal import AttentionMetadata

# what marks a module as a pooling indexer (mlx-vlm's ``Glm5NextIndexer``)
_MARKS = ("index_kpool", "index_kpool_compress_ape", "index_kpool_compress_gate", "wq_b", "wk")


def is_pool_indexer(module: Any) -> bool:
    """Whether ``module`` is an indexer that selects pools of keys (GLM5-next's)."""
    return module is not None and all(hasattr(module, name) for name in _MARKS)


def page_width(indexer: Any) -> int:
    """The columns one token keeps in the indexer's pages: its key, and its pooling gate where
    the indexer pools."""
    dim = int(indexer.head_dim)
    return 2 * dim if is_pool_indexer(indexer) else dim


def _kept(indexer: Any) -> int:
    """The whole pools one row reads."""
    return int(indexer.index_topk) // int(indexer.index_kpool)


def selection_plan(indexer: Any, meta: AttentionMetadata, block_size: int) -> SelectionPlan:
    """The step's plan for a sparse model's ``indexer``: a pooling one's rows list the tokens of
    their pools and their tail; the others as ``qsa_indexer.selection_plan`` plans them."""
    if not is_pool_indexer(indexer):
        return qsa_indexer.selection_plan(indexer, meta, block_size)
    pool = int(indexer.index_kpool)
    return SelectionPlan(meta, _kept(indexer) * pool + pool - 1, int(indexer.n_heads), block_size)


@dataclass(frozen=True)
class PoolIndexerRows:
    """A layer's indexer inputs for the step's rows: queries ``[N, H, D]``, page rows
    ``[N, 2D]`` (key, then gate), head weights ``[N, H]`` (float32, scales folded in)."""

    queries: mx.array
    pages: mx.array
    weights: mx.array


def pool_indexer_rows(indexer: Any, x: mx.array, qr: mx.array) -> PoolIndexerRows:
    """The indexer's projections of packed rows ``x [N, 1, hidden]`` and ``qr`` (the attention's
    normed query latent)."""
    n, heads, dim = x.shape[0], int(indexer.n_heads), int(indexer.head_dim)
    key = indexer.k_norm(indexer.wk(x[:, 0]))
    gate = x[:, 0].astype(mx.float32) @ indexer.index_kpool_compress_gate.T
    queries = indexer.wq_b(qr[:, 0]).reshape(n, heads, dim)
    weights = indexer.weights_proj(x[:, 0]).astype(mx.float32) * heads**-0.5
    weights = weights * indexer.softmax_scale
    return PoolIndexerRows(queries, mx.concatenate([key, gate.astype(key.dtype)], axis=-1), weights)


def select_pools(
    rows: PoolIndexerRows, pages: Any, indexer: Any, plan: SelectionPlan
) -> mx.array | None:
    """Each packed row's positions ``[N, width]`` int32 (-1: unused), from its sequence's paged
    keys and gates ``pages [blocks, 1, block_size, 2D]``; None when every row attends densely."""
    if plan.dense:
        return None
    pool, top = int(indexer.index_kpool), _kept(indexer)
    raw = gather_keys(pages, plan.meta.block_tables[:, : plan.num_blocks])
    pools = _pools(indexer, raw.astype(rows.pages.dtype)).astype(mx.float32).swapaxes(-1, -2)
    queries = rows.queries.astype(mx.float32)
    parts = []
    for tile in plan.tiles:
        packed = mx.array(tile.rows)
        s, length = tile.rows.shape
        tile_pools = pools if s == pools.shape[0] else pools[mx.array(tile.sequences)]
        q = queries[packed].reshape(s, length * plan.heads, -1)
        scores = mx.maximum(q @ tile_pools, 0).reshape(s, length, plan.heads, -1)
        scores = (scores * rows.weights[packed][..., None]).sum(axis=2)
        at = mx.array(tile.positions)
        whole = (at + 1) // pool  # [S_t, L_t] whole pools each row sees
        scores = mx.where(mx.arange(scores.shape[-1]) < whole[..., None], scores, -float("inf"))
        chosen = mx.argpartition(scores, kth=-top, axis=-1)[..., -top:].astype(mx.int32)
        chosen = mx.where(chosen < whole[..., None], chosen, -1)
        positions = qsa_indexer.block_positions(chosen, whole, at, pool)
        parts.append(positions.reshape(-1, positions.shape[-1])[mx.array(tile.real)])
    return mx.concatenate(parts, axis=0)[plan.order]


def _pools(indexer: Any, raw: mx.array) -> mx.array:
    """Every whole pool's key ``[S, T // pool, D]`` of page rows ``raw [S, T, 2D]``: its keys
    weighted by the softmax of its gates plus the per-offset bias (float32), in the keys'
    dtype."""
    s, t, _ = raw.shape
    pool, dim = int(indexer.index_kpool), int(indexer.head_dim)
    count = t // pool
    windows = raw[:, : count * pool].reshape(s, count, pool, 2 * dim)
    keys, gates = windows[..., :dim], windows[..., dim:]
    logits = gates.astype(mx.float32) + indexer.index_kpool_compress_ape
    probs = mx.softmax(logits, axis=2, precise=True).astype(keys.dtype)
    return (probs * keys).sum(axis=2)
