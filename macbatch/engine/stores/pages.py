"""The paged KV cache: a pool of fixed-size blocks shared by all requests.

Layout: per layer, one K and one V array stored flat as ``[num_blocks * Hkv * block_size, D]``
and read as ``[num_blocks, Hkv, block_size, D]`` (a free reshape): one KV head's block is
contiguous, which is what the Metal kernel and the reference in ``macbatch.metal`` expect. A token
at position p of a request lives in block ``block_ids[p // block_size]`` at offset
``p % block_size``; its flat row for head h is ``(block * Hkv + h) * block_size + offset``.

Latent pages (MLA layers, ``LayerShape.value_dim`` set): one "KV head" whose row is the token's
compressed latent then its shared RoPE key, and no value array: the values are the row's leading
``value_dim`` columns (``macbatch.metal.LayerParams.value_dim``), so the latent is stored once.

Quantized pages (``EngineConfig.kv_bits`` 8 or 4): the same rows hold uint8 codes, and a float16
scales array per layer and per K/V holds each row's (scale, bias) per head-dim group, indexed by
the same flat row; see `KVStore` and ``macbatch/metal/quant.py`` for the format and why the
scales are per token row.

Writes are MLX scatters into the flat arrays. The engine replaces each array with the scatter's
result and evaluates all of them in the step's single ``mx.eval``, so nothing else holds the old
buffer and MLX donates it: the pool is updated in place, never copied.

"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from macbatch.engine.stores import fp8_keys
from macbatch.engine.stores.fp8_keys import Fp8Pages
from macbatch.metal import quant
from macbatch.metal.quant import QuantizedPages

if TYPE_CHECKING:
    from macbatch.engine.config import EngineConfig


@dataclass(frozen=True)
class LayerShape:
    num_kv_heads: int
    head_dim: int
    # latent pages (MLA): the values are the leading ``value_dim`` columns of the key rows, and
    # the layer keeps no value pages (0: key rows whose values no attention reads, a lightning
    # indexer's keys, kv/indexer_keys.py); None: K and V pages of ``head_dim`` each
    value_dim: int | None = None

    @property
    def arrays(self) -> int:
        """Page arrays per token row: K and V, or the latent row alone."""
        return 1 if self.value_dim is not None else 2

    @property
    def indexer_keys(self) -> bool:
        """A lightning indexer's key rows (no values)."""
        return self.value_dim == 0


@dataclass(frozen=True)
class PageFormat:
    """How K/V pages are stored: in the model's float dtype, or quantized to ``bits``.

    ``group_size`` None picks the default per head dim (``macbatch.metal.quant``).
    ``indexer_keys`` "fp8": a lightning indexer's key layers in fp8 (``fp8_keys.py``) whatever
    the other layers' format; None: as the other layers.
    """

    dtype: mx.Dtype
    bits: int | None = None
    group_size: int | None = None
    indexer_keys: str | None = None

    @classmethod
    def of(cls, dtype: mx.Dtype, config: EngineConfig) -> PageFormat:
        """The pages an engine's config asks for, for a model whose K/V are ``dtype``."""
        return cls(dtype, config.kv_bits, config.kv_group_size, config.indexer_keys)

    def fp8(self, shape: LayerShape) -> bool:
        """Whether a layer's pages are the indexer keys' fp8 format."""
        return self.indexer_keys == "fp8" and shape.indexer_keys

    def scaled(self, shape: LayerShape) -> bool:
        """Whether a layer's pages keep a scales array beside their codes."""
        return self.bits is not None or self.fp8(shape)

    def group_size_for(self, head_dim: int) -> int:
        assert self.bits is not None
        return quant.group_size_for(head_dim, self.bits, self.group_size)

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one token's K (or V) for one head, scales included."""
        if self.bits is None:
            return head_dim * self.dtype.size
        g = self.group_size_for(head_dim)
        return quant.code_bytes(head_dim, self.bits) + quant.scale_bytes(head_dim, g)

    def layer_row_bytes(self, shape: LayerShape) -> int:
        """Bytes of one token's row of a layer for one head (fp8 indexer keys: codes and
        scales)."""
        if self.fp8(shape):
            return fp8_keys.row_bytes(shape.head_dim)
        return self.row_bytes(shape.head_dim)

    def bytes_per_block(self, shapes: list[LayerShape], block_size: int) -> int:
        """True bytes of one block over all layers, K and V (a latent layer: its one row),
        scales included."""
        return sum(s.arrays * s.num_kv_heads * block_size * self.layer_row_bytes(s) for s in shapes)


