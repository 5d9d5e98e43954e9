"""Random varlen paged-attention problems for the kernel tests, with poisoned pages (shared by
the kernel tests, the MSL emulator's tests and benchmarks/kernel_bytes.py, hence here).

Every K/V slot that no query row of its sequence may see (past the context, before the sliding
window of every row, blocks nobody owns) holds NaN in the pages given to the kernel, so a kernel
that reads one shows NaN. The reference gets a copy with those slots finite, because it gathers
whole blocks and masks them (and 0 * NaN is NaN).

With ``kv_bits`` set, the pages are quantized by the numpy quantizer (written from the format's
definition) and the poison goes into the scales of the hidden slots; ``k`` and ``v`` then hold the
dequantized values, so the float64 oracle applies exactly the quantization the kernels read.

With ``value_dim`` set the case is MLA's latent pages: the K pages are passed as the V pages too,
and the oracle is handed their leading ``value_dim`` columns as separate value pages.

With ``top_k`` set the case is sparse attention: each query row lists ``top_k`` positions of its
sequence (its own among them, some unused -1 entries, and for prefill rows some later positions
it may not see), and only the slots some row both lists and may see stay unpoisoned, so a kernel
that reads any other slot shows NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from macbatch.metal import AttentionMetadata, LayerParams
from macbatch.metal.backend import RowSource
from macbatch.metal.kernels import MetalKernelBackend, SplitPolicy
from macbatch.metal.quant import QuantizedPages, default_group_size
from tests.support.attention_numpy import dequantize_numpy, paged_attention_numpy, quantize_numpy
from tests.support.msl.emulator import Emulator

TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-2}


@dataclass
class Case:
    """One attention call: ``q_lens[s]`` query rows over ``seq_lens[s]`` keys for sequence s."""

    seq_lens: list[int]
    q_lens: list[int]
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    block_size: int = 16
    dtype: mx.Dtype = mx.float32
    sliding_window: int | None = None
    softcap: float | None = None
    sinks: bool = False
    seed: int = 0
    kv_bits: int | None = None
    group_size: int | None = None
    value_dim: int | None = None  # latent pages: values are the keys' leading columns
    top_k: int | None = None  # sparse attention: entries per row of ``selected``
    # A second source of rows (latent cases): rows per sequence, the row pages' block size and
    # the entries per row of its list
    row_counts: list[int] | None = None
    rows_per_block: int = 4
    row_top_k: int | None = None
    arrays: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        bs, hkv, d = self.block_size, self.num_kv_heads, self.head_dim
        lens = np.array(self.seq_lens, dtype=np.int32)
        cu = np.concatenate([[0], np.cumsum(self.q_lens)]).astype(np.int32)
        blocks_per = -(-lens // bs)
        max_blocks = int(blocks_per.max()) + 1  # a spare column: tables are padded
        num_blocks = int(blocks_per.sum()) + 3  # blocks nobody owns
        tables = np.zeros((len(lens), max_blocks), dtype=np.int32)
        ids = rng.permutation(num_blocks)  # random, non-contiguous
        at = 0
        for s in range(len(lens)):
            tables[s, : blocks_per[s]] = ids[at : at + blocks_per[s]]
            at += blocks_per[s]
        self.tables = tables
        self.lens, self.cu = lens, cu
        self.selected = None
        if self.top_k is not None:
            self.selected = random_selection(lens, self.q_lens, self.top_k, rng)
        visible = np.zeros((num_blocks, bs), dtype=bool)
        for s, t in seen_slots(lens, self.q_lens, self.sliding_window, self.selected):
            visible[tables[s, t // bs], t % bs] = True
        shape = (num_blocks, hkv, bs, d)
        k = rng.standard_normal(shape).astype(np.float32)
        v = rng.standard_normal(shape).astype(np.float32)
        q = rng.standard_normal((int(cu[-1]), self.num_q_heads, d)).astype(np.float32)
        self.q = _rounded(q, self.dtype)  # numpy sees exactly what the kernel sees
        if self.kv_bits is not None:
            self.group_size = self.group_size or default_group_size(d)
        hidden = ~visible[:, None, :, None]
        self.k_pages, self.v_pages = (
            PageSet(x, hidden, self.dtype, self.kv_bits, self.group_size) for x in (k, v)
        )
        self.k, self.v = self.k_pages.values, self.v_pages.values
        self.sink_values = _rounded(2 * rng.standard_normal(self.num_q_heads), self.dtype)
        self.scale = d**-0.5
        self.row_source = None if self.row_top_k is None else RowCase(self, rng)

    def args(
        self,
        poisoned: bool,
        selected: np.ndarray | None = None,
        rows: np.ndarray | None = None,
        poison_rows: bool | None = None,
    ) -> tuple:
        """(q, K pages, V pages, metadata, layer): what a backend is called with; ``selected``
        and ``rows`` replace the case's own selections (of positions, of second-source rows);
        the row pages are poisoned as the token pages are unless ``poison_rows`` says."""
        k, v = self.k_pages.pages(poisoned), self.v_pages.pages(poisoned)
        if self.value_dim is not None:
            v = k  # one latent row per token: the caller passes the key pages as values
        return (
            mx.array(self.q).astype(self.dtype),
            k,
            v,
            AttentionMetadata.build(self.tables, self.lens, self.cu),
            self.layer(selected, rows, poisoned if poison_rows is None else poison_rows),
        )

    def layer(
        self,
        selected: np.ndarray | None = None,
        rows: np.ndarray | None = None,
        poisoned: bool = False,
    ) -> LayerParams:
        selected = self.selected if selected is None else selected
        return LayerParams(
            self.scale,
            self.sliding_window,
            self.softcap,
            mx.array(self.sink_values).astype(self.dtype) if self.sinks else None,
            self.value_dim,
            None if selected is None else mx.array(selected),
            None if self.row_source is None else self.row_source.source(poisoned, rows),
        )

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return (*self.q.shape[:2], self.value_dim or self.head_dim)

    def oracle(
        self, selected: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """The float64 numpy answer (latent values: the keys' leading columns, as pages)."""
        v = self.v if self.value_dim is None else self.k[..., : self.value_dim]
        return paged_attention_numpy(
            self.q, self.k, v, self.tables, self.lens, self.cu, self.scale,
            sliding_window=self.sliding_window, softcap=self.softcap,
            sinks=self.sink_values if self.sinks else None,
            selected=self.selected if selected is None else selected,
            rows=None if self.row_source is None else self.row_source.oracle(rows),
        )  # fmt: skip


class PageSet:
    """One page array as the tests read it: the float64 oracle's values (rounded through the
    dtype, or dequantized: exactly what a kernel reads) and the pages a backend is handed, finite
    or with every ``hidden`` slot poisoned (NaN floats, or NaN scales when quantized)."""

    def __init__(
        self,
        x: np.ndarray,
        hidden: np.ndarray,
        dtype: mx.Dtype,
        bits: int | None,
        group_size: int | None,
    ) -> None:
        self.dtype, self.bits, self.group_size = dtype, bits, group_size
        if bits is None:
            self.values = _rounded(x, dtype)
            poisoned = np.where(hidden, np.nan, self.values).astype(np.float32)
            self.versions: dict[bool, tuple] = {False: (self.values,), True: (poisoned,)}
            return
        assert group_size is not None
        codes, scales = quantize_numpy(x, bits, group_size)
        self.values = dequantize_numpy(codes, scales, bits)
        nan_scales = np.where(hidden[..., None], np.nan, scales).astype(np.float16)
        self.versions = {False: (codes, scales), True: (codes, nan_scales)}

    def pages(self, poisoned: bool) -> mx.array | QuantizedPages:
        if self.bits is None:
            return mx.array(self.versions[poisoned][0]).astype(self.dtype)
        codes, scales = self.versions[poisoned]
        assert self.group_size is not None
        return QuantizedPages(mx.array(codes), mx.array(scales), self.bits, self.group_size)


class RowCase:
    """A latent case's second source of rows: ``row_counts[s]`` rows per sequence in pages of
    ``rows_per_block`` rows under a shuffled block table of their own, and per query row a list
    of ``row_top_k`` entries (distinct rows of its sequence in random order, about a quarter -1,
    none at all for a sequence with no rows). Every slot no row lists is poisoned."""

    def __init__(self, case: Case, rng: np.random.Generator) -> None:
        assert case.row_counts is not None and case.row_top_k is not None
        per_block, top = case.rows_per_block, case.row_top_k
        counts = np.array(case.row_counts)
        blocks_per = -(-counts // per_block)
        num_blocks = int(blocks_per.sum()) + 2  # blocks nobody owns
        self.table = np.zeros((len(counts), int(blocks_per.max()) + 1), dtype=np.int32)
        ids, at = rng.permutation(num_blocks), 0
        for s in range(len(counts)):
            self.table[s, : blocks_per[s]] = ids[at : at + blocks_per[s]]
            at += blocks_per[s]
        rows = query_positions(case.lens, case.q_lens)
        self.selected = np.full((len(rows), top), -1, dtype=np.int32)
        for i, (s, _) in enumerate(rows):
            listed = min(int(counts[s]), top - top // 4)
            self.selected[i, rng.permutation(top)[:listed]] = rng.permutation(counts[s])[:listed]
        self.listed_slots = np.zeros((num_blocks, per_block), dtype=bool)
        for i, (s, _) in enumerate(rows):
            for r in self.selected[i][self.selected[i] >= 0]:
                self.listed_slots[self.table[s, r // per_block], r % per_block] = True
        x = rng.standard_normal((num_blocks, 1, per_block, case.head_dim)).astype(np.float32)
        hidden = ~self.listed_slots[:, None, :, None]
        self.page_set = PageSet(x, hidden, case.dtype, case.kv_bits, case.group_size)
        self.value_dim = case.value_dim

    def source(self, poisoned: bool, selected: np.ndarray | None = None) -> RowSource:
        chosen = self.selected if selected is None else selected
        return RowSource(self.page_set.pages(poisoned), mx.array(self.table), mx.array(chosen))

    def oracle(self, selected: np.ndarray | None = None) -> tuple:
        """What the numpy oracle reads: keys, values (their leading columns), table, lists."""
        keys = self.page_set.values
        chosen = self.selected if selected is None else selected
        return keys, keys[..., : self.value_dim], self.table, chosen


def query_positions(seq_lens: np.ndarray, q_lens: list[int]) -> list[tuple[int, int]]:
    """(sequence, position) of every packed query row, in row order."""
    return [
        (s, int(n) - q_len + i)
        for s, (n, q_len) in enumerate(zip(seq_lens, q_lens, strict=True))
        for i in range(q_len)
    ]


def random_selection(
    seq_lens: np.ndarray, q_lens: list[int], top_k: int, rng: np.random.Generator
) -> np.ndarray:
    """``[N, top_k]`` distinct positions per row, in random order: the row's own, others of its
    sequence (later ones too, which it may not see), and about an eighth -1."""
    rows = query_positions(seq_lens, q_lens)
    selected = np.full((len(rows), top_k), -1, dtype=np.int32)
    for i, (s, pos) in enumerate(rows):
        listed = min(int(seq_lens[s]), top_k - top_k // 8)
        picked = rng.permutation(int(seq_lens[s]))[:listed]
        if pos not in picked:
            picked[0] = pos
        selected[i, rng.permutation(top_k)[:listed]] = picked
    return selected


def seen_slots(
    seq_lens: np.ndarray, q_lens: list[int], window: int | None, selected: np.ndarray | None
) -> set[tuple[int, int]]:
    """(sequence, position) of every key some query row may see (and lists, when sparse)."""
    seen = set()
    for i, (s, pos) in enumerate(query_positions(seq_lens, q_lens)):
        lo = 0 if window is None else max(0, pos - window + 1)
        listed = range(lo, pos + 1) if selected is None else selected[i]
        seen |= {(s, int(t)) for t in listed if lo <= t <= pos}
    return seen


def _rounded(x: np.ndarray, dtype: mx.Dtype) -> np.ndarray:
    return np.array(mx.array(x).astype(dtype).astype(mx.float32))


def emulated_attention(
    emulator: Emulator | None = None, split: SplitPolicy | None = None
) -> MetalKernelBackend:
    """The Metal kernel backend with the kernel run by the MSL emulator."""
    factory = (emulator or Emulator()).metal_kernel
    return MetalKernelBackend(factory) if split is None else MetalKernelBackend(factory, split)


def relative_error(got: mx.array | np.ndarray, want: np.ndarray) -> float:
    """Max error relative to the magnitude of each output row (token, head); NaN -> inf."""
    got = np.array(mx.array(got).astype(mx.float32)) if isinstance(got, mx.array) else got
    scale = np.maximum(np.abs(want).max(axis=-1, keepdims=True), 1e-6)
    err = np.abs(got.astype(np.float64) - want) / scale
    return float("inf") if np.isnan(err).any() else float(err.max(initial=0.0))
