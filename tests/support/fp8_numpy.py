"""A float64 numpy oracle of the indexer keys' fp8 page format (``stores/fp8_keys.py``), written
from the e4m3 definition (1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no infinities,
448 the largest finite value) and DeepSeek V3.2's ``act_quant`` (a power-of-two scale per 128
columns), not from the engine's code; and mlx-lm's indexer-key caches rounded through it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


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


def round_indexer_keys(cache: list) -> None:
    """Every key a library's sparse-attention caches write into their indexer-key part (a
    layer's ``CacheList``'s second cache) first rounded through the fp8 format, so the library's
    own indexer scores over exactly the keys fp8 pages hold (in place of any other rounding of
    them: the class's own write is wrapped). mlx-lm's DeepSeek V3.2 and GLM-5 write
    ``update_and_fetch(k, k)`` on every layer; mlx-vlm's Hunyuan V4 writes ``update_and_fetch(k,
    zeros [.., 0])`` (a ``HyV4KVCache``) on its "full" layers only, its "shared" layers' lists
    holding the latent alone: those have no keys to round. The values are passed as written
    (both indexers read the keys alone)."""
    for layer_cache in cache:
        if len(layer_cache.caches) < 2:  # no indexer of its own (Hunyuan V4's shared layers)
            continue
        part = layer_cache.caches[1]
        write = type(part).update_and_fetch.__get__(part)

        def rounded(keys: mx.array, values: mx.array, write=write) -> tuple[mx.array, mx.array]:
            exact = fp8_keys_numpy(np.array(keys.astype(mx.float32)))
            return write(mx.array(exact.astype(np.float32)).astype(keys.dtype), values)

        part.update_and_fetch = rounded