class KVStore:
    """The per-layer page arrays.

    Quantized pages (``fmt.bits`` set) keep, per layer and per K/V, a uint8 codes array and a
    float16 scales array ``[rows, D / group_size, 2]`` (scale, bias) with the SAME flat row
    numbering as the codes: a token's scales live beside its codes in the pool, are written by
    the same scatter, freed and shared with the same block, and a kernel finds them through the
    same block table. Nothing else is kept: no float copy of any page.

    ``values`` (and ``value_scales``) hold only the layers with value pages (a latent layer has
    none); ``_value_index[layer]`` is a layer's place there. ``key_scales`` hold only the
    layers with scales (every layer when quantized; fp8 indexer keys': float32
    ``[rows, D / 128]``); ``_scale_index[layer]`` is a layer's place there.
    """

    def __init__(
        self, shapes: list[LayerShape], num_blocks: int, block_size: int, fmt: PageFormat
    ) -> None:
        self.shapes = shapes
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.format = fmt
        valued = [layer for layer, s in enumerate(shapes) if s.value_dim is None]
        self._value_index = {layer: i for i, layer in enumerate(valued)}
        scaled = [layer for layer, s in enumerate(shapes) if fmt.scaled(s)]
        self._scale_index = {layer: i for i, layer in enumerate(scaled)}
        self.keys = [self._zeros(s) for s in shapes]
        self.values = [self._zeros(shapes[layer]) for layer in valued]
        # One scales array per quantized layer; none for float pages.
        quantized = fmt.bits is not None
        self.key_scales = [self._zero_scales(shapes[layer]) for layer in scaled]
        self.value_scales = [self._zero_scales(shapes[i]) for i in valued] if quantized else []
        mx.eval(self.arrays())

    def _rows(self, shape: LayerShape) -> int:
        return self.num_blocks * shape.num_kv_heads * self.block_size

    def _zeros(self, shape: LayerShape) -> mx.array:
        if self.format.fp8(shape):
            return mx.zeros((self._rows(shape), shape.head_dim), dtype=mx.uint8)
        if self.format.bits is None:
            return mx.zeros((self._rows(shape), shape.head_dim), dtype=self.format.dtype)
        width = quant.code_bytes(shape.head_dim, self.format.bits)
        return mx.zeros((self._rows(shape), width), dtype=mx.uint8)

    def _zero_scales(self, shape: LayerShape) -> mx.array:
        if self.format.fp8(shape):
            blocks = shape.head_dim // fp8_keys.block_for(shape.head_dim)
            return mx.zeros((self._rows(shape), blocks), dtype=mx.float32)
        groups = shape.head_dim // self.format.group_size_for(shape.head_dim)
        return mx.zeros((self._rows(shape), groups, 2), dtype=mx.float16)

    @property
    def nbytes(self) -> int:
        """The whole pool's bytes (every layer, K and V or a latent row, scales included)."""
        return sum(a.nbytes for a in self.arrays())

    @property
    def bytes_per_block(self) -> int:
        return self.format.bytes_per_block(self.shapes, self.block_size)

    def resize(self, num_blocks: int, keep: Sequence[int] | None = None) -> None:
        """Hold ``num_blocks`` blocks: the first ones as they are and zeros after them, or, with
        ``keep``, the blocks of those ids renumbered from 0 (the rest are dropped).

        Each array is replaced and evaluated in turn, so at most one array's old copy is alive
        beside the new pool. A step in flight still reads and writes the arrays it was built on;
        the copy waits for it on the stream, so every block it wrote keeps its contents.
        """
        for group, index, shape in self._groups():
            per_block = shape.num_kv_heads * self.block_size
            group[index] = _resized(group[index], per_block, num_blocks, keep)
            mx.eval(group[index])
        self.num_blocks = num_blocks
        mx.clear_cache()  # a Metal buffer cache would keep the old pages' memory

    def write(self, layer: int, rows: mx.array, keys: mx.array, values: mx.array | None) -> None:
        """Scatter one step's K/V (``[N, Hkv, 1, D]``, as the model hands them to its cache;
        a latent layer: its rows as ``keys``, ``values`` None) into the flat rows computed by the
        batcher, quantizing them first when the pages are quantized."""
        shape = self.shapes[layer]
        d = shape.head_dim
        if self.format.fp8(shape):
            fp8_codes, fp8_scales = fp8_keys.quantize(keys.reshape(-1, d))
            self.keys[layer][rows] = fp8_codes
            self.key_scales[self._scale_index[layer]][rows] = fp8_scales
            return
        parts = [(self.keys, self.key_scales, layer, keys)]
        if values is not None:
            index = self._value_index[layer]
            parts.append((self.values, self.value_scales, index, values))
        bits = self.format.bits
        for codes, scales, index, x in parts:
            x = x.reshape(-1, d)
            if bits is None:  # the scatter casts to the pages' dtype
                codes[index][rows] = x
                continue
            new_codes, new_scales = quant.quantize(x, bits, self.format.group_size_for(d))
            codes[index][rows] = new_codes
            scales[index][rows] = new_scales

    def pages(self, layer: int) -> tuple[mx.array, mx.array] | tuple[QuantizedPages, ...]:
        """``[num_blocks, Hkv, block_size, D]`` views of the layer's K and V (quantized pages
        as ``QuantizedPages`` of that logical shape); a latent layer's key pages twice, as the
        attention contract takes them. An indexer's keys: ``key_pages``."""
        s = self.shapes[layer]
        at = self._scale_index.get(layer)
        scales = None if at is None else self.key_scales[at]
        k = self._view(s, self.keys[layer], scales)
        if s.value_dim is not None:
            return k, k
        index = self._value_index[layer]
        scales = self.value_scales[index] if self.value_scales else None
        return k, self._view(s, self.values[index], scales)

    def key_pages(self, layer: int) -> mx.array | QuantizedPages | Fp8Pages:
        """A key-only layer's (a lightning indexer's) pages, in whichever format they are (fp8
        keys as ``Fp8Pages``): only the indexer reads them, never an attention kernel."""
        at = self._scale_index.get(layer)
        return self._view(
            self.shapes[layer], self.keys[layer], None if at is None else self.key_scales[at]
        )

    def _view(self, shape: LayerShape, codes: mx.array, scales: mx.array | None) -> Any:
        head = (self.num_blocks, shape.num_kv_heads, self.block_size)
        if scales is not None and self.format.fp8(shape):
            return Fp8Pages(codes.reshape(*head, -1), scales.reshape(*head, -1))
        if scales is None or self.format.bits is None:
            return codes.reshape(*head, shape.head_dim)
        group = self.format.group_size_for(shape.head_dim)
        scales = scales.reshape(*head, *scales.shape[1:])
        return QuantizedPages(codes.reshape(*head, -1), scales, self.format.bits, group)

    def arrays(self) -> list[mx.array]:
        return self.keys + self.values + self.key_scales + self.value_scales

    def _groups(self) -> list[tuple[list[mx.array], int, LayerShape]]:
        """Each page array's list, its index there and its layer's shape, in ``arrays()``
        order."""
        valued = [self.shapes[layer] for layer in self._value_index]
        scaled = [self.shapes[layer] for layer in self._scale_index]
        lists = (
            (self.keys, self.shapes),
            (self.values, valued),
            (self.key_scales, scaled),
            (self.value_scales, valued),
        )
        return [(group, i, shapes[i]) for group, shapes in lists for i in range(len(group))]

    def _block_rows(self, shape: LayerShape, blocks: Sequence[int]) -> mx.array:
        """The flat rows of ``blocks`` in a layer's arrays: a block is one run of
        ``Hkv * block_size`` rows, every head's."""
        per = shape.num_kv_heads * self.block_size
        rows = np.asarray(blocks, dtype=np.int64)[:, None] * per + np.arange(per)
        return mx.array(rows.reshape(-1).astype(np.int32))

    def block_slab_bytes(self) -> list[int]:
        """Bytes of one block in each page array, in ``arrays()`` order (a block's bytes on disk
        are these slabs, one after another: ``gather_blocks``)."""
        slabs = []
        for group, index, shape in self._groups():
            array = group[index]
            row = array.nbytes // array.shape[0]
            slabs.append(shape.num_kv_heads * self.block_size * row)
        return slabs

    def gather_blocks(self, blocks: Sequence[int]) -> list[mx.array]:
        """Each page array's rows of ``blocks`` as bytes, ``[len(blocks), slab]`` uint8 (lazy:
        the step that evaluates them copies them out beside its own work)."""
        count = len(blocks)
        out = []
        for group, index, shape in self._groups():
            rows = group[index][self._block_rows(shape, blocks)]
            out.append(rows.view(mx.uint8).reshape(count, -1))
        return out

    def scatter_blocks(self, blocks: Sequence[int], slabs: Sequence[np.ndarray]) -> None:
        """Write ``blocks``' pages from bytes (``slabs[i]``: ``[len(blocks), slab]`` uint8 for
        page array i, as ``gather_blocks`` made them), evaluated with the next step: one slice
        update per run of consecutive block ids and array (a block is one run of rows). Not a
        scatter: MLX's CPU scatter moves one element at a time, five times slower than a slice
        update, and both update the pool in place (donated)."""
        runs = _runs(blocks)
        for (group, index, shape), data in zip(self._groups(), slabs, strict=True):
            array = group[index]
            per = shape.num_kv_heads * self.block_size
            rows = mx.array(data).view(array.dtype).reshape(-1, *array.shape[1:])
            for at, first, count in runs:
                array[first * per : (first + count) * per] = rows[at * per : (at + count) * per]


