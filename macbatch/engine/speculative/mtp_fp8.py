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
  through that ``sanitize`` (``mtp_weights._sanitized_by_target``); ``as_mx_layers`` packs
  what it drops and the loader keeps (``eh_proj``).
- DeepSeek V4's release (``quant_method`` "fp8", ``scale_fmt`` "ue8m0"): a ``.scale`` of
  power-of-two (ue8m0) bytes beside each quantized ``weight``, as mlx-vlm's ``deepseek_v4``
  ``sanitize`` reads it: its routed experts fp4 (e2m1 codes two to a byte, a scale per 32
  inputs: MLX's mxfp4), the rest e4m3 in 128 x 128 blocks (a scale per block, which is MLX's
  mxfp8 with each block's byte repeated over its groups of 32: no value changes). Both kept as
  MLX's quantized layers (``as_mx_layers``), before the drafter's ``sanitize`` stacks them.
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
_V4_SCALE = ".scale"
MX_GROUP = 32


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


def is_ue8m0_fp8(config: dict[str, Any]) -> bool:
    """Whether the checkpoint's weights are DeepSeek V4's release format (fp8 blocks and fp4
    experts, power-of-two scales)."""
    source = _source_quantization(config)
    return source.get("quant_method") == "fp8" and source.get("scale_fmt") == "ue8m0"


def mtp_quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    """MLX's quantization of the checkpoint's MTP layer: a converted checkpoint's
    ``quantization``, mxfp8 for a ModelOpt mxfp8 or DeepSeek V4 one (each layer's own mode,
    mxfp4 or mxfp8, read from its weights' shapes; None: float)."""
    converted: dict[str, Any] | None = config.get("quantization")
    if converted is None and (is_mxfp8(config) or is_ue8m0_fp8(config)):
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


def as_mx_layers(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """``weights`` with every mxfp8 weight (one with a ModelOpt ``weight_scale``) and every
    DeepSeek V4 one (a ``.scale`` beside a byte ``weight``) as MLX's mxfp4 / mxfp8 layer holds
    it: the codes viewed as uint32, the scales one byte per 32 inputs as ``scales``."""
    import mlx.core as mx

    out = dict(weights)
    for key in [k for k in weights if k.endswith((_SCALE, _V4_SCALE))]:
        name = key.removesuffix(_SCALE).removesuffix(_V4_SCALE)
        codes = out.get(name + ".weight")
        if codes is None or codes.dtype not in (mx.uint8, mx.int8):
            continue  # not a quantization scale
        scales = out.pop(key)
        if key.endswith(_V4_SCALE):
            scales = _per_group(codes, scales)
        out[name + ".scales"] = scales
        out[name + ".weight"] = codes.view(mx.uint8).view(mx.uint32)
    return out


def _per_group(codes: mx.array, scales: mx.array) -> mx.array:
    """DeepSeek V4's ``scales`` of a ``[rows, bytes]`` weight as one byte per 32 inputs: fp4's
    as stored (``[rows, bytes / 16]``), fp8's 128 x 128 blocks' (``[ceil(rows / 128),
    ceil(bytes / 128)]``) repeated over their rows and groups."""
    import mlx.core as mx

    if scales.dtype != mx.uint8:
        raise ValueError(f"DeepSeek V4's fp8 / fp4 scales are ue8m0 bytes, got {scales.dtype}")
    rows, width = codes.shape[-2:]
    if scales.shape[-2:] == (rows, width * 2 // MX_GROUP):
        return scales
    grid = (-(-rows // FP8_BLOCK), -(-width // FP8_BLOCK))
    if scales.shape[-2:] != grid or width % MX_GROUP:
        raise ValueError(
            f"a quantized weight of {tuple(codes.shape)} bytes needs fp4 scales of "
            f"{(rows, width * 2 // MX_GROUP)} or fp8 block scales of {grid}, got "
            f"{tuple(scales.shape)}"
        )
    groups = mx.repeat(mx.repeat(scales, FP8_BLOCK, -2), FP8_BLOCK // MX_GROUP, -1)
    return groups[..., :rows, : width // MX_GROUP]
