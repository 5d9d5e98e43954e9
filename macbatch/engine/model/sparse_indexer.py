"""DeepSeek Sparse Attention's lightning indexer in the packed step (DeepSeek V3.2
``deepseek_v32``, GLM-5 ``glm_moe_dsa``): each query row's top-k positions of its own sequence,
which the latent attention then reads alone (``macbatch.metal.LayerParams.selected``).

mlx-lm's ``Indexer`` (``models/deepseek_v32.py``) keeps one key per token per layer (``wk`` of
the hidden state, LayerNormed, roped on its leading ``qk_rope_head_dim`` columns) in a cache of
its own; a query row's score of position t is ``sum_h relu(q_h . k_t) * w_h`` over the indexer's
heads (``q_h``: ``wq_b`` of the attention's normed query latent, roped alike; ``w``:
``weights_proj`` of the hidden state times ``heads^-0.5 * head_dim^-0.5``), and the row attends
to the ``index_topk`` best of the positions it may see. When a call's sequence holds no more
than ``index_topk`` keys it returns None and attention is dense. Per row that is one rule: a row
that sees at most k positions attends to all of them, any other to its top k, which is what
``select`` gives every row (so a prefill chunk cut where mlx-lm's is not selects the same).

The keys live in the latent pages' blocks (``kv/indexer_keys.py``). One call per layer scores a
step's rows over their sequences' keys, gathered once per layer as ``[S, T, D]``: the rows are
laid out as ``[S, L]`` (sequence, row within its chunk), so decodes and prefill chunks score in
one batched matmul; the only Python loop is over tiles of ``L`` (a long prefill chunk's rows in
slices that bound the ``[S, heads, L, T]`` scores), each over the sequences with rows there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.stores import fp8_keys
from macbatch.engine.stores.fp8_keys import Fp8Pages
from macbatch.metal import AttentionMetadata
from macbatch.metal.quant import QuantizedPages, dequantize

# scores held at once by one tile: sequences x heads x rows x keys (float32: 256 MiB)
_TILE_SCORES = 1 << 26


@dataclass(frozen=True)
class IndexerRows:
    """A layer's indexer inputs for the step's rows: queries ``[N, H, D]``, keys ``[N, D]``
    (both roped), head weights ``[N, H]`` (scale folded in)."""

    queries: mx.array
    keys: mx.array
    weights: mx.array


def indexer_rows(indexer: Any, x: mx.array, qr: mx.array, positions: mx.array) -> IndexerRows:
    """mlx-lm's ``Indexer`` projections of packed rows ``x [N, 1, hidden]`` and ``qr`` (the
    attention's normed query latent), each row roped at its ``positions``."""
    n = x.shape[0]
    heads, dim = indexer.n_heads, indexer.head_dim
    q = indexer.wq_b(qr).reshape(n, 1, heads, dim).swapaxes(1, 2)  # [N, H, 1, D]
    k = indexer.k_norm(indexer.wk(x)).reshape(n, 1, 1, dim)
    q, k = indexer.rope(q, offset=positions), indexer.rope(k, offset=positions)
    weights = indexer.weights_proj(x)[:, 0] * (heads**-0.5 * indexer.softmax_scale)
    return IndexerRows(q[:, :, 0], k[:, 0, 0], weights)


@dataclass(frozen=True)
class _Tile:
    """A slice of the ``[S, L]`` row layout: its sequences, their packed rows, which are real."""

    sequences: np.ndarray  # [S_t]
    rows: np.ndarray  # [S_t, L_t] packed row of (sequence, row in chunk); 0 where padding
    positions: np.ndarray  # [S_t, L_t] each row's position in its sequence
    real: np.ndarray  # [S_t * L_t] flat indices of the rows that exist


