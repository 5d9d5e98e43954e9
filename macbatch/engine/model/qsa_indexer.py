"""Qwen Sparse Attention's block indexer in the packed step (mlx-vlm's ``qwen4_exp``): each query
row's positions of its own sequence, which its attention then reads alone
(``macbatch.metal.LayerParams.selected``).

mlx-vlm's ``Qwen4ExpQSAIndexer`` projects each token to ``n_heads`` queries and one key
(``index_qk_proj``). The keys are pooled in blocks of ``compress_ratio`` tokens: a whole block's
summary is the mean of its raw keys, ``k_layernorm``-ed and roped at the block's first position.
A query (``q_layernorm``-ed, roped at its own position) scores the whole blocks it sees by
``sum_h relu(q_h . k_b) / sqrt(head_dim)`` and attends to the tokens of its best ``block_topk``
blocks and to the tokens after its last whole block (fewer than ``compress_ratio``, its own among
them). A row that sees no more than ``block_topk`` whole blocks attends to every position it
sees, which is what the same rule gives it (all its blocks win), so one rule serves every row
and ``width`` positions hold any row's list: ``block_topk`` blocks and a tail.

The raw keys are the pages (one ``head_dim`` row per token per layer, ``kv/indexer_keys.py``);
the summaries are pooled from them for each step, so a chunk cut anywhere pools what mlx-vlm
pools. The rows are scored in the tiles of DeepSeek's indexer (``sparse_indexer.SelectionPlan``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from macbatch.engine.model.sparse_indexer import SelectionPlan, gather_keys
from macbatch.metal import AttentionMetadata

# what marks a module as a block indexer (mlx-vlm's ``Qwen4ExpQSAIndexer``)
_MARKS = ("index_qk_proj", "compress_ratio", "block_topk", "q_layernorm", "k_layernorm")


def is_block_indexer(module: Any) -> bool:
    """Whether ``module`` is an indexer that selects blocks of keys (QSA's)."""
    return module is not None and all(hasattr(module, name) for name in _MARKS)


def width(indexer: Any) -> int:
    """The most positions one row reads: ``block_topk`` whole blocks and the tail after them."""
    ratio = int(indexer.compress_ratio)
    return int(indexer.block_topk) * ratio + ratio - 1


def selection_plan(indexer: Any, meta: AttentionMetadata, block_size: int) -> SelectionPlan:
    """The step's plan for a sparse model's ``indexer``: a row lists ``width`` positions here,
    DeepSeek's lightning indexer's ``index_topk``."""
    top_k = width(indexer) if is_block_indexer(indexer) else int(indexer.index_topk)
    return SelectionPlan(meta, top_k, int(indexer.n_heads), block_size)


@dataclass(frozen=True)
class BlockIndexerRows:
    """A layer's indexer inputs for the step's rows: queries ``[N, H, D]`` (normed and roped),
    raw keys ``[N, D]`` (as projected: the pages keep them so)."""

    queries: mx.array
    keys: mx.array


def block_indexer_rows(indexer: Any, x: mx.array, positions: mx.array) -> BlockIndexerRows:
    """The indexer's projections of packed rows ``x [N, 1, hidden]``, each query roped at its
    row's ``positions``."""
    n, heads, dim = x.shape[0], int(indexer.n_heads), int(indexer.head_dim)
    qk = indexer.index_qk_proj(x).reshape(n, 1, heads + 1, dim)
    queries = indexer.q_layernorm(qk[:, :, :heads]).transpose(0, 2, 1, 3)  # [N, H, 1, D]
    queries = _rope(indexer, queries, positions[:, None])
    return BlockIndexerRows(queries[:, :, 0], qk[:, 0, heads])


def select_blocks(
    rows: BlockIndexerRows, key_pages: Any, indexer: Any, plan: SelectionPlan
) -> mx.array | None:
    """Each packed row's positions ``[N, width]`` int32 (-1: unused), from its sequence's paged
    raw keys ``key_pages [blocks, 1, block_size, D]``; None when every row attends densely."""
    if plan.dense:
        return None
    # not dense: the longest sequence holds more than ``width`` keys, so more than ``top`` blocks
    ratio, top = int(indexer.compress_ratio), int(indexer.block_topk)
    raw = gather_keys(key_pages, plan.meta.block_tables[:, : plan.num_blocks])
    summaries = _summaries(indexer, raw.astype(rows.keys.dtype))  # [S, B, D]
    summaries = summaries.astype(mx.float32).swapaxes(-1, -2)
    queries = rows.queries.astype(mx.float32)
    parts = []
    for tile in plan.tiles:
        packed = mx.array(tile.rows)
        s, length = tile.rows.shape
        every = s == summaries.shape[0]
        tile_keys = summaries if every else summaries[mx.array(tile.sequences)]
        q = queries[packed].reshape(s, length * plan.heads, -1)
        scores = mx.maximum(q @ tile_keys, 0).reshape(s, length, plan.heads, -1).sum(axis=2)
        scores = scores / math.sqrt(queries.shape[-1])
        whole = (mx.array(tile.positions) + 1) // ratio  # [S_t, L_t] whole blocks each row sees
        visible = mx.arange(scores.shape[-1]) < whole[..., None]
        scores = mx.where(visible, scores, -float("inf"))
        blocks = mx.argpartition(scores, kth=-top, axis=-1)[..., -top:].astype(mx.int32)
        blocks = mx.where(blocks < whole[..., None], blocks, -1)
        positions = block_positions(blocks, whole, mx.array(tile.positions), ratio)
        parts.append(positions.reshape(-1, positions.shape[-1])[mx.array(tile.real)])
    return mx.concatenate(parts, axis=0)[plan.order]


def _summaries(indexer: Any, raw: mx.array) -> mx.array:
    """Every whole block's summary ``[S, T // ratio, D]`` of raw keys ``raw [S, T, D]``: the
    float32 mean in the keys' dtype, normed, roped at the block's first position."""
    s, t, d = raw.shape
    ratio = int(indexer.compress_ratio)
    blocks = t // ratio
    pooled = raw[:, : blocks * ratio].reshape(s, blocks, ratio, d).astype(mx.float32)
    pooled = indexer.k_layernorm(pooled.mean(axis=2).astype(raw.dtype))[:, None]
    starts = mx.broadcast_to((mx.arange(blocks, dtype=mx.int32) * ratio)[None], (s, blocks))
    return _rope(indexer, pooled, starts)[:, 0]


def block_positions(blocks: mx.array, whole: mx.array, at: mx.array, ratio: int) -> mx.array:
    """The positions rows read (GLM5-next's pools too, ``pool_indexer.py``): the tokens of their
    ``blocks [..., top]`` (-1: none), then the tail after their ``whole`` blocks up to their own
    position ``at``."""
    offsets = mx.arange(ratio, dtype=mx.int32)
    tokens = blocks[..., None] * ratio + offsets
    tokens = mx.where(blocks[..., None] >= 0, tokens, -1).reshape(*blocks.shape[:-1], -1)
    tail = (whole * ratio)[..., None] + offsets[: ratio - 1]
    tail = mx.where(tail <= at[..., None], tail, -1)
    return mx.concatenate([tokens, tail], axis=-1)


def _rope(indexer: Any, x: mx.array, positions: mx.array) -> mx.array:
    """mlx-vlm's rotation of ``x [B, H, L, D]`` at ``positions [B, L]`` (its attention's partial
    M-RoPE; text positions are the same in its three parts)."""
    rotated, _ = indexer.rotary_emb.apply_rotary(x, x, positions, unsqueeze_dim=1)
    return rotated
