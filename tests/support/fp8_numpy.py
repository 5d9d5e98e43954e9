"""A float64 numpy oracle of the indexer keys' fp8 page format (``stores/fp8_keys.py``), written
from the e4m3 definition (1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no infinities,
448 the largest finite value) and DeepSeek V3.2's ``act_quant`` (a power-of-two scale per 128
columns), not from the engine's code; and the libraries' indexer-key caches rounded through it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from macbatch.engine.model.library_keys import round_indexer_keys as round_library_keys


def e4m3_grid() -> np.ndarray:
    """Every finite non-negative e4m3 value, ascending; index = the code's low 7 bits."""
    values = []
    for exponent in range(16):
        for mantissa in range(8):
            if exponent == 15 and mantissa == 7:  # the NaN code
                continue
            if exponent == 0:
                values.append(mantissa / 8 * 2.0**-6)
            else:
                values.append((1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return np.array(values)


def _nearest(mag: np.ndarray) -> np.ndarray:
    """The index on ``e4m3_grid`` of each magnitude's nearest value (ties to the even code)."""
    grid = e4m3_grid()
    hi = np.clip(np.searchsorted(grid, mag), 1, len(grid) - 1)
    lo = hi - 1
    below, above = mag - grid[lo], grid[hi] - mag
    return np.where(below < above, lo, np.where(above < below, hi, np.where(lo % 2 == 0, lo, hi)))


def round_e4m3(x: np.ndarray) -> np.ndarray:
    """``x`` (within +-448) on the e4m3 grid, to nearest, ties to the even code."""
    return np.sign(x) * e4m3_grid()[_nearest(np.abs(x))]


def e4m3_codes(x: np.ndarray) -> np.ndarray:
    """The e4m3 byte of each value of ``x`` (its sign bit, then its grid index; nearest, ties to
    the even code, saturating at 448), as an fp8 checkpoint stores a weight."""
    index = _nearest(np.minimum(np.abs(x), 448.0))
    return (index | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    """The value of each e4m3 byte (none the NaN code)."""
    return np.where(codes & 0x80, -1.0, 1.0) * e4m3_grid()[codes & 0x7F]


def fp8_round_numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x [..., D]`` -> (the e4m3 values ``[..., D]`` before scaling, the float32 scales
    ``[..., D / block]``); the keys read back as ``values * scale``."""
    *lead, d = x.shape
    block = min(128, d)
    blocks = x.astype(np.float32).reshape(*lead, d // block, block)
    amax = np.maximum(np.abs(blocks).max(axis=-1), np.float32(1e-4))
    ratio = (amax / np.float32(448.0)).astype(np.float64)
    scale = 2.0 ** np.ceil(np.log2(ratio))
    values = round_e4m3(np.clip(blocks / scale[..., None], -448.0, 448.0))
    return values.reshape(*lead, d), scale


def fp8_keys_numpy(x: np.ndarray) -> np.ndarray:
    """The keys the fp8 format reads back, float64."""
    values, scale = fp8_round_numpy(x)
    *lead, d = x.shape
    return (values.reshape(*lead, scale.shape[-1], -1) * scale[..., None]).reshape(*lead, d)


def round_indexer_keys(layers: list, cache: list) -> None:
    """Every key a library's sparse-attention caches are handed for their indexers (one page row
    at a time: ``macbatch/engine/model/library_keys.py`` says where each family's go) first
    rounded through this oracle of the fp8 format, so the library's own indexer scores over
    exactly the keys fp8 pages hold (in place of any other rounding of them)."""
    round_library_keys(layers, cache, _through_numpy)


def _through_numpy(x: mx.array) -> mx.array:
    """``x`` as the format reads it back (float64 oracle), in ``x``'s dtype."""
    exact = fp8_keys_numpy(np.array(x.astype(mx.float32)))
    return mx.array(exact.astype(np.float32)).astype(x.dtype)