@dataclass
class KVStores:
    """The page arrays of every cache group: the full-attention layers' and, for a model with
    sliding-window layers, the window group's (its own block ids); ``slots[i]`` says where store
    layer i lives: (in the window group, its layer index there)."""

    full: KVStore
    window: KVStore | None
    slots: list[tuple[bool, int]]

    @property
    def nbytes(self) -> int:
        return self.full.nbytes + (self.window.nbytes if self.window is not None else 0)

    def arrays(self) -> list[mx.array]:
        return self.full.arrays() + (self.window.arrays() if self.window is not None else [])


def _runs(blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """``blocks`` as runs of consecutive ids: (index of its first in ``blocks``, first id,
    length)."""
    runs: list[tuple[int, int, int]] = []
    for i, block in enumerate(blocks):
        if runs and runs[-1][1] + runs[-1][2] == block:
            at, first, count = runs[-1]
            runs[-1] = (at, first, count + 1)
        else:
            runs.append((i, block, 1))
    return runs


def _resized(
    array: mx.array, rows_per_block: int, num_blocks: int, keep: Sequence[int] | None
) -> mx.array:
    """A flat page array (rows first) resized to ``num_blocks`` blocks: its blocks ``keep``
    gathered (a new buffer; a slice would keep the old one alive) or its first blocks, then
    zeros."""
    blocks = array.reshape(-1, rows_per_block, *array.shape[1:])
    if keep is not None:
        blocks = blocks[mx.array(list(keep), dtype=mx.int32)] if keep else blocks[:0]
    extra = num_blocks - blocks.shape[0]
    assert extra >= 0, "resizing would drop blocks it was not told to"
    zeros = mx.zeros((extra, *blocks.shape[1:]), dtype=array.dtype)
    return mx.concatenate([blocks, zeros]).reshape(-1, *array.shape[1:])
