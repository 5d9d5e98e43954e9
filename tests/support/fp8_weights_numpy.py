"""A float64 numpy oracle of the 8-bit float weight formats real checkpoints store MTP layers in,
written from their definitions over the e4m3 codes of tests/support/fp8_numpy.py: mxfp8 (OCP
Microscaling v1.0: blocks of 32 along a row share one E8M0 byte, the power of two
2 ** (byte - 127), chosen as 2 ** (floor(log2(amax)) - 8), 8 being e4m3's largest exponent;
elements past 448 saturate), its mxfp4 (the same shared byte, 2 ** (floor(log2(amax)) - 2), over
e2m1 elements: 1 sign, 2 exponent bits of bias 1, 1 mantissa bit, 6 the largest; two to a byte,
the first in the low nibble), DeepSeek-V3's block fp8 (one float32 ``scale_inv`` per 128 x 128
block, amax / 448, the weight ``code * scale_inv``) and DeepSeek V4's (one E8M0 byte per block,
amax / 448 rounded up to a power of two)."""

from __future__ import annotations

import numpy as np

from tests.support.fp8_numpy import e4m3_codes, e4m3_values

MX_BLOCK = 32
FP8_BLOCK = 128
# every non-negative e2m1 value; index = the code's low 3 bits
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


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


def mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` (its last axis a multiple of 32) in mxfp4: (the e2m1 codes two to a byte, E8M0
    scale bytes, one per 32 of a row, the values they stand for)."""
    blocks = np.asarray(w, np.float64).reshape(*w.shape[:-1], -1, MX_BLOCK)
    amax = np.abs(blocks).max(-1, keepdims=True)
    exponent = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2
    scaled = np.minimum(np.abs(blocks) / 2.0**exponent, E2M1[-1])
    index = np.abs(scaled[..., None] - E2M1).argmin(-1)  # the nearest grid value
    tie = np.isclose(scaled, (E2M1[index] + E2M1[np.minimum(index + 1, 7)]) / 2)
    index = np.where(tie & (index % 2 == 1), index + 1, index)  # a tie: the even code
    codes = (index | np.where(blocks < 0, 8, 0)).astype(np.uint8).reshape(*w.shape[:-1], -1, 2)
    values = np.where(blocks < 0, -1.0, 1.0) * E2M1[index] * 2.0**exponent
    scales = (exponent[..., 0] + 127).astype(np.uint8)
    packed = (codes[..., 0] | codes[..., 1] << 4).astype(np.uint8)
    return packed, scales, values.reshape(w.shape)


def ue8m0_block_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 2-D ``w`` in DeepSeek V4's block fp8: (e4m3 codes, one E8M0 byte per 128 x 128
    block, the values they stand for)."""
    rows, cols = w.shape
    grid = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    padded = np.zeros((grid[0] * FP8_BLOCK, grid[1] * FP8_BLOCK))
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(grid[0], FP8_BLOCK, grid[1], FP8_BLOCK)).max(axis=(1, 3))
    exponent = np.ceil(np.log2(np.where(amax > 0, amax, 1.0) / 448.0))
    per_value = np.kron(2.0**exponent, np.ones((FP8_BLOCK, FP8_BLOCK)))[:rows, :cols]
    codes = e4m3_codes(w / per_value)
    return codes, (exponent + 127).astype(np.uint8), e4m3_values(codes) * per_value


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
