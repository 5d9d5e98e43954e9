"""Image blocks that attend both ways (Gemma 4 with ``use_bidirectional_attention: "vision"``):
each image's rows see every row of their image, later ones included, as mlx-vlm's gemma4 overlays
them on its causal and sliding-window masks (``_apply_blockwise_bidirectional_overlay``).

The attention backends stay causal. Image rows are a one-time prefill, so after a layer's paged
attention the rows of each image block in the step are computed again here, with a small dense
attention over that request's keys up to the block's end, and overwrite the kernel's rows: a
row at position ``p`` of block ``[start, stop)`` sees the keys its causal mask shows (the last
``window`` of them on a sliding-window layer) and every key of its block, as mlx-vlm's mask
``causal | same_block`` does on both layer types (a KV-shared layer reads its source's pages,
with its own window). Decode and text rows never come here.

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


def step_blocks(chunks: Sequence[Any]) -> list[StepBlock] | None:
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
    return found or None


def visible(start: int, stop: int, first_key: int, window: int | None) -> np.ndarray:
    """``[stop - start, stop - first_key]``: which keys from ``first_key`` each row of block
    ``[start, stop)`` sees (mlx-vlm's ``causal (within the window) | same block``)."""
    queries = np.arange(start, stop)[:, None]
    keys = np.arange(first_key, stop)[None, :]
    seen = keys <= queries
    if window is not None:
        seen &= keys > queries - window
    return seen | (keys >= start)


def attend_blocks(
    out: mx.array,
    queries: mx.array,
    pages: tuple[Pages, Pages],
    tables: mx.array,
    blocks: list[StepBlock],
    layer: LayerParams,
) -> mx.array:
    """``out [N, Hq, D]`` (a layer's paged attention of ``queries [N, Hq, D]``) with every image
    block's rows attended both ways within their block; ``tables``: the layer's group's block
    tables (a window layer's hold only its window, which covers every key read here)."""
    k_pages, v_pages = pages
    block_size = k_pages.shape[2]
    window = layer.sliding_window
    for block in blocks:
        first_key = 0 if window is None else max(0, block.start - window + 1)
        table = tables[block.seq : block.seq + 1, : -(-block.stop // block_size)]
        rows = slice(block.row, block.row + block.stop - block.start)
        seen = visible(block.start, block.stop, first_key, window)
        keys = (first_key, block.stop)
        out[rows] = masked_attention(queries[rows], k_pages, v_pages, table, keys, seen, layer)
    return out
