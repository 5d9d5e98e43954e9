"""Turns a StepPlan into the arrays of one packed forward, built with numpy and moved to MLX once.

Rows are the plan's chunks concatenated in order (decodes first, then prefill chunks); every
token is its own batch row of the (N, 1) model input. A decode whose input token is still pending
(sampled by the step in flight, not yet read by the host) gets a 0 in ``token_ids`` and its row in
``pending_rows``: the engine fills those rows from the previous step's sampled tokens on the
device.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from macbatch.engine.scheduler import StepPlan


@dataclass
class PackedBatch:
    token_ids: mx.array  # [N] int32
    positions: mx.array  # [N] int32, each token's position in its sequence
    cu_seqlens_q: mx.array  # [S+1] int32
    seq_lens: mx.array  # [S] int32, context length after this step
    block_tables: mx.array  # [S, max_blocks] int32 (padding: block 0, never read)
    kv_write_rows: dict[int, mx.array]  # num_kv_heads -> [N * Hkv] flat page rows to write
    sample_rows: mx.array  # [R] rows whose logits are sampled
    num_tokens: int
    pending_rows: list[int]  # rows whose token is pending (filled on the device)
    pending_chunks: list[int]  # the plan's chunk index of each pending row


def pack(
    plan: StepPlan, block_tables: list[list[int]], block_size: int, kv_head_counts: set[int]
) -> PackedBatch:
    """``block_tables[i]`` is the KV manager's block table of ``plan.chunks[i]``'s request."""
    chunks = plan.chunks
    lengths = np.array([c.num_tokens for c in chunks], dtype=np.int32)
    cu = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    starts = np.array([c.start for c in chunks], dtype=np.int32)
    seq_lens = starts + lengths

    token_ids = np.zeros(int(cu[-1]), dtype=np.int32)
    pending_rows, pending_chunks = [], []
    for i, c in enumerate(chunks):
        known = c.request.token_slice(c.start, c.start + c.num_tokens)
        token_ids[cu[i] : cu[i] + len(known)] = known
        if len(known) < c.num_tokens:  # only a decode's single token can be pending
            pending_rows.append(int(cu[i + 1]) - 1)
            pending_chunks.append(i)
    row_seq = np.repeat(np.arange(len(chunks)), lengths)
    positions = (np.arange(cu[-1]) - cu[:-1][row_seq] + starts[row_seq]).astype(np.int32)

    max_blocks = max(len(t) for t in block_tables)
    tables = np.zeros((len(chunks), max_blocks), dtype=np.int32)
    for i, table in enumerate(block_tables):
        tables[i, : len(table)] = table
    blocks = tables[row_seq, positions // block_size].astype(np.int64)
    offsets = positions % block_size

    write_rows = {}
    for hkv in kv_head_counts:
        rows = (blocks[:, None] * hkv + np.arange(hkv)[None, :]) * block_size + offsets[:, None]
        write_rows[hkv] = mx.array(rows.reshape(-1).astype(np.int32))

    sample_rows = np.array([cu[i + 1] - 1 for i, c in enumerate(chunks) if c.samples], np.int32)
    return PackedBatch(
        token_ids=mx.array(token_ids),
        positions=mx.array(positions),
        cu_seqlens_q=mx.array(cu),
        seq_lens=mx.array(seq_lens.astype(np.int32)),
        block_tables=mx.array(tables),
        kv_write_rows=write_rows,
        sample_rows=mx.array(sample_rows),
        num_tokens=int(cu[-1]),
        pending_rows=pending_rows,
        pending_chunks=pending_chunks,
    )
