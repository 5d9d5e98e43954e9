"""Chunked attention (Llama 4's ``attention_chunk_size``) as the kernels' plain causal attention.

A chunked layer's query at position ``p`` attends to the keys of its own chunk only, positions
``(p // chunk) * chunk .. p``. The kernels already attend each sequence's rows causally over its
block table, so the step's sequences are cut where a chunk starts: each piece becomes a sequence
of its own whose block table starts at its chunk's first block (a chunk is a whole number of
blocks) and whose length counts from there. Its rows see exactly their chunk's keys, in every
backend, with no mask of their own. The pieces keep the rows' order, so the output needs no
reordering. Planned on the host, once per step and chunk size (``PackedBatch.chunk_attention``).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from macbatch.arithmetic import ceil_div
from macbatch.metal import AttentionMetadata


def chunked(meta: AttentionMetadata, chunk: int, block_size: int) -> AttentionMetadata:
    """``meta``'s sequences cut at every multiple of ``chunk`` (itself a multiple of
    ``block_size``), each piece a sequence starting at its chunk; ``meta`` itself when every
    row is in its sequence's first chunk."""
    cu = meta.host_cu_seqlens_q.astype(np.int64)
    lens = meta.host_seq_lens.astype(np.int64)
    first = lens - (cu[1:] - cu[:-1])  # each sequence's first query position
    first_chunk = first // chunk
    pieces = np.maximum((lens - 1) // chunk - first_chunk + 1, 1)
    if (pieces == 1).all() and not first_chunk.any():
        return meta
    seq = np.repeat(np.arange(len(lens)), pieces)
    piece_starts = np.cumsum(pieces) - pieces
    start = (first_chunk[seq] + np.arange(len(seq)) - piece_starts[seq]) * chunk
    end = np.minimum(lens[seq], start + chunk)
    q_lens = end - np.maximum(first[seq], start)
    width = min(meta.block_tables.shape[1], ceil_div(chunk, block_size))
    columns = np.minimum(
        (start // block_size)[:, None] + np.arange(width)[None, :], meta.block_tables.shape[1] - 1
    )
    tables = mx.take_along_axis(meta.block_tables[mx.array(seq)], mx.array(columns), axis=1)
    cu_pieces = np.concatenate([[0], np.cumsum(q_lens)])
    return AttentionMetadata.build(tables, end - start, cu_pieces)
