"""A float64 numpy oracle of the indexer keys' fp8 page format (``stores/fp8_keys.py``), written
from the e4m3 definition (1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no infinities,
448 the largest finite value) and DeepSeek V3.2's ``act_quant`` (a power-of-two scale per 128
columns), not from the engine's code; and the libraries' indexer-key caches rounded through it."""

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


def round_e4m3(x: np.ndarray) -> np.ndarray:
    """``x`` (within +-448) on the e4m3 grid, to nearest, ties to the even code."""
    grid = e4m3_grid()
    mag = np.abs(x)
    hi = np.clip(np.searchsorted(grid, mag), 1, len(grid) - 1)
    lo = hi - 1
    below, above = mag - grid[lo], grid[hi] - mag
    pick = np.where(below < above, lo, np.where(above < below, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(x) * grid[pick]


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
    """Every key a library's sparse-attention caches are handed for their indexers first rounded
    through the fp8 format, so the library's own indexer scores over exactly the keys fp8 pages
    hold (in place of any other rounding of them: the cache's own write is wrapped). Only the
    layers of ``layers`` whose attention has an indexer of its own (``self_attn.indexer``):
    recurrent layers and those sharing another layer's selection (Hunyuan V4's and GLM5-next's
    "shared" layers, whose lists hold the latent and its projections) have no keys to round."""
    for layer, layer_cache in zip(layers, cache):
        if getattr(getattr(layer, "self_attn", None), "indexer", None) is not None:
            _round_args(*_key_write(layer_cache))


def _key_write(layer_cache) -> tuple[object, str, int]:
    """Where a layer's library cache is handed its indexer's keys: the object, its method, and
    how many leading arguments make up one page row. mlx-vlm's Qwen4-exp hands its raw keys to
    its ``QSAKVCache``'s ``update_indexer(keys, positions)``; GLM5-next each token's key and
    pooling gate to the ``PoolingCache`` of its four-part list, ``accumulate_windows(keys,
    gates, offset)`` (the engine's page row is the two side by side); mlx-lm's DeepSeek V3.2 and
    GLM-5 write ``update_and_fetch(k, k)`` to their two-part list's second cache, mlx-vlm's
    Hunyuan V4 ``update_and_fetch(k, zeros [.., 0])`` (both indexers read the keys alone)."""
    if hasattr(layer_cache, "update_indexer"):
        return layer_cache, "update_indexer", 1
    pooling = [part for part in layer_cache.caches if hasattr(part, "accumulate_windows")]
    if pooling:
        return pooling[0], "accumulate_windows", 2
    return layer_cache.caches[1], "update_and_fetch", 1


def _round_args(owner: object, method: str, count: int) -> None:
    """``owner.method``'s first ``count`` arguments rounded first, as one row side by side."""
    write = getattr(type(owner), method).__get__(owner)

    def rounded(*args):
        parts = [np.array(a.astype(mx.float32)) for a in args[:count]]
        exact = fp8_keys_numpy(np.concatenate(parts, axis=-1)).astype(np.float32)
        cuts = np.cumsum([p.shape[-1] for p in parts])[:-1]
        back = [mx.array(x).astype(a.dtype) for x, a in zip(np.split(exact, cuts, -1), args)]
        return write(*back, *args[count:])

    setattr(owner, method, rounded)
