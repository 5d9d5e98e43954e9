"""Turns a StepPlan into the arrays of one packed forward, built with numpy and moved to MLX once.

Rows are the plan's chunks concatenated in order (decodes first, then prefill chunks); every
token is its own batch row of the (N, 1) model input. A decode whose input token is still pending
(sampled by the step in flight, not yet read by the host) gets a 0 in ``token_ids`` and its row in
``pending_rows``: the engine fills those rows from the previous step's sampled tokens on the
device.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import mlx.core as mx
import numpy as np

from macbatch.engine.recurrent import StateChunk, StateRows
from macbatch.engine.scheduler import StepPlan
from macbatch.metal import AttentionMetadata


@dataclass
class PackedBatch:
    # [N] int32 (uint32 when the engine takes a decode-only step's inputs straight from the
    # previous step's samples: the embedding gathers either)
    token_ids: mx.array
    positions: mx.array  # [N] int32, each token's position in its sequence
    cu_seqlens_q: mx.array  # [S+1] int32
    seq_lens: mx.array  # [S] int32, context length after this step
    block_tables: mx.array  # [S, max_blocks] int32 (padding: block 0, never read)
    kv_write_rows: dict[int, mx.array]  # num_kv_heads -> [N * Hkv] flat page rows to write
    sample_rows: mx.array  # [R] rows whose logits are sampled
    num_tokens: int
    pending_rows: list[int]  # rows whose token is pending (filled on the device)
    pending_chunks: list[int]  # the plan's chunk index of each pending row
    # A hybrid model's recurrent layers: which rows form which sequence, and their state slots
    # (every rank keeps its heads' share of every slot).
    state_rows: StateRows | None = None
    # The window group's (sliding-window layers) block tables and write rows, when the model has
    # one: its own block ids, block 0 where a block left every window (never read). Rank 0's
    # alone (a distributed engine keeps every layer in the full group).
    window_block_tables: mx.array | None = field(default=None, metadata={"rank_local": True})
    window_write_rows: dict[int, mx.array] | None = field(
        default=None, metadata={"rank_local": True}
    )

    @cached_property
    def attention(self) -> AttentionMetadata:
        """What every full-attention layer reads of this step, made once per step on first use
        (a property, not a field: the distributed channel sends the fields as they are)."""
        return AttentionMetadata.build(self.block_tables, self.seq_lens, self.cu_seqlens_q)

    @cached_property
    def window_attention(self) -> AttentionMetadata:
        """What every sliding-window layer reads of this step: the window group's tables."""
        assert self.window_block_tables is not None
        return AttentionMetadata.build(self.window_block_tables, self.seq_lens, self.cu_seqlens_q)


def pack(
    plan: StepPlan,
    block_tables: list[list[int]],
    block_size: int,
    kv_head_counts: set[int],
    states: Sequence[StateChunk] | None = None,
    window: tuple[list[list[int]], set[int]] | None = None,
) -> PackedBatch:
    """``block_tables[i]`` is the KV manager's block table of ``plan.chunks[i]``'s request,
    ``states[i]`` how its recurrent state flows (hybrid models only), and ``window`` the window
    group's block tables and KV head counts (models with sliding-window layers only).

    One Python pass over the chunks collects their numbers; the rest is whole-array numpy (the
    step's host time grows with the running requests, so no per-chunk numpy calls)."""
    chunks = plan.chunks
    count = len(chunks)
    lengths = np.fromiter((c.num_tokens for c in chunks), np.int32, count)
    starts = np.fromiter((c.start for c in chunks), np.int32, count)
    samples = np.fromiter((c.samples for c in chunks), np.bool_, count)
    cu = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    num_tokens = int(cu[-1])
    seq_lens = starts + lengths
    if num_tokens == count:  # decodes only: one row per chunk
        row_seq = np.arange(count)
        positions = starts
    else:
        row_seq = np.repeat(np.arange(count), lengths)
        positions = (np.arange(num_tokens) - cu[:-1][row_seq] + starts[row_seq]).astype(np.int32)
    token_ids, pending_chunks = _known_tokens(plan)
    pending_rows = [int(cu[i + 1]) - 1 for i in pending_chunks]

    tables = _table_array(block_tables)
    write_rows = _write_rows(tables, row_seq, positions, block_size, kv_head_counts)
    window_tables = window_rows = None
    if window is not None:
        window_array = _table_array(window[0])
        window_rows = _write_rows(window_array, row_seq, positions, block_size, window[1])
        window_tables = mx.array(window_array)

    return PackedBatch(
        token_ids=mx.array(token_ids),
        positions=mx.array(positions),
        cu_seqlens_q=mx.array(cu),
        seq_lens=mx.array(seq_lens),
        block_tables=mx.array(tables),
        kv_write_rows=write_rows,
        sample_rows=mx.array(cu[1:][samples] - 1),
        num_tokens=num_tokens,
        pending_rows=pending_rows,
        pending_chunks=pending_chunks,
        state_rows=None if states is None else StateRows.build(lengths, states),
        window_block_tables=window_tables,
        window_write_rows=window_rows,
    )


def _write_rows(
    tables: np.ndarray,
    row_seq: np.ndarray,
    positions: np.ndarray,
    block_size: int,
    kv_head_counts: set[int],
) -> dict[int, mx.array]:
    """Per KV head count, the flat page rows every token's K/V goes to (``[N * Hkv]``)."""
    blocks = tables[row_seq, positions // block_size].astype(np.int64)
    offsets = positions % block_size
    write_rows = {}
    for hkv in kv_head_counts:
        rows = (blocks[:, None] * hkv + np.arange(hkv)[None, :]) * block_size + offsets[:, None]
        write_rows[hkv] = mx.array(rows.reshape(-1).astype(np.int32))
    return write_rows


def _known_tokens(plan: StepPlan) -> tuple[np.ndarray, list[int]]:
    """Every row's input token in row order (0 where it is pending), and the chunks whose last
    token is pending (only a decode's single token can be)."""
    flat: list[int] = []
    pending: list[int] = []
    for i, c in enumerate(plan.chunks):
        known = c.request.token_slice(c.start, c.start + c.num_tokens)
        flat += known
        if len(known) < c.num_tokens:
            flat.append(0)
            pending.append(i)
    return np.array(flat, dtype=np.int32), pending


def _table_array(block_tables: list[list[int]]) -> np.ndarray:
    """``[S, max_blocks]`` int32, each table left-aligned, padded with block 0 (never read)."""
    lengths = np.fromiter(map(len, block_tables), np.int64, len(block_tables))
    flat = np.fromiter(itertools.chain.from_iterable(block_tables), np.int32, int(lengths.sum()))
    tables = np.zeros((len(block_tables), int(lengths.max())), dtype=np.int32)
    tables[np.arange(tables.shape[1]) < lengths[:, None]] = flat  # row-major: rows in order
    return tables
