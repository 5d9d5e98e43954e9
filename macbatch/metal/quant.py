"""Quantized K/V pages: the one definition of the 8-bit and 4-bit page format.

Every attention path (the Metal kernel, the CPU kernel, the reference) reads pages in this format
and dequantizes them itself; ``quantize`` is the only writer (the engine's per-step scatter calls
it on the step's new K/V rows, so no full-precision page ever exists).

Format (affine, per token row and per group of ``group_size`` consecutive head-dim elements):

- ``codes``: uint8 ``[num_blocks, Hkv, block_size, D * bits / 8]``. 8-bit: one code per byte.
  4-bit: two codes per byte, element ``2i`` in the low nibble and ``2i + 1`` in the high one.
- ``scales``: float16 ``[num_blocks, Hkv, block_size, D / group_size, 2]``: (scale, bias) of each
  group, beside the codes in the same page order, so one KV head's block of scales is contiguous
  like its codes and a kernel reads both through the same block table.
- A group ``x`` is stored as ``bias = fp16(min x)``, ``scale = fp16((max x - min x) / (2^bits-1))``,
  ``code = clip(round_half_even((x - bias) / scale), 0, 2^bits - 1)`` (code 0 when scale is 0),
  all in float32 from the stored float16 scale and bias; it reads back as
  ``code * scale + bias`` in float32.

Scales are per token row, not per block: a block fills one token per decode step, and a scale
fixed before its later tokens are known could not cover them without re-quantizing the block
from a full-precision copy, which is exactly what this format must never keep.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

KV_BITS = (8, 4)
GROUP_SIZES = (64, 32)
_FP16_MAX = 65504.0


def default_group_size(head_dim: int) -> int:
    """64, else 32, whichever divides the head dim; the whole head dim when neither does (or
    when it is smaller)."""
    return next((g for g in GROUP_SIZES if head_dim % g == 0), head_dim)


def check_kv_quantization(bits: int | None, group_size: int | None) -> None:
    """Clear errors for settings no head dim could use (called before any model loads)."""
    if bits is not None and (isinstance(bits, bool) or bits not in KV_BITS):
        raise ValueError(f"kv_bits must be 8, 4 or None (float pages), got {bits!r}")
    if group_size is not None and (isinstance(group_size, bool) or group_size not in GROUP_SIZES):
        raise ValueError(
            f"kv_group_size must be 64 or 32 (or None: 64, 32 or the head dim, whichever "
            f"divides it), got {group_size!r}"
        )


def group_size_for(head_dim: int, bits: int, group_size: int | None) -> int:
    """The group size to use for a head dim, or a clear error when it cannot work."""
    if head_dim % 2:
        raise ValueError(f"kv_bits={bits} needs an even head dim, got {head_dim}")
    size = min(group_size, head_dim) if group_size else default_group_size(head_dim)
    if head_dim % size:
        valid = [str(g) for g in GROUP_SIZES if head_dim % g == 0] or [f"None (uses {head_dim})"]
        raise ValueError(
            f"kv_group_size {size} does not divide the model's head dim {head_dim}; "
            f"valid values here: {', '.join(valid)}"
        )
    return size


@dataclass(frozen=True)
class QuantizedPages:
    """One layer's K (or V) pages in the quantized format described above."""

    codes: mx.array
    scales: mx.array
    bits: int
    group_size: int

    def __post_init__(self) -> None:
        head_dim = self.codes.shape[-1] * 8 // self.bits if self.bits in KV_BITS else 0
        groups = head_dim // self.group_size if self.group_size > 0 else 0
        if (
            self.codes.ndim != 4
            or self.codes.dtype != mx.uint8
            or self.scales.dtype != mx.float16
            or not groups
            or groups * self.group_size != head_dim
            or tuple(self.scales.shape) != (*self.codes.shape[:3], groups, 2)
        ):
            raise ValueError(
                f"QuantizedPages: expected {self.bits}-bit uint8 codes [blocks, Hkv, block, "
                f"D * bits / 8] and float16 scales [blocks, Hkv, block, D / {self.group_size}, "
                f"2], got codes {self.codes.dtype} {tuple(self.codes.shape)} and scales "
                f"{self.scales.dtype} {tuple(self.scales.shape)}"
            )

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The logical ``[num_blocks, Hkv, block_size, D]`` shape of the pages."""
        blocks, hkv, bs, row_bytes = self.codes.shape
        return (blocks, hkv, bs, row_bytes * 8 // self.bits)

    @property
    def ndim(self) -> int:
        return 4


def code_bytes(head_dim: int, bits: int) -> int:
    """Bytes of codes per token row of one head."""
    return head_dim * bits // 8


def scale_bytes(head_dim: int, group_size: int) -> int:
    """Bytes of (scale, bias) per token row of one head."""
    return head_dim // group_size * 2 * 2


def quantize(x: mx.array, bits: int, group_size: int) -> tuple[mx.array, mx.array]:
    """``x [..., D]`` -> (codes uint8 ``[..., D * bits / 8]``, scales float16
    ``[..., D / group_size, 2]``), the format in this module's docstring."""
    *lead, d = x.shape
    levels = (1 << bits) - 1
    groups = mx.clip(x.astype(mx.float32), -_FP16_MAX, _FP16_MAX).reshape(*lead, -1, group_size)
    lo = groups.min(axis=-1, keepdims=True)
    scale = ((groups.max(axis=-1, keepdims=True) - lo) / levels).astype(mx.float16)
    bias = lo.astype(mx.float16)
    s32 = scale.astype(mx.float32)
    safe = mx.where(s32 > 0, s32, 1.0)
    codes = mx.where(s32 > 0, mx.round((groups - bias.astype(mx.float32)) / safe), 0.0)
    codes = mx.clip(codes, 0, levels).astype(mx.uint8).reshape(*lead, d)
    if bits == 4:
        pairs = codes.reshape(*lead, d // 2, 2)
        codes = pairs[..., 0] | (pairs[..., 1] << 4)
    return codes, mx.concatenate([scale, bias], axis=-1)


def dequantize(codes: mx.array, scales: mx.array, bits: int, group_size: int) -> mx.array:
    """The float32 values that ``quantize`` stored (``[..., D]``)."""
    if bits == 4:
        codes = mx.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)
    *lead, d = codes.shape
    groups = codes.astype(mx.float32).reshape(*lead, d // group_size, group_size)
    scales = scales.astype(mx.float32)
    return (groups * scales[..., :1] + scales[..., 1:]).reshape(*lead, d)
