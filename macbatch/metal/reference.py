"""Pure-MLX varlen paged attention: the contract every attention backend implements, the oracle
their self-tests compare with, and the fallback when no kernel is proven.

Page layout (shared with the kernel and `engine/stores/pages.py`): one array per layer and per K/V,
shaped ``[num_blocks, num_kv_heads, block_size, head_dim]``, so one KV head's block is contiguous.

Latent pages (MLA, ``LayerParams.value_dim``): one KV head whose rows hold the compressed latent
followed by the shared RoPE key; the values are the leading ``value_dim`` columns of the same
rows, so a token's cache is one row, read once for both.

Query row ``i`` of sequence ``s`` (``q_len = cu[s+1] - cu[s]``) sits at position
``p = seq_lens[s] - q_len + (i - cu[s])`` and attends to keys ``0..p`` (only the last
``sliding_window`` of them when set). No row ever sees another sequence's keys.

Sparse attention (``LayerParams.selected [N, K]``): row ``i`` attends only to the positions its
row of ``selected`` lists that it may see by the rule above; -1 marks an unused entry. The
positions are distinct, and each row lists at least one it may see (its own, for DeepSeek's
indexer). Every backend reads only the listed rows' pages.

A second source (``LayerParams.rows``, a `RowSource`: DeepSeek V4's compressed rows): row ``i``
also reads, in the same softmax, the rows its row of ``rows.selected`` lists (-1: none) of its
own sequence in the row pages, found through their own block table; the caller decides what
each row may read, so no causal or window rule applies to them. It needs latent pages of one KV
head (keys are values), and the row pages share the token pages' format and width.

Quantized pages (``QuantizedPages``, format in ``quant.py``) are gathered as codes and scales and
dequantized to float32 after the gather: only the context of the sequences being attended, for
this call, never the pool.

The step metadata (`AttentionMetadata`) carries host copies of ``cu_seqlens_q`` and ``seq_lens``,
so planning here reads no device array; the per-sequence Python loop is over requests, not tokens.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from macbatch.arithmetic import ceil_div
from macbatch.metal.backend import (
    AttentionBackend,
    AttentionMetadata,
    LayerParams,
    Pages,
    check_row_source,
)
from macbatch.metal.quant import QuantizedPages, dequantize

_PREFILL_TILE = 128
# query rows x selected positions gathered at once by the sparse form (bounds its memory)
_SPARSE_TILE_ENTRIES = 1 << 15


def paged_attention_reference(
    q: mx.array, k_pages: Pages, v_pages: Pages, meta: AttentionMetadata, layer: LayerParams
) -> mx.array:
    """Attention of packed query rows ``q [N, Hq, D]`` over each row's own paged context.

    Decode rows (``q_len == 1``) go through a few batched calls, sequences of similar length
    together so little padding is read; each prefill chunk is cut into query tiles with a causal
    mask offset by the context already cached.
    """
    if layer.rows is not None:
        check_row_source(q, k_pages, meta, layer)
    if layer.selected is not None or layer.rows is not None:
        return _listed_attention(q, k_pages, v_pages, meta, layer)
    scale, sliding_window, softcap, sinks, value_dim, *_ = layer
    block_tables = meta.block_tables
    lens = meta.host_seq_lens.astype(np.int64)
    cu = meta.host_cu_seqlens_q.astype(np.int64)
    q_lens = cu[1:] - cu[:-1]
    block_size = k_pages.shape[2]
    parts: list[tuple[np.ndarray, mx.array]] = []  # (packed row ids, their output rows)

    decode_seqs = np.flatnonzero(q_lens == 1)
    for group in _length_groups(decode_seqs[np.argsort(lens[decode_seqs])], lens):
        query_pos = lens[group] - 1
        first_block = 0
        if sliding_window is not None:  # blocks wholly before every row's window are skipped
            first_block = int(max(0, query_pos.min() - sliding_window + 1)) // block_size
        n_blocks = ceil_div(int(lens[group].max()), block_size)
        tables = block_tables[mx.array(group)][:, first_block:n_blocks]
        keys = _gather_context(k_pages, tables)
        values = _values(keys, v_pages, tables, value_dim)
        key_pos = np.arange(first_block * block_size, n_blocks * block_size)[None, :]
        mask = _visible(query_pos[:, None], key_pos, sliding_window)[:, None, None, :]
        rows = cu[group]
        out = _attend(q[mx.array(rows)][:, :, None, :], keys, values, mask, scale, softcap, sinks)
        parts.append((rows, out[:, :, 0, :]))

    for s in np.flatnonzero(q_lens > 1):
        q_len, ctx, start = int(q_lens[s]), int(lens[s]), int(cu[s])
        table = block_tables[int(s) : int(s) + 1, : ceil_div(ctx, block_size)]
        keys = _gather_context(k_pages, table)
        values = _values(keys, v_pages, table, value_dim)
        # Query tiles: each tile reads keys only up to its own last position (and from the
        # window's start), so the causal upper triangle is skipped, not computed and masked.
        for tile_start in range(0, q_len, _PREFILL_TILE):
            tile_len = min(_PREFILL_TILE, q_len - tile_start)
            first_pos = ctx - q_len + tile_start
            query_pos = np.arange(first_pos, first_pos + tile_len)[:, None]
            key_end = first_pos + tile_len
            key_start = 0 if sliding_window is None else max(0, first_pos - sliding_window + 1)
            key_pos = np.arange(key_start, key_end)[None, :]
            mask = _visible(query_pos, key_pos, sliding_window)[None, None]
            rows = np.arange(start + tile_start, start + tile_start + tile_len)
            out = _attend(
                q[int(rows[0]) : int(rows[-1]) + 1].transpose(1, 0, 2)[None],
                keys[:, :, key_start:key_end],
                values[:, :, key_start:key_end],
                mask,
                scale,
                softcap,
                sinks,
            )
            parts.append((rows, out[0].transpose(1, 0, 2)))

    if not parts:
        return mx.zeros((*q.shape[:2], value_dim or q.shape[2]), dtype=q.dtype)
    rows = np.concatenate([r for r, _ in parts])
    out = mx.concatenate([o for _, o in parts], axis=0)
    if np.array_equal(rows, np.arange(len(rows))):
        return out
    return out[mx.array(np.argsort(rows))]


def masked_attention(
    q: mx.array,
    k_pages: Pages,
    v_pages: Pages,
    blocks: mx.array,
    visible: mx.array,
    layer: LayerParams,
) -> mx.array:
    """Attention of query rows ``q [B, Hq, L, D]`` over the keys of the blocks ``blocks
    [B, n_blocks]`` (block ids, in key order), each row seeing the keys ``visible [B, L,
    n_blocks * block_size]`` marks (at least one per row): for masks other than the causal one
    of the contract (Gemma 4's image blocks, engine/model/image_blocks.py)."""
    scale, _, softcap, sinks, value_dim, *_ = layer
    k = _gather_context(k_pages, blocks)
    v = _values(k, v_pages, blocks, value_dim)
    return _attend(q, k, v, visible[:, None], scale, softcap, sinks)


def _listed_attention(
    q: mx.array, k_pages: Pages, v_pages: Pages, meta: AttentionMetadata, layer: LayerParams
) -> mx.array:
    """The contract's sparse and two-source forms: each query row gathers only the rows it
    reads, a tile of query rows at a time so the gathered keys stay small when a long prefill
    chunk reads from a long context.

    A row's token entries are its ``selected`` positions, or (dense, with a second source) every
    position of its window, or of its context without one; its second source's entries are the
    rows ``layer.rows.selected`` lists (no causal check), gathered through their own block table
    and read in the same softmax (values: their leading ``value_dim`` columns).
    """
    scale, window, softcap, sinks, value_dim, selected, rows = layer
    cu = meta.host_cu_seqlens_q.astype(np.int64)
    q_lens = cu[1:] - cu[:-1]
    seq_of_row = np.repeat(np.arange(len(q_lens)), q_lens)
    row_pos = meta.host_seq_lens.astype(np.int64)[seq_of_row] - q_lens[seq_of_row]
    row_pos += np.arange(len(seq_of_row)) - cu[seq_of_row]
    if selected is not None:
        entries = selected.shape[1]
    else:  # a dense first source beside a second one: every position it may see, listed
        entries = window or int(meta.host_seq_lens.max(initial=1))
    extra = 0 if rows is None else rows.selected.shape[1]
    tile = max(1, _SPARSE_TILE_ENTRIES // (entries + extra))
    parts = []
    for start in range(0, q.shape[0], tile):
        at = slice(start, min(start + tile, q.shape[0]))
        pos = mx.array(row_pos[at])[:, None]
        sel = pos - mx.arange(entries)[None] if selected is None else selected[at].astype(mx.int32)
        visible = (sel >= 0) & (sel <= pos)
        if window is not None:
            visible &= sel > pos - window
        seqs = mx.array(seq_of_row[at])
        keys = _gather_listed(k_pages, meta.block_tables[seqs], sel, visible)
        if rows is not None:
            listed = rows.selected[at].astype(mx.int32)
            found = _gather_listed(rows.pages, rows.block_table[seqs], listed, listed >= 0)
            keys = mx.concatenate([keys, found], axis=2)
            visible = mx.concatenate([visible, listed >= 0], axis=1)
        if value_dim is not None:
            values = keys[..., :value_dim]
        else:
            values = _gather_listed(v_pages, meta.block_tables[seqs], sel, visible)
        mask = visible[:, None, None, :]
        out = _attend(q[at][:, :, None, :], keys, values, mask, scale, softcap, sinks)
        parts.append(out[:, :, 0, :])
    if not parts:
        return mx.zeros((*q.shape[:2], value_dim or q.shape[2]), dtype=q.dtype)
    return mx.concatenate(parts, axis=0)


def _gather_listed(pages: Pages, tables: mx.array, listed: mx.array, visible: mx.array) -> mx.array:
    """The rows ``listed [n, K]`` names in pages addressed through ``tables [n, blocks]`` ->
    ``[n, Hkv, K, D]``; hidden entries read the first row of the first block instead (masked)."""
    safe = mx.where(visible, listed, 0)
    block_size = pages.shape[2]
    blocks = mx.take_along_axis(tables, safe // block_size, axis=1)
    return _gather_rows(pages, blocks, safe % block_size)


def _gather_rows(pages: Pages, blocks: mx.array, offsets: mx.array) -> mx.array:
    """Token rows at ``(blocks, offsets) [N, K]`` -> ``[N, Hkv, K, D]`` (quantized pages come out
    as float32)."""
    heads = mx.arange(pages.shape[1])[None, :, None]
    where = (blocks[:, None, :], heads, offsets[:, None, :])
    if isinstance(pages, QuantizedPages):
        codes, scales = pages.codes[where], pages.scales[where]
        return dequantize(codes, scales, pages.bits, pages.group_size)
    return pages[where]


class ReferenceBackend(AttentionBackend):
    """The oracle every kernel is self-tested against, and the fallback: runs anywhere."""

    name = "reference"
    label = "reference"

    __call__ = staticmethod(paged_attention_reference)


def _length_groups(seqs: np.ndarray, lens: np.ndarray, slack: float = 1.25) -> list[np.ndarray]:
    """Split length-sorted sequences into groups padded to their longest member, so the
    padding stays within ``slack`` of the keys actually read (one gather per group)."""
    groups: list[np.ndarray] = []
    start = 0
    for end in range(1, len(seqs) + 1):
        if end == len(seqs) or lens[seqs[end]] * (end + 1 - start) > slack * (
            lens[seqs[start : end + 1]].sum()
        ):
            groups.append(seqs[start:end])
            start = end
    return groups


def _gather_context(pages: Pages, tables: mx.array) -> mx.array:
    """[S, n_blocks] block ids -> [S, Hkv, n_blocks * block_size, D], gathered straight into
    that order (one gather, no transpose copy); quantized pages come out as float32."""
    heads = mx.arange(pages.shape[1])[None, :, None]
    if isinstance(pages, QuantizedPages):
        codes = pages.codes[tables[:, None, :], heads]  # (S, Hkv, nb, bs, D * bits / 8)
        scales = pages.scales[tables[:, None, :], heads]
        gathered = dequantize(codes, scales, pages.bits, pages.group_size)
    else:
        gathered = pages[tables[:, None, :], heads]  # (S, Hkv, nb, bs, D)
    s, hkv, nb, bs, d = gathered.shape
    return gathered.reshape(s, hkv, nb * bs, d)


def _values(keys: mx.array, v_pages: Pages, tables: mx.array, value_dim: int | None) -> mx.array:
    """The gathered values: their own pages', or (latent pages) the leading ``value_dim``
    columns of the keys already gathered, so a latent row is read once."""
    return _gather_context(v_pages, tables) if value_dim is None else keys[..., :value_dim]


def _visible(query_pos: np.ndarray, key_pos: np.ndarray, window: int | None) -> mx.array:
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    return mx.array(visible)


def _attend(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    mask: mx.array,
    scale: float,
    softcap: float | None,
    sinks: mx.array | None,
) -> mx.array:
    """Masked attention of ``q [B, Hq, Lq, D]`` over ``k [B, Hkv, L, D]`` and ``v [B, Hkv,
    L, Dv]`` in float32 (``Dv`` differs from ``D`` for latent pages).

    Query heads of a KV group are stacked into one matmul against their shared K/V. Explicit
    matmuls rather than ``mx.fast.scaled_dot_product_attention``: on MLX's CPU backend they go
    through BLAS and measured about twice as fast for these shapes.
    """
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    qg = (q.astype(mx.float32) * scale).reshape(b, hkv, group * lq, d)
    scores = (qg @ k.astype(mx.float32).swapaxes(-1, -2)).reshape(b, hkv, group, lq, -1)
    if softcap is not None:
        scores = mx.tanh(scores / softcap) * softcap
    scores = mx.where(mask[:, :, None], scores, -mx.inf)
    if sinks is not None:
        sink = mx.broadcast_to(
            sinks.astype(mx.float32).reshape(1, hkv, group, 1, 1), (*scores.shape[:-1], 1)
        )
        scores = mx.concatenate([sink, scores], axis=-1)
    probs = mx.softmax(scores, axis=-1, precise=True)
    if sinks is not None:
        probs = probs[..., 1:]
    out = probs.reshape(b, hkv, group * lq, -1) @ v.astype(mx.float32)
    return out.reshape(b, hq, lq, v.shape[-1]).astype(q.dtype)
