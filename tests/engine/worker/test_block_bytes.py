"""A block's pages as bytes (the disk tier's format): ``scatter_blocks`` writes each block's rows
where ``gather_blocks`` read them, whatever runs of consecutive ids the blocks make, and leaves
every other block as it was. The oracle is numpy: the pool before, with the blocks' rows
assigned."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine.stores.pages import KVStore, LayerShape, PageFormat

SHAPES = [LayerShape(2, 32), LayerShape(4, 64)]
BLOCK = 4
NUM_BLOCKS = 10


def _filled(bits: int | None, seed: int) -> KVStore:
    """A store whose every row holds random values."""
    store = KVStore(SHAPES, NUM_BLOCKS, BLOCK, PageFormat(mx.float32, bits))
    rng = np.random.default_rng(seed)
    for layer, shape in enumerate(SHAPES):
        rows = NUM_BLOCKS * shape.num_kv_heads * BLOCK
        k, v = (
            mx.array(rng.standard_normal((rows, shape.head_dim)).astype(np.float32))
            for _ in range(2)
        )
        store.write(layer, mx.arange(rows), k, v)
    mx.eval(store.arrays())
    return store


@pytest.mark.parametrize("bits", [None, 4])
@pytest.mark.parametrize(
    "blocks",
    [[5, 2, 3, 4, 0], [9, 8, 7], [1, 2, 3, 4, 5, 6], [7]],
    ids=["runs-and-singles", "descending", "one-run", "one"],
)
def test_blocks_scattered_from_bytes_land_where_their_rows_belong(bits, blocks):
    source, target = _filled(bits, 0), _filled(bits, 1)
    sources = [3, 0, 9, 6, 1, 8][: len(blocks)]  # blocks of ``source``, in ``blocks``' order
    expected = [np.array(a) for a in target.arrays()]
    for array, before, shape in zip(source.arrays(), expected, _shapes(source), strict=True):
        per = shape.num_kv_heads * BLOCK
        theirs = np.array(array)
        for block, origin in zip(blocks, sources):
            before[block * per : (block + 1) * per] = theirs[origin * per : (origin + 1) * per]
    target.scatter_blocks(blocks, [np.array(a) for a in source.gather_blocks(sources)])
    mx.eval(target.arrays())
    for array, want in zip(target.arrays(), expected, strict=True):
        assert np.array_equal(np.array(array), want)


def _shapes(store: KVStore) -> list[LayerShape]:
    """Each page array's layer shape, in ``arrays()`` order (keys, values, then scales)."""
    lists = 4 if store.format.bits is not None else 2
    return SHAPES * lists
