"""DeepSeek V4's CSA selection over compressed rows in a packed step: each query row's top-k of
its own sequence's visible compressed rows (row ``i`` visible to position ``p`` when
``i < (p + 1) // m``), the sparse indexer's contract (``[N, K]`` int32, -1 for none; None when
every row sees at most ``K``: dense) and its flat top-k (``sparse_indexer.top_k``), so no HISA.

The queries are each library's indexer's own: ``q_b_proj`` / ``wq_b`` of the attention's normed
query latent, roped at the row's position by the attention's RoPE (mlx-lm's also rounded to fp4,
blocks of 32), scored ``sum_h relu(q_h . k_i) * w_h`` with ``w = weights_proj(x) *
heads^-0.5 * head_dim^-0.5``. The keys are the ones the compressor op made
(``v4_compressor.ClosedGroups.keys``), handed in as each sequence's ``[S, R, D]`` rows, or
gathered from pages by a block table of compressed-row blocks (``paged_keys``): this module
reads no cache. Not built: mlx-lm's candidate filter (``candidate_source_layer_id``'s block-level
top-k masking later indexers' scores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.deepseek_v41 import _apply_rope, _fake_quant_fp4

from macbatch.engine.model.sparse_indexer import SelectionPlan, gather_keys, top_k
from macbatch.metal import AttentionMetadata


@dataclass(frozen=True)
class IndexerQueries:
    """A CSA layer's indexer queries for the step's rows ``[N, H, D]`` (roped) and their head
    weights ``[N, H]`` (float32, both scales folded in)."""

    queries: mx.array
    weights: mx.array


def selection_plan(
    meta: AttentionMetadata, indexer: Any, ratio: int, block_size: int = 1
) -> SelectionPlan:
    """The step's plan for ``indexer`` of either library over rows of ``ratio`` tokens
    (``block_size``: rows per page block of the keys, when they are paged)."""
    heads = int(getattr(indexer, "num_heads", getattr(indexer, "n_heads", 0)))
    return SelectionPlan(meta, int(indexer.index_topk), heads, block_size, ratio=ratio)


def v41_queries(attention: Any, x: mx.array, qr: mx.array, positions: mx.array) -> IndexerQueries:
    """mlx-lm ``deepseek_v41``'s indexer queries of packed rows ``x [N, hidden]``, ``qr
    [N, q_lora_rank]``, each at its ``positions [N]``."""
    indexer = attention.indexer
    n, heads, dim = x.shape[0], int(indexer.num_heads), int(indexer.head_dim)
    q = indexer.q_b_proj(qr).reshape(n, 1, heads, dim)
    # mlx-lm types ``offset`` an int; ``mx.fast.rope`` takes one per batch entry (row)
    offsets: Any = positions
    q = _apply_rope(q, attention.rope, rope_dim=int(indexer.rope_dim), offset=offsets)
    q = _fake_quant_fp4(q, block_size=32)
    weights = indexer.weights_proj(x).astype(mx.float32) * (heads**-0.5 * dim**-0.5)
    return IndexerQueries(q[:, 0], weights)


def v4_queries(attention: Any, x: mx.array, qr: mx.array, positions: mx.array) -> IndexerQueries:
    """mlx-vlm ``deepseek_v4``'s indexer queries of packed rows ``x [N, hidden]``, ``qr
    [N, q_lora_rank]``, each at its ``positions [N]``."""
    indexer = attention.indexer
    n, heads, dim = x.shape[0], int(indexer.n_heads), int(indexer.head_dim)
    q = attention.rope(indexer.wq_b(qr).reshape(n, heads, 1, dim), positions)
    weights = indexer.weights_proj(x).astype(mx.float32) * (heads**-0.5 * indexer.scale)
    return IndexerQueries(q[:, :, 0], weights)


def paged_keys(pages: Any, block_table: mx.array, plan: SelectionPlan) -> mx.array:
    """Each sequence's compressed keys ``[S, R, D]`` from ``pages [blocks, 1, block_size, D]``
    by its ``block_table [S, width]`` of compressed-row blocks."""
    return gather_keys(pages, block_table[:, : plan.num_blocks])


def select(queries: IndexerQueries, keys: mx.array, plan: SelectionPlan) -> mx.array | None:
    """Each packed row's top ``plan.top_k`` visible compressed rows ``[N, K]`` int32 (-1: none)
    of its sequence's ``keys [S, R, D]``; None when every row attends densely."""
    if plan.dense:
        return None
    return top_k(queries.queries, queries.weights, keys, plan)
