"""MTP weights stored in 8-bit floats, read as mlx-vlm 0.7.10 reads the same formats for the
target (its config's ``quantization_config`` names the format; the codes are OCP e4m3 bytes):

- block fp8 (DeepSeek-V3's format, Qwen4-exp's checkpoints: ``quant_method`` "fp8", ``fmt``
  "e4m3", ``weight_block_size`` [128, 128]): a ``weight`` of codes and a ``weight_scale_inv`` of
  one float per 128 x 128 block; the value is the code times its block's scale. Dequantized
  here, in the dtype of the layer's own float weights (mlx-lm's DeepSeek ``sanitize`` dequantizes
  the target's so; mlx-vlm re-quantizes it to mxfp8, which rounds each value a second time).
- mxfp8 (Hunyuan V4's: ``quant_method`` "modelopt", ``quant_algo`` "MXFP8"): codes with a
  ``weight_scale`` of one power-of-two (ue8m0) scale per 32 inputs, which is MLX's own mxfp8
  layout: kept as MLX's mxfp8 quantized layers (the codes viewed as uint32, the scales as
  ``scales``), as mlx-vlm's ``hy_v4`` ``sanitize`` keeps the target's. Its decoder layer goes
  through that ``sanitize`` (``mtp_weights._sanitized_by_target``); ``as_mxfp8_layers`` packs
  what it drops and the loader keeps (``eh_proj``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx

FP8_BLOCK = 128
# MLX's quantization of an mxfp8 checkpoint's layers (mlx-vlm's ``hy_v4``
# ``make_quantization_config``)
MXFP8 = {"group_size": 32, "bits": 8, "mode": "mxfp8"}
_SCALE_INV = ".weight_scale_inv"
_SCALE = ".weight_scale"


def _source_quantization(config: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``quantization_config`` (top level, else its text config's; {}: none)."""
    found = config.get("quantization_config") or config.get("text_config", {}).get(
        "quantization_config"
    )
    return found if isinstance(found, dict) else {}


def _check_block_fp8(config: dict[str, Any]) -> None:
    """``ValueError`` where the config declares an fp8 layout this loader does not read (another
    block size or code format); a config silent on it is read as DeepSeek's, as mlx-lm's
    DeepSeek ``sanitize`` reads a ``weight_scale_inv``."""
    source = _source_quantization(config)
    if source.get("quant_method") != "fp8":
        return
    block, fmt = source.get("weight_block_size"), source.get("fmt", "e4m3")
    if block != [FP8_BLOCK, FP8_BLOCK] or fmt != "e4m3":
        raise ValueError(
            f"the checkpoint's fp8 MTP weights are {fmt} in blocks of {block}: only e4m3 in "
            f"{FP8_BLOCK} x {FP8_BLOCK} blocks is read"
        )


def is_mxfp8(config: dict[str, Any]) -> bool:
    """Whether the checkpoint's weights are ModelOpt's mxfp8."""
    source = _source_quantization(config)
    return source.get("quant_method") == "modelopt" and source.get("quant_algo") == "MXFP8"


def mtp_quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    """MLX's quantization of the checkpoint's MTP layer: a converted checkpoint's
    ``quantization``, mxfp8 for a ModelOpt mxfp8 one (None: float)."""
    converted: dict[str, Any] | None = config.get("quantization")
    if converted is None and is_mxfp8(config):
        return dict(MXFP8)
    return converted


def dequantized_blocks(weights: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    """``weights`` with every block-fp8 weight (one with a ``weight_scale_inv``) dequantized, in
    the dtype of the other float weights (bfloat16 when there are none); ``config`` the
    checkpoint's."""
    import mlx.core as mx

    scaled = [k.removesuffix(_SCALE_INV) for k in weights if k.endswith(_SCALE_INV)]
    if not scaled:
        return weights
    _check_block_fp8(config)
    dtype = next(
        (v.dtype for k, v in weights.items() if mx.issubdtype(v.dtype, mx.floating)
         and not k.endswith(_SCALE_INV)),
        mx.bfloat16,
    )  # fmt: skip
    out = dict(weights)
    for name in scaled:
        scale_inv = out.pop(name + _SCALE_INV)
        out[name + ".weight"] = _dequantized(out[name + ".weight"], scale_inv).astype(dtype)
    return out


def _dequantized(codes: mx.array, scale_inv: mx.array) -> mx.array:
    """A ``[rows, cols]`` weight of e4m3 ``codes`` times its 128 x 128 block's ``scale_inv``
    (``[ceil(rows / 128), ceil(cols / 128)]``), in float32."""
    import mlx.core as mx

    rows, cols = codes.shape if codes.ndim == 2 else (0, 0)
    grid = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    if rows == 0 or tuple(scale_inv.shape) != grid:
        raise ValueError(
            f"an fp8 weight of shape {tuple(codes.shape)} needs block scales of shape {grid}, "
            f"got {tuple(scale_inv.shape)}"
        )
    values = mx.from_fp8(codes.view(mx.uint8), dtype=mx.float32)
    scales = mx.repeat(mx.repeat(scale_inv.astype(mx.float32), FP8_BLOCK, 0), FP8_BLOCK, 1)
    return values * scales[:rows, :cols]


def as_mxfp8_layers(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """``weights`` with every mxfp8 weight (one with a ``weight_scale``) as MLX's mxfp8 layer
    holds it: the codes viewed as uint32 (four per element), the scales as ``scales``."""
    import mlx.core as mx

    out = dict(weights)
    for key in [k for k in weights if k.endswith(_SCALE)]:
        name = key.removesuffix(_SCALE)
        out[name + ".scales"] = out.pop(key)
        out[name + ".weight"] = out[name + ".weight"].view(mx.uint8).view(mx.uint32)
    return out
