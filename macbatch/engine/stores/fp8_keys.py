"""The fp8 page format of a lightning indexer's keys (``EngineConfig.indexer_keys`` "fp8"): the
one definition of how they are stored and read back.

DeepSeek V3.2's reference inference keeps its indexer's keys this way (``act_quant`` with block
size 128 and its config's ``scale_fmt`` "ue8m0"), so a key costs 132 bytes per token per layer
instead of 256 in bf16. Per token row and per block of ``FP8_BLOCK`` columns (the whole row when
it is narrower, as a tiny test model's is):

- ``amax = max(max |x|, 1e-4)``, ``scale = 2 ** ceil(log2(amax / 448))`` in float32 (a power of
  two, so ``x / scale`` is exact);
- ``code = e4m3(clip(x / scale, -448, 448))`` (round to nearest even on the e4m3 grid: MLX's
  ``to_fp8``), one uint8 per column;
- it reads back as ``from_fp8(code) * scale`` in float32.

Codes are ``[rows, D]`` uint8 and scales ``[rows, D / block]`` float32, both indexed by the page
row like every page array, so the prefix cache, the disk tier and preemption carry them as they
carry any page. Only the indexer reads these pages (``model/sparse_indexer.py``, ``gather_keys``).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

FP8_BLOCK = 128
INDEXER_KEY_FORMATS = ("fp8",)
_E4M3_MAX = 448.0
_AMAX_FLOOR = 1e-4


def check_indexer_keys(value: str | None) -> None:
    """A clear error for a setting no model could use (called before any model loads)."""
    if value is not None and value not in INDEXER_KEY_FORMATS:
        raise ValueError(
            f"indexer_keys must be 'fp8' or None (the latent pages' format), got {value!r}"
        )


def block_for(width: int) -> int:
    """The columns one scale covers in a ``width``-column key: 128, or the whole key when it is
    narrower; a clear error when 128 does not divide it."""
    if not fits(width):
        raise ValueError(
            f"indexer_keys='fp8' needs an indexer key width that is a multiple of {FP8_BLOCK} "
            f"(or at most {FP8_BLOCK}), got {width}"
        )
    return min(width, FP8_BLOCK)


def fits(width: int) -> bool:
    """Whether a ``width``-column key can be stored in fp8 (``block_for`` does not refuse it)."""
    return width <= FP8_BLOCK or width % FP8_BLOCK == 0


def row_bytes(width: int) -> int:
    """Bytes of one token's key: a code per column and a float32 scale per block."""
    return width + 4 * (width // block_for(width))


@dataclass(frozen=True)
class Fp8Pages:
    """One layer's indexer-key pages: codes ``[blocks, 1, block_size, D]`` uint8 and scales
    ``[blocks, 1, block_size, D / block]`` float32."""

    codes: mx.array
    scales: mx.array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    @property
    def ndim(self) -> int:
        return 4


def quantize(x: mx.array) -> tuple[mx.array, mx.array]:
    """``x [..., D]`` -> (codes uint8 ``[..., D]``, scales float32 ``[..., D / block]``)."""
    *lead, d = x.shape
    blocks = x.astype(mx.float32).reshape(*lead, -1, block_for(d))
    amax = mx.maximum(mx.abs(blocks).max(axis=-1, keepdims=True), _AMAX_FLOOR)
    scale = _power_of_two_above(amax / _E4M3_MAX)
    scaled = mx.clip(blocks / scale, -_E4M3_MAX, _E4M3_MAX)
    return mx.to_fp8(scaled).reshape(*lead, d), scale[..., 0]


def _power_of_two_above(x: mx.array) -> mx.array:
    """The least power of two at or above each (normal, positive) float32 of ``x``, read off
    its bits as the reference does (its exponent, one more when any mantissa bit is set)."""
    bits = x.view(mx.uint32)
    exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0).astype(mx.uint32)
    return (exponent << 23).view(mx.float32)


def dequantize(codes: mx.array, scales: mx.array) -> mx.array:
    """The float32 keys ``quantize`` stored (``[..., D]``)."""
    *lead, d = codes.shape
    values = mx.from_fp8(codes, dtype=mx.float32).reshape(*lead, scales.shape[-1], -1)
    return (values * scales[..., None]).reshape(*lead, d)


def round_trip(x: mx.array) -> mx.array:
    """``x`` as fp8 pages read it back, in ``x``'s dtype (a library cache's keys rounded as the
    engine's pages round them: the load-time self-check's)."""
    return dequantize(*quantize(x)).astype(x.dtype)
