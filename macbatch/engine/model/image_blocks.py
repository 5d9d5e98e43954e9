"""Image blocks that attend both ways (Gemma 4 with ``use_bidirectional_attention: "vision"``):
each image's rows see every row of their image, later ones included, as mlx-vlm's gemma4 overlays
them on its causal and sliding-window masks (``_apply_blockwise_bidirectional_overlay``).

The attention backends stay causal. Image rows are a one-time prefill, so after a layer's paged
attention the rows of each image block in the step are computed again here, with one dense
attention for all of the step's blocks (each padded to the longest, over its request's keys up to
the block's end; its host arrays built once per step), and overwrite the kernel's rows: a
row at position ``p`` of block ``[start, stop)`` sees the keys its causal mask shows (the last
``window`` of them on a sliding-window layer) and every key of its block, as mlx-vlm's mask
``causal | same_block`` does on both layer types (a KV-shared layer reads its source's pages,
with its own window). Decode and text rows never come here.

A DFlash drafter's blocks (speculative/dflash.py) come here too, built ``from_start``: a sliding
layer's rows all see the window before their block's first row, as mlx-vlm's drafter cuts its
context to ``sliding_window - 1`` positions before the block, and every row of the block.

The scheduler keeps a block whole in one prefill chunk and the prefix cache never resumes inside
one (``PromptImages.chunk_tokens``, ``can_resume_at``), so every key of a block is written in the
step that computes its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.arithmetic import ceil_div
from macbatch.metal import LayerParams, Pages
from macbatch.metal.reference import masked_attention


def runs(positions: np.ndarray) -> np.ndarray:
    """``[K, 2]``: the ``[start, stop)`` of each run of consecutive ``positions`` (ascending),
    one per image (mlx-vlm's blocks: maximal runs of image rows)."""
    if not positions.size:
        return np.zeros((0, 2), dtype=np.int64)
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = positions[np.concatenate([[0], breaks])]
    stops = positions[np.concatenate([breaks - 1, [positions.size - 1]])] + 1
    return np.stack([starts, stops], axis=1).astype(np.int64)


@dataclass(frozen=True)
class StepBlock:
    """One image block in a step: its sequence (row of the step's block tables), its packed
    rows ``[row, row + stop - start)`` and its positions ``[start, stop)``."""

    seq: int
    row: int
    start: int
    stop: int


class StepBlocks:
    """A step's image blocks, and per (window, block size) the arrays one batched dense
    attention over all of them needs, built on the host once per step (not per layer).
    ``from_start``: a sliding layer's window ends at each block's first row for all its rows
    (DFlash's blocks), not at each row."""

    def __init__(self, blocks: list[StepBlock], from_start: bool = False) -> None:
        self.blocks = blocks
        self.from_start = from_start
        self._plans: dict[tuple[int | None, int], _Plan] = {}

    def plan(self, window: int | None, block_size: int) -> _Plan:
        key = (window, block_size)
        if key not in self._plans:
            self._plans[key] = _Plan.build(self.blocks, window, block_size, self.from_start)
        return self._plans[key]


@dataclass(frozen=True)
class _Plan:
    """Every block padded to the longest: its query rows (``queries [B, L]``, a padding row
    repeats the block's first), the table columns of its keys (``columns [B, C]``, from the
    window's start to the block's end; padding reads column 0, masked), which keys each row sees
    (``seen [B, L, C * block_size]``), and where the real rows go (``take`` of the flattened
    ``[B * L]`` results, in packed ``rows``)."""

    seqs: mx.array
    queries: mx.array
    columns: mx.array
    seen: mx.array
    take: mx.array
    rows: mx.array

    @classmethod
    def build(
        cls, blocks: list[StepBlock], window: int | None, block_size: int, from_start: bool
    ) -> _Plan:
        length = max(b.stop - b.start for b in blocks)
        firsts = [0 if window is None else max(0, b.start - window + 1) for b in blocks]
        spans = [ceil_div(b.stop, block_size) - f // block_size for b, f in zip(blocks, firsts)]
        width = max(spans)
        queries = np.zeros((len(blocks), length), dtype=np.int32)
        columns = np.zeros((len(blocks), width), dtype=np.int32)
        seen = np.zeros((len(blocks), length, width * block_size), dtype=np.bool_)
        for i, (block, first, span) in enumerate(zip(blocks, firsts, spans)):
            count = block.stop - block.start
            queries[i] = block.row + np.minimum(np.arange(length), count - 1)
            first_column = first // block_size
            columns[i, :span] = np.arange(first_column, first_column + span)
            key = first_column * block_size
            mask = visible(block.start, block.stop, key, window, from_start)
            seen[i, :count, : mask.shape[1]] = mask
            seen[i, count:] = seen[i, 0]  # padding rows: any row's mask, their output is dropped
        take = np.concatenate(
            [i * length + np.arange(b.stop - b.start) for i, b in enumerate(blocks)]
        )
        rows = np.concatenate([np.arange(b.row, b.row + b.stop - b.start) for b in blocks])
        return cls(
            mx.array(np.array([b.seq for b in blocks], dtype=np.int32)),
            mx.array(queries),
            mx.array(columns),
            mx.array(seen),
            mx.array(take.astype(np.int32)),
            mx.array(rows.astype(np.int32)),
        )


def step_blocks(chunks: Sequence[Any]) -> StepBlocks | None:
    """The image blocks of a step's chunks (``StepPlan.chunks``, in packing order), each whole
    in its chunk (None: none)."""
    found = []
    offset = 0
    for seq, chunk in enumerate(chunks):
        images = chunk.request.images
        if images is not None and images.blocks is not None:
            end = chunk.start + chunk.num_tokens
            for start, stop in images.blocks.tolist():
                if chunk.start <= start and stop <= end:
                    found.append(StepBlock(seq, offset + start - chunk.start, start, stop))
                else:  # the scheduler never splits one
                    assert stop <= chunk.start or start >= end, "an image block split by a chunk"
        offset += chunk.num_tokens
    return StepBlocks(found) if found else None


def visible(
    start: int, stop: int, first_key: int, window: int | None, from_start: bool = False
) -> np.ndarray:
    """``[stop - start, stop - first_key]``: which keys from ``first_key`` each row of block
    ``[start, stop)`` sees (mlx-vlm's ``causal (within the window) | same block``; the window
    counted back from the block's first row for every row, ``from_start``)."""
    queries = np.arange(start, stop)[:, None]
    keys = np.arange(first_key, stop)[None, :]
    seen = keys <= queries
    if window is not None:
        seen &= keys > (start if from_start else queries) - window
    return seen | (keys >= start)


def attend_blocks(
    out: mx.array,
    queries: mx.array,
    pages: tuple[Pages, Pages],
    tables: mx.array,
    blocks: StepBlocks,
    layer: LayerParams,
) -> mx.array:
    """``out [N, Hq, D]`` (a layer's paged attention of ``queries [N, Hq, D]``) with every image
    block's rows attended both ways within their block, in one dense attention for the step;
    ``tables``: the layer's group's block tables (a window layer's hold only its window, which
    covers every key read here)."""
    k_pages, v_pages = pages
    plan = blocks.plan(layer.sliding_window, k_pages.shape[2])
    q = queries[plan.queries].transpose(0, 2, 1, 3)  # [B, Hq, L, D]
    ids = tables[plan.seqs[:, None], plan.columns]
    fixed = masked_attention(q, k_pages, v_pages, ids, plan.seen, layer)
    b, hq, length, d = fixed.shape
    flat = fixed.transpose(0, 2, 1, 3).reshape(b * length, hq, d)
    out[plan.rows] = flat[plan.take]
    return out
