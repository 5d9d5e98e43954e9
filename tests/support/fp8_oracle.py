"""A float64 numpy oracle of the 8-bit float weight formats real checkpoints store MTP layers in,
from their definitions (no MLX): OCP's e4m3 (E4M3FN: a sign, 4 exponent bits biased by 7, 3
mantissa bits, subnormals at exponent 0, no infinities, 0x7f / 0xff NaN, 448 the largest);
mxfp8 (OCP Microscaling v1.0: blocks of 32 along a row share one E8M0 byte, the power of two
2 ** (byte - 127), chosen as 2 ** (floor(log2(amax)) - 8), 8 being e4m3's largest exponent;
elements past 448 saturate); and DeepSeek-V3's block fp8 (one float32 ``scale_inv`` per
128 x 128 block, amax / 448, the weight ``code * scale_inv``)."""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
MX_BLOCK = 32
FP8_BLOCK = 128


def e4m3_values() -> np.ndarray:
    """The value of each of the 256 e4m3 bytes (NaN for 0x7f and 0xff)."""
    byte = np.arange(256)
    exponent, mantissa = (byte >> 3) & 15, byte & 7
    magnitude = np.where(
        exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    )
    magnitude = np.where((exponent == 15) & (mantissa == 7), np.nan, magnitude)
    return np.where(byte & 0x80, -magnitude, magnitude)


def e4m3_codes(x: np.ndarray) -> np.ndarray:
    """The nearest e4m3 byte of each value (ties to the even code; saturating at 448)."""
    grid = e4m3_values()[:127]  # 0 .. 448, increasing
    magnitude = np.minimum(np.abs(x), E4M3_MAX)
    high = np.clip(np.searchsorted(grid, magnitude), 1, 126)
    low = high - 1
    below, above = magnitude - grid[low], grid[high] - magnitude
    nearest = np.where((above < below) | ((above == below) & (high % 2 == 0)), high, low)
    return (nearest | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def mxfp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` (its last axis a multiple of 32) in mxfp8: (e4m3 codes, E8M0 scale bytes, one per
    32 of a row, the values they stand for)."""
    blocks = np.asarray(w, np.float64).reshape(*w.shape[:-1], -1, MX_BLOCK)
    amax = np.abs(blocks).max(-1, keepdims=True)
    exponent = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 8
    codes = e4m3_codes(blocks / 2.0**exponent)
    values = e4m3_values()[codes] * 2.0**exponent
    scales = (exponent[..., 0] + 127).astype(np.uint8)
    return codes.reshape(w.shape), scales, values.reshape(w.shape)


def block_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 2-D ``w`` in block fp8: (e4m3 codes, float32 ``scale_inv`` per 128 x 128 block, the
    last blocks partial, the values they stand for)."""
    rows, cols = w.shape
    grid = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    padded = np.zeros((grid[0] * FP8_BLOCK, grid[1] * FP8_BLOCK))
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(grid[0], FP8_BLOCK, grid[1], FP8_BLOCK)).max(axis=(1, 3))
    scale_inv = (np.where(amax > 0, amax, 1.0) / E4M3_MAX).astype(np.float32)
    per_value = np.kron(scale_inv.astype(np.float64), np.ones((FP8_BLOCK, FP8_BLOCK)))
    per_value = per_value[:rows, :cols]
    codes = e4m3_codes(w / per_value)
    return codes, scale_inv, e4m3_values()[codes] * per_value
