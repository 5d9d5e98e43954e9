"""The start-up self-test: a kernel serves on this machine only after matching the reference here.

A kernel that compiles on one machine can miscompile, or fail to build, on another (another
Metal compiler, another C++ toolchain), so the registry runs this once per backend before
trusting it. It covers what a step can mix: decode rows and prefill chunks, each page dtype,
8-bit and 4-bit pages, with and without sliding window, softcap and sinks, latent (MLA) pages,
sparse attention (each row attending to a short list of its sequence's positions) and, on latent
pages, a second source of rows (DeepSeek V4's compressed rows, read in the same softmax), so a
backend that reads any of them wrong is never selected.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from macbatch.metal.backend import (
    AttentionBackend,
    AttentionMetadata,
    LayerParams,
    Pages,
    RowSource,
)
from macbatch.metal.quant import QuantizedPages, quantize
from macbatch.metal.reference import paged_attention_reference

# (query dtype, tolerance against the reference, page bits: None for float pages)
_FORMATS = [
    (mx.float32, 1e-4, None),
    (mx.float16, 5e-3, None),
    (mx.bfloat16, 3e-2, None),
    (mx.float32, 1e-4, 8),
    (mx.float32, 1e-4, 4),
]
# (query heads, KV heads, head dim, value dim): grouped heads, and latent pages (one KV head
# whose rows' leading columns are the values, MLA's, narrower than a real 576/512 to stay quick)
_SHAPES = [(4, 2, 64, None), (16, 1, 96, 64)]
_BLOCKS, _BLOCK_SIZE = 24, 16
_TOP_K = 8  # sparse attention: entries per row, fewer than most rows may see
# The second source: rows per sequence (one sequence has none), pages of 4 rows, 5 entries a row
_ROW_COUNTS, _ROWS_PER_BLOCK, _ROW_TOP_K = (10, 5, 0, 8), 4, 5


def selftest(backend: AttentionBackend, seed: int = 0) -> tuple[bool, str]:
    """Compare ``backend`` with the reference on a small random mixed batch in each format, for
    grouped heads and for latent (MLA) pages.

    Returns (passed, reason). Any exception (a compile error) counts as a failure.
    """
    rng = np.random.default_rng(seed)
    q_lens = np.array([1, 9, 1, 3])
    lens = np.array([40, 20, 1, 35], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    tables = rng.permutation(_BLOCKS)[:12].reshape(4, 3).astype(np.int32)
    meta = AttentionMetadata.build(tables, lens, cu)
    selected = _selection(lens, q_lens, rng)
    for dtype, tol, bits in _FORMATS:
        for shape in _SHAPES:
            hq, hkv, d, value_dim = shape
            q = mx.array(rng.standard_normal((int(cu[-1]), hq, d)), dtype=dtype)
            page_shape = (_BLOCKS, hkv, _BLOCK_SIZE, d)
            kv = [mx.array(rng.standard_normal(page_shape), dtype=dtype) for _ in range(2)]
            k, v = _pages(kv, bits)
            rows = _row_source(d, dtype, bits, q_lens, rng) if value_dim else None
            for options, layer in _layers(shape, selected, rows, rng).items():
                failure = _compare(backend, (q, k, k if value_dim else v, meta, layer), tol)
                if failure:
                    pages = f"{bits}-bit pages" if bits else f"{dtype} pages"
                    return False, f"{pages} {options}: {failure}"
    return True, ""


def _layers(
    shape: tuple[int, int, int, int | None],
    selected: mx.array,
    rows: RowSource | None,
    rng: np.random.Generator,
) -> dict:
    """The layer options each shape is tested with, by name: latent layers (MLA) need no
    window, softcap or sinks, and take the second source of rows."""
    hq, _, d, value_dim = shape
    if value_dim is not None:
        latent = f"latent {d}/{value_dim}"
        sparse = LayerParams(d**-0.5, value_dim=value_dim, selected=selected)
        return {
            latent: LayerParams(d**-0.5, value_dim=value_dim),
            f"{latent} sparse": sparse,
            f"{latent} sparse+rows": sparse._replace(rows=rows),
        }
    sinks = mx.array(rng.standard_normal(hq), dtype=mx.float32)
    return {
        "plain": LayerParams(d**-0.5),
        "sliding_window+softcap+sinks": LayerParams(d**-0.5, 8, 20.0, sinks),
        "sparse+sliding_window": LayerParams(d**-0.5, 24, selected=selected),
    }


def _selection(lens: np.ndarray, q_lens: np.ndarray, rng: np.random.Generator) -> mx.array:
    """``[N, _TOP_K]`` distinct positions of each row's sequence, its own among them (a prefill
    row's list holds later ones too, which it may not see), -1 where the sequence is short."""
    rows = []
    for ctx, q_len in zip(lens, q_lens, strict=True):
        for pos in range(int(ctx - q_len), int(ctx)):
            picked = rng.permutation(int(ctx))[:_TOP_K]
            if pos not in picked:
                picked[0] = pos
            rows.append(np.pad(picked, (0, _TOP_K - len(picked)), constant_values=-1))
    return mx.array(np.array(rows, dtype=np.int32))


def _row_source(
    d: int, dtype: mx.Dtype, bits: int | None, q_lens: np.ndarray, rng: np.random.Generator
) -> RowSource:
    """A second source in the pages' format: each sequence's rows under a shuffled table of
    its own, each query row listing up to ``_ROW_TOP_K`` distinct ones (-1 past them)."""
    per_seq = -(-max(_ROW_COUNTS) // _ROWS_PER_BLOCK)
    blocks = len(_ROW_COUNTS) * per_seq
    table = rng.permutation(blocks).reshape(len(_ROW_COUNTS), per_seq).astype(np.int32)
    lists = np.full((int(q_lens.sum()), _ROW_TOP_K), -1, dtype=np.int32)
    for i, count in enumerate(np.repeat(_ROW_COUNTS, q_lens)):
        picked = rng.permutation(int(count))[:_ROW_TOP_K]
        lists[i, : len(picked)] = picked
    x = mx.array(rng.standard_normal((blocks, 1, _ROWS_PER_BLOCK, d)), dtype=dtype)
    return RowSource(_pages([x], bits)[0], mx.array(table), mx.array(lists))


def _compare(backend: AttentionBackend, args: tuple, tol: float) -> str | None:
    """Why ``backend`` disagrees with the reference on ``args``, or None when it agrees."""
    want = paged_attention_reference(*args).astype(mx.float32)
    try:
        got = backend(*args).astype(mx.float32)
        mx.eval(got)
    except Exception as exc:  # a compile or launch error: fall back, never crash
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    if got.shape != want.shape:
        return f"output shape {tuple(got.shape)}, not {tuple(want.shape)}"
    err = float(np.array(mx.max(mx.abs(got - want))))
    return None if err <= tol else f"max error {err:.3g} > {tol}"  # NaN fails too


def _pages(kv: list[mx.array], bits: int | None) -> list[Pages]:
    """K and V pages as they are, or quantized to ``bits`` in groups of 32."""
    if bits is None:
        return list(kv)
    return [QuantizedPages(*quantize(x, bits, 32), bits, 32) for x in kv]
