"""A float64 numpy oracle of the 8-bit float weight formats real checkpoints store MTP layers in,
written from their definitions over the e4m3 codes of tests/support/fp8_numpy.py: mxfp8 (OCP
Microscaling v1.0: blocks of 32 along a row share one E8M0 byte, the power of two
2 ** (byte - 127), chosen as 2 ** (floor(log2(amax)) - 8), 8 being e4m3's largest exponent;
elements past 448 saturate) and DeepSeek-V3's block fp8 (one float32 ``scale_inv`` per
128 x 128 block, amax / 448, the weight ``code * scale_inv``)."""

from __future__ import annotations

import numpy as np

from tests.support.fp8_numpy import e4m3_codes, e4m3_values

MX_BLOCK = 32
FP8_BLOCK = 128


def mxfp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` (its last axis a multiple of 32) in mxfp8: (e4m3 codes, E8M0 scale bytes, one per
    32 of a row, the values they stand for)."""
    blocks = np.asarray(w, np.float64).reshape(*w.shape[:-1], -1, MX_BLOCK)
    amax = np.abs(blocks).max(-1, keepdims=True)
    exponent = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 8
    codes = e4m3_codes(blocks / 2.0**exponent)
    values = e4m3_values(codes) * 2.0**exponent
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
    scale_inv = (np.where(amax > 0, amax, 1.0) / 448.0).astype(np.float32)
    per_value = np.kron(scale_inv.astype(np.float64), np.ones((FP8_BLOCK, FP8_BLOCK)))
    per_value = per_value[:rows, :cols]
    codes = e4m3_codes(w / per_value)
    return codes, scale_inv, e4m3_values(codes) * per_value
