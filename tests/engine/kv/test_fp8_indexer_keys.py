"""The indexer keys' fp8 page format (``stores/fp8_keys.py``) against a float64 numpy oracle
written from the e4m3 definition and DeepSeek V3.2's ``act_quant`` (``tests/support/
fp8_numpy.py``): the codes, the scales, the keys read back from a ``KVStore``'s pages beside a
latent layer in any format, and their bytes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macbatch.engine.stores import fp8_keys
from macbatch.engine.stores.fp8_keys import Fp8Pages
from macbatch.engine.stores.pages import KVStore, LayerShape, PageFormat
from tests.support.fp8_numpy import e4m3_grid, fp8_keys_numpy, fp8_round_numpy, round_e4m3


def _keys(width: int, rows: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, width)) * rng.uniform(1e-3, 40.0, size=(rows, 1))
    x[0] = 0.0  # all zero: the 1e-4 floor of amax
    x[1, : min(width, 128)] *= 1e-7  # a block below the floor
    x[2, 0] = 3e4  # one outlier: the rest of its block underflows toward 0
    return x.astype(np.float32)


def test_e4m3_rounding_is_the_grids_nearest_ties_to_even():
    """MLX's e4m3 conversion (which the format uses) is the oracle's at and between every grid
    point, ties included."""
    grid = e4m3_grid()
    between = np.concatenate([grid, (grid[1:] + grid[:-1]) / 2, grid[:-1] * 0.75 + grid[1:] * 0.25])
    x = np.concatenate([between, -between]).astype(np.float32)
    got = np.array(mx.from_fp8(mx.to_fp8(mx.array(x)), dtype=mx.float32))
    assert np.array_equal(got, round_e4m3(x.astype(np.float64)))


@pytest.mark.parametrize("width", [64, 128, 256])
def test_codes_and_scales_are_the_oracles(width):
    """A power-of-two float32 scale per 128 columns (per row when narrower) and e4m3 codes."""
    x = _keys(width)
    codes, scales = fp8_keys.quantize(mx.array(x))
    values, want_scales = fp8_round_numpy(x)
    assert codes.dtype == mx.uint8 and scales.dtype == mx.float32
    assert scales.shape == (x.shape[0], max(1, width // 128))
    assert np.array_equal(np.array(scales), want_scales)
    assert np.array_equal(np.array(mx.from_fp8(codes, dtype=mx.float32)), values)
    back = np.array(fp8_keys.dequantize(codes, scales))
    assert np.array_equal(back, fp8_keys_numpy(x))
    assert np.abs(back - x).max() > 0  # it rounds


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_a_store_holds_fp8_keys_beside_a_latent_layer(bits):
    """Written rows read back through the pages as the oracle's keys; the latent layer keeps
    its own format; a block's bytes are the arrays' (132 per 128-wide key)."""
    shapes = [LayerShape(1, 96, value_dim=64), LayerShape(1, 256, value_dim=0)]
    fmt = PageFormat(mx.float32, bits, 32 if bits else None, indexer_keys="fp8")
    store = KVStore(shapes, num_blocks=4, block_size=4, fmt=fmt)
    keys = _keys(256, rows=6, seed=3)
    rows = mx.array([13, 0, 5, 6, 7, 2])
    store.write(1, rows, mx.array(keys).reshape(6, 1, 1, 256), None)
    pages = store.key_pages(1)
    assert isinstance(pages, Fp8Pages)
    flat = np.array(fp8_keys.dequantize(pages.codes, pages.scales)).reshape(-1, 256)
    assert np.array_equal(flat[np.array(rows)], fp8_keys_numpy(keys))
    assert not isinstance(store.pages(0)[0], Fp8Pages)
    assert fmt.bytes_per_block(shapes[1:], 1) == 256 + 2 * 4
    assert store.bytes_per_block * store.num_blocks == store.nbytes


def test_bad_settings_say_why():
    with pytest.raises(ValueError, match="'fp8' or None"):
        fp8_keys.check_indexer_keys("e5m2")
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8_keys.block_for(192)
    assert (
        PageFormat(mx.bfloat16, indexer_keys="fp8").bytes_per_block(
            [LayerShape(1, 128, value_dim=0)], 1
        )
        == 132
    )
