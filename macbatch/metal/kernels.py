"""The Metal paged-attention kernel: one factory, the host-side work list, the split-KV merge.

``paged_attention_kernel`` implements the attention contract of ``reference.py`` with ONE kernel
dispatch per call (plus a small MLX merge when long decode contexts were split);
`MetalKernelBackend` is its entry in the backend registry. The kernel body lives in
``paged_attention.metal`` (its header comment explains the work decomposition), helpers in
``paged_attention.h``; latent pages (MLA, ``LayerParams.value_dim``) have their own body,
``paged_attention_latent.metal``, on the same work list, splits and merge (and reads a second
source of rows, ``row_inputs.py``). ``metal_kernel`` is the constructor of the kernel object:
MLX's ``mx.fast.metal_kernel`` on a Mac, the test suite's MSL emulator on Linux (same
signature).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

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
from macbatch.metal.quant import QuantizedPages
from macbatch.metal.row_inputs import every_visible_position, row_inputs

HERE = Path(__file__).resolve().parent
INPUT_NAMES = [
    "q", "k_pages", "v_pages", "block_tables", "seq_lens", "cu_seqlens_q", "work", "params_i",
    "params_f", "sinks", "k_scales", "v_scales", "selected",
]  # fmt: skip
# Latent pages: the key pages are the values too, so no V pages or V scales; a second source
# of rows (LayerParams.rows) has its pages, scales, block table and lists.
LATENT_INPUT_NAMES = [n for n in INPUT_NAMES if n not in ("v_pages", "v_scales")] + [
    "row_pages", "row_scales", "row_table", "row_selected",
]  # fmt: skip
OUTPUT_NAMES = ["out", "part_ml", "part_acc"]
SUPPORTED_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
MAX_HEAD_DIM = 256
MAX_LATENT_DIM = 1024  # 32 columns per lane in registers, per query vector
THREADGROUP_FLOATS = 2048  # K (and V) chunk budget in threadgroup memory: 8 KiB each
LATENT_CHUNK_FLOATS = 6144  # one chunk of latent rows (K and V at once): 24 KiB, 8 rows of 576

MetalKernelFactory = Callable[..., Callable[..., list[mx.array]]]


@dataclass(frozen=True)
class SplitPolicy:
    """When to split a decode row's context across threadgroups (two-pass, log-sum-exp merge).

    Splitting pays when there are fewer work items than the GPU has room for: items below
    ``target_threadgroups`` are split into shares of at least ``min_keys`` keys each.
    """

    target_threadgroups: int = 128
    min_keys: int = 512
    max_splits: int = 16


@dataclass(frozen=True)
class Tiling:
    """Compile-time shape of the kernel for one call."""

    num_simdgroups: int
    qvs_per_simdgroup: int
    chunk_keys: int

    @property
    def tile(self) -> int:
        return self.num_simdgroups * self.qvs_per_simdgroup


@dataclass(frozen=True)
class Plan:
    """Host-side description of one dispatch: the work list and how to merge split parts."""

    tiling: Tiling
    work: np.ndarray  # int32 [W, 5]: seq, kv_head, qv_start, qv_count, part (-1: not split)
    num_splits: int
    split_groups: int  # work items that were split (each into num_splits parts)
    merge_dest: np.ndarray  # int64 [K]: flat output row (token * Hq + head) of each merged qv
    merge_src: np.ndarray  # int64 [K]: split group * tile + qv of each merged qv
    merge_head: np.ndarray  # int64 [K]: query head of each merged qv (for sinks)


def choose_tiling(head_dim: int, block_size: int, group: int, max_q_len: int) -> Tiling:
    """Tile of query vectors per threadgroup and K/V chunk size, within 32 KiB of threadgroup
    memory: q tile (tile x D floats) + K and V chunks (2 x chunk x D floats) + scores."""
    cap = 16 if head_dim <= 128 else 8
    tile = max(1, min(cap, group * max_q_len))
    nsg = min(4, tile)
    qps = ceil_div(tile, nsg)
    chunk = min(block_size, 32, 1 << int(math.log2(THREADGROUP_FLOATS // head_dim)))
    return Tiling(nsg, qps, chunk)


def choose_latent_tiling(head_dim: int, block_size: int, group: int, max_q_len: int) -> Tiling:
    """The latent kernel's tile: up to 8 SIMD-groups of 2 query vectors each (their queries and
    accumulators live in registers, so threadgroup memory holds only the chunk of rows), 16
    query heads sharing every row read; a chunk of up to 8 rows."""
    tile = max(1, min(16, group * max_q_len))
    nsg = min(8, tile)
    chunk = min(block_size, 8, 1 << int(math.log2(LATENT_CHUNK_FLOATS // head_dim)))
    return Tiling(nsg, ceil_div(tile, nsg), chunk)


def plan(
    seq_lens: np.ndarray,
    cu_seqlens_q: np.ndarray,
    num_q_heads: int,
    num_kv_heads: int,
    tiling: Tiling,
    split: SplitPolicy,
    top_k: int = 0,
) -> Plan:
    """One work item per (sequence, KV head, query tile), decode items split when worthwhile.

    Sparse attention (``top_k`` entries per row of ``selected``): a tile never spans two rows
    (their selections differ), and a decode row visits at most ``top_k`` keys.
    """
    group = num_q_heads // num_kv_heads
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).astype(np.int64)
    tile = tiling.tile
    # Tiles cut the query vectors of each unit: a whole sequence, or (sparse) each row.
    unit_qvs = np.full_like(q_lens, group) if top_k else q_lens * group
    tiles_per_unit = ceil_div(unit_qvs, tile)
    tiles = tiles_per_unit * (q_lens if top_k else 1)
    seq_of = np.repeat(np.arange(len(q_lens)), tiles)
    tile_idx = np.arange(len(seq_of)) - np.repeat(np.cumsum(tiles) - tiles, tiles)
    unit, slice_idx = np.divmod(tile_idx, tiles_per_unit[seq_of])
    qv_start = unit * unit_qvs[seq_of] + slice_idx * tile
    qv_count = np.minimum(tile, unit_qvs[seq_of] - slice_idx * tile)
    heads = np.arange(num_kv_heads)
    n = len(seq_of)
    work = np.stack(
        [
            np.repeat(seq_of, num_kv_heads),
            np.tile(heads, n),
            np.repeat(qv_start, num_kv_heads),
            np.repeat(qv_count, num_kv_heads),
            np.full(n * num_kv_heads, -1),
        ],
        axis=1,
    )

    ctx = seq_lens.astype(np.int64)[work[:, 0]]
    if top_k:
        ctx = np.minimum(ctx, top_k)
    splittable = (q_lens[work[:, 0]] == 1) & (ctx >= 2 * split.min_keys)
    num_splits = 1
    if splittable.any() and len(work) < split.target_threadgroups:
        num_splits = min(
            split.max_splits,
            ceil_div(split.target_threadgroups, len(work)),
            int(ctx[splittable].max()) // split.min_keys,
        )
    if num_splits < 2:
        empty = np.zeros(0, np.int64)
        return Plan(tiling, work.astype(np.int32), 1, 0, empty, empty, empty)

    split_items = work[splittable]
    parts = np.repeat(split_items, num_splits, axis=0)
    parts[:, 4] = np.arange(len(parts))
    work = np.concatenate([work[~splittable], parts]).astype(np.int32)
    # Every qv of every split item, for the merge.
    g_idx = np.repeat(np.arange(len(split_items)), split_items[:, 3])
    v_idx = np.arange(len(g_idx)) - np.repeat(np.cumsum(split_items[:, 3]) - split_items[:, 3],
                                               split_items[:, 3])  # fmt: skip
    flat = split_items[g_idx, 2] + v_idx
    head = split_items[g_idx, 1] * group + flat % group
    token = cu_seqlens_q[split_items[g_idx, 0]].astype(np.int64) + flat // group
    return Plan(
        tiling, work, num_splits, len(split_items), token * num_q_heads + head,
        g_idx * tile + v_idx, head,
    )  # fmt: skip


def _source(name: str) -> str:
    return (HERE / name).read_text()


@functools.lru_cache(maxsize=8)
def make_kernel(
    metal_kernel: MetalKernelFactory, latent: bool = False
) -> Callable[..., list[mx.array]]:
    """The single factory of the paged-attention kernel objects (latent pages: their own)."""
    return metal_kernel(
        name="macbatch_paged_attention_latent" if latent else "macbatch_paged_attention",
        input_names=LATENT_INPUT_NAMES if latent else INPUT_NAMES,
        output_names=OUTPUT_NAMES,
        source=_source("paged_attention_latent.metal" if latent else "paged_attention.metal"),
        header=_source("paged_attention.h"),
    )


def _default_factory() -> MetalKernelFactory:
    # mlx's stub types the kernel object it makes as `object`; it is called as below.
    return cast(MetalKernelFactory, mx.fast.metal_kernel)


def check_shapes(q: mx.array, k_pages: Pages, v_pages: Pages, value_dim: int | None) -> None:
    """Clear errors for inputs the kernel does not handle (the reference handles them)."""
    if q.ndim != 3 or k_pages.ndim != 4 or v_pages.shape != k_pages.shape:
        raise ValueError(
            f"paged_attention: expected q [N, Hq, D] and K/V pages [blocks, Hkv, block, D] of one "
            f"shape, got q {tuple(q.shape)}, k {tuple(k_pages.shape)}, v {tuple(v_pages.shape)}"
        )
    hq, d = q.shape[1], q.shape[2]
    hkv = k_pages.shape[1]
    most = MAX_HEAD_DIM if value_dim is None else MAX_LATENT_DIM
    if d != k_pages.shape[3] or d > most or hq % hkv:
        raise ValueError(
            f"paged_attention: head dim {d} (K/V {k_pages.shape[3]}, at most {most}) "
            f"and {hq} query heads over {hkv} KV heads (must divide) are not supported"
        )
    if value_dim is not None and not 0 < value_dim <= d:
        raise ValueError(
            f"paged_attention: latent values are the leading columns of the {d}-wide rows, "
            f"got value_dim {value_dim}"
        )
    if isinstance(k_pages, QuantizedPages) != isinstance(v_pages, QuantizedPages):
        raise ValueError("paged_attention: K and V pages must both be quantized, or neither")
    page_dtype = q.dtype if isinstance(k_pages, QuantizedPages) else k_pages.dtype
    if q.dtype not in SUPPORTED_DTYPES or page_dtype != q.dtype:
        raise ValueError(
            f"paged_attention: q {q.dtype} and float K/V pages {page_dtype} must be one of "
            "float16, bfloat16, float32"
        )


def check_selected(selected: mx.array, num_rows: int) -> int:
    """The number of entries per row of a sparse call's ``selected``, after checking its
    shape."""
    if selected.ndim != 2 or selected.shape[0] != num_rows or selected.shape[1] == 0:
        raise ValueError(
            f"paged_attention: selected must be [N, K] with N = {num_rows} query rows and K > 0, "
            f"got {tuple(selected.shape)}"
        )
    return int(selected.shape[1])


@dataclass(frozen=True)
class MetalKernelBackend(AttentionBackend):
    """The Metal kernel as a registry entry; ``metal_kernel`` None means MLX's own
    ``mx.fast.metal_kernel`` (the tests pass the MSL emulator's)."""

    name = "metal"
    label = "Metal kernel"
    metal_kernel: MetalKernelFactory | None = None
    split: SplitPolicy = SplitPolicy()

    def available(self) -> str | None:
        return None if mx.metal.is_available() else "no Metal"

    def prepare(self) -> None:
        make_kernel(self.metal_kernel or _default_factory())

    def __call__(
        self, q: mx.array, k: Pages, v: Pages, meta: AttentionMetadata, layer: LayerParams, /
    ) -> mx.array:
        return paged_attention_kernel(
            q, k, v, meta, layer, metal_kernel=self.metal_kernel, split=self.split
        )


def paged_attention_kernel(
    q: mx.array,
    k_pages: Pages,
    v_pages: Pages,
    meta: AttentionMetadata,
    layer: LayerParams,
    *,
    metal_kernel: MetalKernelFactory | None = None,
    split: SplitPolicy = SplitPolicy(),
) -> mx.array:
    """The attention contract of ``reference.py``, computed by the Metal kernel; latent pages
    (``layer.value_dim``) by its latent body, which reads only ``k_pages``; sparse attention
    (``layer.selected``) by either body's SPARSE form, which reads only the listed rows; a second
    source of rows (``layer.rows``) by the latent body's sparse form with ROWS, after each query
    row's tokens (a dense first source listed on the host, ``row_inputs.py``)."""
    scale, sliding_window, softcap, sinks, value_dim, selected, rows = layer
    latent = value_dim is not None
    check_shapes(q, k_pages, v_pages, value_dim)
    n, hq, d = q.shape
    dv = value_dim or d
    hkv, bs = k_pages.shape[1], k_pages.shape[2]
    row_top_k = 0 if rows is None else check_row_source(q, k_pages, meta, layer)
    if rows is not None and selected is None:  # the body reads rows in its sparse form only
        selected = every_visible_position(meta, sliding_window)
    top_k = 0 if selected is None else check_selected(selected, n)
    q_lens = meta.host_cu_seqlens_q[1:] - meta.host_cu_seqlens_q[:-1]
    tiling = (choose_latent_tiling if latent else choose_tiling)(
        d, bs, hq // hkv, 1 if top_k else int(q_lens.max(initial=1))
    )
    # The tokens' entries, padded to whole chunks when the rows' follow (the body's split_at).
    tk = tiling.chunk_keys
    entries = ceil_div(top_k, tk) * tk + row_top_k if row_top_k else top_k
    p = plan(meta.host_seq_lens, meta.host_cu_seqlens_q, hq, hkv, tiling, split, entries)
    window = int(sliding_window) if sliding_window else 0
    row_blocks = 0 if rows is None else rows.block_table.shape[1]
    params_i = mx.array(
        [hq, hkv, meta.block_tables.shape[1], window, p.num_splits, top_k, row_top_k, row_blocks],
        dtype=mx.int32,
    )
    listed = mx.zeros((1,), mx.int32) if selected is None else selected.astype(mx.int32)
    params_f = mx.array([scale, softcap or 0.0], dtype=mx.float32)
    sink_arr = sinks.astype(mx.float32) if sinks is not None else mx.zeros((1,), mx.float32)
    bits, group = 0, d  # float pages; the scales inputs are 1-element placeholders
    k_scales = v_scales = mx.zeros((1,), mx.float16)
    if isinstance(k_pages, QuantizedPages) and isinstance(v_pages, QuantizedPages):
        bits, group = k_pages.bits, k_pages.group_size
        k_scales, v_scales = k_pages.scales, v_pages.scales
        k_pages, v_pages = k_pages.codes, v_pages.codes
    pages = [k_pages] if latent else [k_pages, v_pages]
    scales = [k_scales] if latent else [k_scales, v_scales]
    widths = [("D", d), ("DV", dv)] if latent else [("D", d)]
    second, rows_template = row_inputs(rows, q.dtype) if latent else ([], [])
    slots = max(1, p.split_groups * p.num_splits)
    out, part_ml, part_acc = make_kernel(metal_kernel or _default_factory(), latent)(
        inputs=[
            q, *pages, meta.block_tables, meta.seq_lens, meta.cu_seqlens_q, mx.array(p.work),
            params_i, params_f, sink_arr, *scales, listed, *second,
        ],
        output_shapes=[(n, hq, dv), (slots, tiling.tile, 2), (slots, tiling.tile, dv)],
        output_dtypes=[q.dtype, mx.float32, mx.float32],
        grid=(len(p.work) * tiling.num_simdgroups * 32, 1, 1),
        threadgroup=(tiling.num_simdgroups * 32, 1, 1),
        template=[
            ("T", q.dtype), *widths, ("BS", bs), ("TK", tiling.chunk_keys),
            ("NSG", tiling.num_simdgroups), ("QPS", tiling.qvs_per_simdgroup),
            ("SOFTCAP", softcap is not None), ("SINKS", sinks is not None), ("BITS", bits),
            ("GS", group), ("SPARSE", top_k > 0), *rows_template,
        ],
    )  # fmt: skip
    if p.split_groups == 0:
        return out
    return _merge_splits(out, part_ml, part_acc, p, sink_arr if sinks is not None else None)


def _merge_splits(
    out: mx.array, part_ml: mx.array, part_acc: mx.array, p: Plan, sinks: mx.array | None
) -> mx.array:
    """Second pass: log-sum-exp merge of the split parts (base 2), sinks in the denominator."""
    n, hq, d = out.shape
    tile = p.tiling.tile
    ml = part_ml.reshape(p.split_groups, p.num_splits, tile, 2)
    m, lsum = ml[..., 0], ml[..., 1]
    acc = part_acc.reshape(p.split_groups, p.num_splits, tile, d)
    src = mx.array(p.merge_src)
    m = m.transpose(0, 2, 1).reshape(-1, p.num_splits)[src]  # [K, splits]
    lsum = lsum.transpose(0, 2, 1).reshape(-1, p.num_splits)[src]
    acc = acc.transpose(0, 2, 1, 3).reshape(-1, p.num_splits, d)[src]  # [K, splits, D]
    m_all = m.max(axis=1, keepdims=True)
    if sinks is not None:
        sink = (sinks[mx.array(p.merge_head)] * math.log2(math.e))[:, None]
        m_all = mx.maximum(m_all, sink)
    weight = _exp2(m - m_all)
    total = (lsum * weight).sum(axis=1)
    if sinks is not None:
        total = total + _exp2(sink - m_all)[:, 0]
    merged = (acc * weight[..., None]).sum(axis=1) / total[:, None]
    flat = out.reshape(n * hq, d)
    flat[mx.array(p.merge_dest)] = merged.astype(out.dtype)
    return flat.reshape(n, hq, d)


def _exp2(x: mx.array) -> mx.array:
    return mx.exp(x * math.log(2.0))
