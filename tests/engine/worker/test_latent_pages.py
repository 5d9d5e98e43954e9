"""Latent pages in the KV store: an MLA layer keeps one row per token (no value pages) beside
ordinary K/V layers in one store; its bytes are the rows' alone, the attention contract reads
the same pages as keys and values, and a block's rows travel through ``gather_blocks`` /
``scatter_blocks`` as any layer's (the disk tier's format)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine.stores.pages import KVStore, LayerShape, PageFormat
from macbatch.metal.quant import QuantizedPages

SHAPES = [LayerShape(2, 32), LayerShape(1, 96, value_dim=64), LayerShape(2, 32)]
BLOCK = 8


def _store(bits: int | None, blocks: int = 4) -> KVStore:
    return KVStore(SHAPES, blocks, BLOCK, PageFormat(mx.float32, bits))


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_a_latent_layer_keeps_one_row_per_token(bits):
    store = _store(bits)
    assert len(store.keys) == 3 and len(store.values) == 2  # no value pages for the latent layer
    per_row = {
        None: lambda d: d * 4,
        8: lambda d: d + d // 32 * 4,
        4: lambda d: d // 2 + d // 32 * 4,
    }
    row = per_row[bits]
    expected = 4 * BLOCK * (2 * 2 * row(32) + row(96) + 2 * 2 * row(32))
    assert store.nbytes == expected == 4 * store.bytes_per_block
    keys, values = store.pages(1)
    assert keys is values  # the values are the leading 64 columns of the same rows
    assert isinstance(keys, QuantizedPages) == (bits is not None)


@pytest.mark.parametrize("bits", [None, 4])
def test_latent_rows_round_trip_through_block_bytes(bits):
    """Rows written to blocks 1 and 3 of one store, gathered as bytes and scattered into blocks
    0 and 2 of another, read back equal there (every layer, the latent one included)."""
    source, target = _store(bits), _store(bits)
    rng = np.random.default_rng(0)
    for layer, shape in enumerate(SHAPES):
        heads = shape.num_kv_heads
        rows = np.concatenate(
            [(b * heads + h) * BLOCK + np.arange(BLOCK) for b in (1, 3) for h in range(heads)]
        )
        k = mx.array(rng.standard_normal((len(rows), shape.head_dim)).astype(np.float32))
        v = None if shape.value_dim else k * 2
        source.write(layer, mx.array(rows.astype(np.int32)), k, v)
    slabs = [np.array(a) for a in source.gather_blocks([1, 3])]
    target.scatter_blocks([0, 2], slabs)
    mx.eval(target.arrays())
    for layer in range(len(SHAPES)):
        for mine, theirs in zip(source.pages(layer), target.pages(layer)):
            parts = [(mine, theirs)]
            if isinstance(mine, QuantizedPages) and isinstance(theirs, QuantizedPages):
                parts = [(mine.codes, theirs.codes), (mine.scales, theirs.scales)]
            for a, b in parts:
                assert np.array_equal(np.array(a[mx.array([1, 3])]), np.array(b[mx.array([0, 2])]))