class SelectionPlan:
    """What every sparse layer of one step shares: the host-side row layout (made once per
    step, on first use) from the step's ``AttentionMetadata``."""

    def __init__(
        self,
        meta: AttentionMetadata,
        top_k: int,
        heads: int,
        block_size: int,
        tile_scores: int = _TILE_SCORES,
        ratio: int = 1,
    ) -> None:
        self.meta = meta
        self.top_k = top_k
        self.heads = heads
        self.block_size = block_size
        self.tile_scores = tile_scores  # the most scores one tile holds
        # tokens per key: 1 for a key per token; DeepSeek V4's compressed rows, one per ``ratio``
        # tokens, of which position ``p`` sees the first ``(p + 1) // ratio``
        self.ratio = ratio

    @functools.cached_property
    def longest(self) -> int:
        """The most keys a sequence of the step holds."""
        return int(self.meta.host_seq_lens.max(initial=0)) // self.ratio

    @functools.cached_property
    def dense(self) -> bool:
        """No sequence holds more keys than ``top_k``: every row attends densely."""
        return self.longest <= self.top_k

    @functools.cached_property
    def num_blocks(self) -> int:
        """The key blocks gathered per sequence (its longest's)."""
        return -(-self.longest // self.block_size)

    @functools.cached_property
    def tiles(self) -> list[_Tile]:
        cu = self.meta.host_cu_seqlens_q.astype(np.int64)
        lens = self.meta.host_seq_lens.astype(np.int64)
        q_lens = cu[1:] - cu[:-1]
        keys = self.num_blocks * self.block_size
        step = max(1, self.tile_scores // max(1, len(q_lens) * self.heads * keys))
        tiles = []
        for first in range(0, int(q_lens.max(initial=0)), step):
            sequences = np.flatnonzero(q_lens > first)
            local = np.arange(first, min(first + step, int(q_lens[sequences].max())))
            in_chunk = local[None, :] < q_lens[sequences, None]
            rows = np.where(in_chunk, cu[sequences, None] + local[None, :], 0)
            start = lens[sequences] - q_lens[sequences]
            positions = start[:, None] + local[None, :]
            tiles.append(_Tile(sequences, rows, positions, np.flatnonzero(in_chunk.ravel())))
        return tiles

    @functools.cached_property
    def order(self) -> mx.array:
        """Where each packed row's selection is among the tiles' real rows, concatenated."""
        rows = np.concatenate([t.rows.ravel()[t.real] for t in self.tiles])
        return mx.array(np.argsort(rows, kind="stable").astype(np.int32))


def select(rows: IndexerRows, key_pages: Any, plan: SelectionPlan) -> mx.array | None:
    """Each packed row's ``top_k`` positions ``[N, K]`` int32 by the indexer's score over the
    positions it may see (-1: unused, when it sees fewer), from its sequence's paged indexer
    keys ``key_pages [blocks, 1, block_size, D]``; None when every row attends densely."""
    if plan.dense:
        return None
    keys = gather_keys(key_pages, plan.meta.block_tables[:, : plan.num_blocks])
    return top_k(rows.queries, rows.weights, keys, plan)


def top_k(queries: mx.array, weights: mx.array, keys: mx.array, plan: SelectionPlan) -> mx.array:
    """Each packed row's ``plan.top_k`` best keys ``[N, K]`` int32 (-1: unused) of the
    ``plan.ratio`` rule's visible ones, by ``sum_h relu(q_h . k) * w_h`` of its ``queries
    [N, H, D]`` and head ``weights [N, H]`` over its own sequence's ``keys [S, T, D]``."""
    keys = keys.astype(queries.dtype)
    parts = []
    for tile in plan.tiles:
        packed = mx.array(tile.rows)
        s, length = tile.rows.shape
        every = s == keys.shape[0]  # all sequences (a decode step's one tile): no gather
        tile_keys = keys if every else keys[mx.array(tile.sequences)]
        # [S_t, L_t * H, D] @ [S_t, D, T]: one matrix per sequence, not one key matrix
        # broadcast to every head (which MLX's CPU matmul copies, 13x slower at 16 x 16K)
        q = queries[packed].reshape(s, length * plan.heads, -1)
        scores = mx.maximum(q @ tile_keys.swapaxes(-1, -2), 0)
        scores = scores.reshape(s, length, plan.heads, -1) * weights[packed][..., None]
        scores = scores.sum(axis=2)  # [S_t, L_t, T]
        seen = (mx.array(tile.positions)[..., None] + 1) // plan.ratio  # keys each row sees
        scores = mx.where(mx.arange(scores.shape[-1]) < seen, scores, -float("inf"))
        top = mx.argpartition(scores, kth=-plan.top_k, axis=-1)[..., -plan.top_k :]
        top = mx.where(top < seen, top.astype(mx.int32), -1)
        parts.append(top.reshape(-1, plan.top_k)[mx.array(tile.real)])
    return mx.concatenate(parts, axis=0)[plan.order]


def gather_keys(pages: Any, blocks: mx.array) -> mx.array:
    """The key rows of each sequence's ``blocks [S, n]`` as ``[S, n * block_size, D]`` (quantized
    and fp8 pages dequantized)."""
    if isinstance(pages, Fp8Pages):
        gathered = fp8_keys.dequantize(pages.codes[blocks][:, :, 0], pages.scales[blocks][:, :, 0])
    elif isinstance(pages, QuantizedPages):
        codes, scales = pages.codes[blocks][:, :, 0], pages.scales[blocks][:, :, 0]
        gathered = dequantize(codes, scales, pages.bits, pages.group_size)
    else:
        gathered = pages[blocks][:, :, 0]  # [S, n, block_size, D]
    s, n, size, d = gathered.shape
    return gathered.reshape(s, n * size, d)
