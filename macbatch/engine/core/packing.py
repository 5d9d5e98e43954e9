"""Turns a StepPlan into the arrays of one packed forward, built with numpy and moved to MLX once.

Rows are the plan's chunks concatenated in order (decodes first, then prefill chunks); every
token is its own batch row of the (N, 1) model input. A decode whose input token is still pending
(sampled by the step in flight, not yet read by the host) gets a 0 in ``token_ids`` and its row in
``pending_rows``: the engine fills those rows from the previous step's sampled tokens on the
device. A speculating decode's chunk is its last token and its drafts, every row sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.core.scheduler import ScheduledChunk, StepPlan
from macbatch.engine.kv.tables import table_array, table_width
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.model.recurrent import StateChunk, StateRows

SMALL_DECODE = 16  # decode-only steps of at most this many sequences are packed from lists


def pack(
    plan: StepPlan,
    block_tables: list[list[int]],
    block_size: int,
    kv_head_counts: set[int],
    states: Sequence[StateChunk] | None = None,
    window: tuple[list[list[int]], set[int]] | None = None,
    long_rope: bool = False,
) -> PackedBatch:
    """``block_tables[i]`` is the KV manager's block table of ``plan.chunks[i]``'s request,
    ``states[i]`` how its recurrent state flows (hybrid models only), and ``window`` the window
    group's block tables and KV head counts (models with sliding-window layers only);
    ``long_rope``: each row says whether its request is rotated long (a LongRoPE model's).

    One Python pass over the chunks collects their numbers; the rest is whole-array numpy (the
    step's host time grows with the running requests, so no per-chunk numpy calls). A small
    decode-only step is packed from Python lists instead (``_pack_small_decode``)."""
    chunks = plan.chunks
    count = len(chunks)
    if count <= SMALL_DECODE and states is None and plan.num_tokens == count:
        batch = _pack_small_decode(plan, block_tables, block_size, kv_head_counts, window)
        if long_rope:
            batch.long_rope_rows = mx.array([c.request.long_rope for c in chunks], mx.int32)
        return batch
    lengths = np.fromiter((c.num_tokens for c in chunks), np.int32, count)
    starts = np.fromiter((c.start for c in chunks), np.int32, count)
    samples = np.fromiter((c.samples for c in chunks), np.bool_, count)
    drafts = np.fromiter((c.num_drafts for c in chunks), np.int32, count)
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

    tables = table_array(block_tables)
    write_rows = _write_rows(tables, row_seq, positions, block_size, kv_head_counts)
    window_tables = window_rows = None
    if window is not None:
        window_array = table_array(window[0])
        window_rows = _write_rows(window_array, row_seq, positions, block_size, window[1])
        window_tables = mx.array(window_array)
    long_rows = None
    if long_rope:
        longs = np.fromiter((c.request.long_rope for c in chunks), np.int32, count)
        long_rows = mx.array(longs[row_seq])

    return PackedBatch(
        token_ids=mx.array(token_ids),
        positions=mx.array(positions),
        cu_seqlens_q=mx.array(cu),
        seq_lens=mx.array(seq_lens),
        block_tables=mx.array(tables),
        kv_write_rows=write_rows,
        sample_rows=mx.array(_sample_rows(cu, samples, drafts)),
        num_tokens=num_tokens,
        pending_rows=pending_rows,
        pending_chunks=pending_chunks,
        state_rows=None if states is None else StateRows.build(lengths, states),
        adapter_rows=_adapter_rows(chunks, lengths),
        window_block_tables=window_tables,
        window_write_rows=window_rows,
        long_rope_rows=long_rows,
    )


def _pack_small_decode(
    plan: StepPlan,
    block_tables: list[list[int]],
    block_size: int,
    kv_head_counts: set[int],
    window: tuple[list[list[int]], set[int]] | None,
) -> PackedBatch:
    """``pack`` of a decode-only step (one row per chunk) of a few sequences: the same arrays,
    built from Python lists, because numpy's cost per call, not per element, is most of a small
    step's packing (70 us of numpy at one request became about 20 us: the single-request path,
    docs/engine.md)."""
    chunks = plan.chunks
    positions = [c.start for c in chunks]
    token_ids, pending = _known_tokens(plan)
    window_tables = window_rows = None
    if window is not None:
        window_tables = mx.array(_padded(window[0]), mx.int32)
        window_rows = _listed_write_rows(window[0], positions, block_size, window[1])
    return PackedBatch(
        token_ids=mx.array(token_ids),
        positions=mx.array(positions, mx.int32),
        cu_seqlens_q=mx.array(list(range(len(chunks) + 1)), mx.int32),
        seq_lens=mx.array([p + 1 for p in positions], mx.int32),
        block_tables=mx.array(_padded(block_tables), mx.int32),
        kv_write_rows=_listed_write_rows(block_tables, positions, block_size, kv_head_counts),
        sample_rows=mx.array([i for i, c in enumerate(chunks) if c.samples], mx.int32),
        num_tokens=len(chunks),
        pending_rows=pending,
        pending_chunks=list(pending),
        adapter_rows=_adapter_rows(chunks, None),
        window_block_tables=window_tables,
        window_write_rows=window_rows,
    )


def _adapter_rows(chunks: Sequence[ScheduledChunk], lengths: np.ndarray | None) -> mx.array | None:
    """Each row's adapter slot (``lengths``: rows per chunk; None: one each), or None when no
    chunk's request names an adapter (the adapted layers then run their base alone)."""
    slots = [c.request.adapter_slot for c in chunks]
    if not any(slots):
        return None
    if lengths is None:
        return mx.array(slots, mx.uint32)
    return mx.array(np.repeat(np.array(slots, np.uint32), lengths))


def _listed_write_rows(
    tables: list[list[int]], positions: list[int], block_size: int, kv_head_counts: set[int]
) -> dict[int, mx.array]:
    """``_write_rows`` for one row per table, from lists."""
    places = [(t[p // block_size], p % block_size) for t, p in zip(tables, positions)]
    return {
        hkv: mx.array(
            [_page_row(b, h, hkv, o, block_size) for b, o in places for h in range(hkv)],
            mx.int32,
        )
        for hkv in kv_head_counts
    }


def _page_row(block: Any, head: Any, num_kv_heads: int, offset: Any, block_size: int) -> Any:
    """The flat page row of a token's K/V for one KV head (ints or numpy arrays): a block
    keeps each of its heads' ``block_size`` rows together (stores/pages.py's page layout)."""
    return (block * num_kv_heads + head) * block_size + offset


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
        rows = _page_row(
            blocks[:, None], np.arange(hkv)[None, :], hkv, offsets[:, None], block_size
        )
        write_rows[hkv] = mx.array(rows.reshape(-1).astype(np.int32))
    return write_rows


def _sample_rows(cu: np.ndarray, samples: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """The rows whose logits are sampled: each sampling chunk's last, and a speculating
    chunk's last ``1 + num_drafts`` (its last known token and every draft: verify.py)."""
    last = cu[1:][samples] - 1
    counts = drafts[samples] + 1
    if not drafts.any():
        return last
    ends = np.repeat(last, counts)
    back = np.repeat(np.cumsum(counts) - counts, counts)
    return (ends - (counts - 1).repeat(counts) + (np.arange(int(counts.sum())) - back)).astype(
        np.int32
    )


def _known_tokens(plan: StepPlan) -> tuple[np.ndarray, list[int]]:
    """Every row's input token in row order (0 where it is pending), and the chunks whose last
    token is pending (only a decode's single token can be)."""
    flat: list[int] = []
    pending: list[int] = []
    for i, c in enumerate(plan.chunks):
        end = c.start + c.num_tokens - c.num_drafts
        known = c.request.token_slice(c.start, end)
        flat += known
        if c.num_drafts:
            flat += c.request.drafts[: c.num_drafts]
        elif len(known) < c.num_tokens:
            flat.append(0)
            pending.append(i)
    return np.array(flat, dtype=np.int32), pending


def _padded(block_tables: list[list[int]]) -> list[list[int]]:
    """``table_array`` as lists."""
    width = table_width(max(map(len, block_tables)))
    return [table + [0] * (width - len(table)) for table in block_tables]
