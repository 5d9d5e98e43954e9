"""The Metal path's host side of a second source of rows (``LayerParams.rows``, DeepSeek V4's
compressed rows): the latent body reads them in its sparse form only, after each query row's
listed tokens, so a dense first source is listed here, and the rows become the body's inputs and
template. Apart from ``kernels.py`` so the kernel's call stays one short function.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from macbatch.metal.backend import AttentionMetadata, RowSource
from macbatch.metal.quant import QuantizedPages


def every_visible_position(meta: AttentionMetadata, window: int | None) -> mx.array:
    """A dense first source as the sparse form's lists: ``[N, E]``, each query row's visible
    positions (its window, else its context), -1 past them; E the longest such span."""
    cu = meta.host_cu_seqlens_q.astype(np.int64)
    q_lens = cu[1:] - cu[:-1]
    seq_of_row = np.repeat(np.arange(len(q_lens)), q_lens)
    pos = meta.host_seq_lens.astype(np.int64)[seq_of_row] - q_lens[seq_of_row]
    pos += np.arange(len(seq_of_row)) - cu[seq_of_row]
    longest = int(pos.max(initial=0)) + 1
    listed = pos[:, None] - np.arange(min(window, longest) if window else longest)[None]
    return mx.array(np.where(listed >= 0, listed, -1).astype(np.int32))


def row_inputs(
    rows: RowSource | None, dtype: mx.Dtype
) -> tuple[list[mx.array], list[tuple[str, bool | int]]]:
    """The latent body's second-source inputs (row pages, codes when quantized; their scales;
    block table; lists: 1-element placeholders without a second source) and template (ROWS,
    RBS)."""
    template: list[tuple[str, bool | int]] = [
        ("ROWS", rows is not None), ("RBS", 1 if rows is None else rows.rows_per_block),
    ]  # fmt: skip
    if rows is None:
        unused = [mx.zeros((1,), t) for t in (dtype, mx.float16, mx.int32, mx.int32)]
        return unused, template
    pages, table, selected = rows
    lists = [table.astype(mx.int32), selected.astype(mx.int32)]
    if isinstance(pages, QuantizedPages):
        return [pages.codes, pages.scales, *lists], template
    return [pages, mx.zeros((1,), mx.float16), *lists], template
