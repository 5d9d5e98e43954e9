"""An MTP layer's weights as real checkpoints store them in 8-bit floats (Hunyuan V4's mxfp8,
Qwen4-exp's block fp8), encoded by the float64 numpy oracle of the formats
(tests/support/fp8_weights_numpy.py), with what the loader should make of them."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from tests.support.fp8_weights_numpy import (
    FP8_BLOCK,
    MX_BLOCK,
    block_fp8,
    mxfp4,
    mxfp8,
    ue8m0_block_fp8,
)

# the config.json ``quantization_config`` of each format's checkpoints (the fields mlx-vlm
# 0.7.10 reads: ``fp8.make_quantization_config``, and ModelOpt's method and algorithm)
BLOCK_FP8_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
    "activation_scheme": "dynamic",
}
MXFP8_CONFIG = {"quant_method": "modelopt", "quant_algo": "MXFP8"}
# DeepSeek V4's release: its block fp8's scales E8M0 bytes
V4_RELEASE_CONFIG = {**BLOCK_FP8_CONFIG, "scale_fmt": "ue8m0"}
# weights real checkpoints keep in float: norms, the MoE router, the hyper-connection mixes, and
# MLA's per-head up-projections (stored as one kv_b_proj, whose 16-wide tiny heads fit no block)
_FLOAT = ("norm", "mlp.gate.", "ffn.gate.", "shared_expert_gate", "hyper_connection", "embed_q",
          "unembed_out")  # fmt: skip


@dataclass(frozen=True)
class Fp8Layer:
    """An MTP layer in one of the formats (every name ``MtpHead``'s)."""

    stored: dict[str, mx.array]  # the checkpoint's tensors: codes and their scales beside them
    expected: dict[str, mx.array]  # the MTP layer's parameters once loaded
    values: dict[str, np.ndarray]  # each encoded weight's value by the oracle (float64)


def _encoded(name: str, value: mx.array) -> bool:
    return (
        name.endswith(".weight")
        and value.ndim in (2, 3)
        and value.shape[-1] % 32 == 0
        and not any(part in name for part in _FLOAT)
    )


def mxfp8_layer(weights: dict[str, mx.array]) -> Fp8Layer:
    """``weights`` in mxfp8: each projection's codes with a ``weight_scale`` (E8M0 bytes per 32
    inputs); loaded as MLX's mxfp8 layers (the codes four to a uint32, the bytes ``scales``)."""
    stored, expected, values = dict(weights), dict(weights), {}
    for name, value in weights.items():
        if _encoded(name, value):
            codes, scales, values[name] = mxfp8(np.array(value, np.float64))
            prefix = name.removesuffix(".weight")
            stored[name], stored[prefix + ".weight_scale"] = mx.array(codes), mx.array(scales)
            expected[name] = mx.array(codes).view(mx.uint32)
            expected[prefix + ".scales"] = mx.array(scales)
    return Fp8Layer(stored, expected, values)


def block_fp8_layer(weights: dict[str, mx.array]) -> Fp8Layer:
    """``weights`` in block fp8: each projection's codes with a ``weight_scale_inv`` (float32
    per 128 x 128 block; stacked experts each their own); loaded dequantized, in float32."""
    stored, expected, values = dict(weights), dict(weights), {}
    for name, value in weights.items():
        if _encoded(name, value):
            matrices = np.array(value, np.float64).reshape(-1, *value.shape[-2:])
            encoded = [block_fp8(m) for m in matrices]
            codes, scale_inv, dequantized = (
                np.stack([e[i] for e in encoded]).reshape(*value.shape[:-2], *encoded[0][i].shape)
                for i in range(3)
            )
            stored[name], stored[name + "_scale_inv"] = mx.array(codes), mx.array(scale_inv)
            values[name] = dequantized
            expected[name] = mx.array(dequantized.astype(np.float32))
    return Fp8Layer(stored, expected, values)


def v4_release_layer(weights: dict[str, mx.array]) -> Fp8Layer:
    """DeepSeek V4's MTP layer ``weights`` as its release stores them: the routed experts
    (``switch_mlp``) in mxfp4 (codes two to a byte, typed I8, a ``.scale`` byte per 32 inputs),
    the other projections in block fp8 (a ``.scale`` byte per 128 x 128 block of the stored
    matrix: ``wo_a`` flat); loaded as MLX's mxfp4 / mxfp8 layers."""
    stored, expected, values = dict(weights), dict(weights), {}
    for name, value in weights.items():
        if not _encoded(name, value):
            continue
        prefix = name.removesuffix(".weight")
        w = np.array(value, np.float64)
        if ".switch_mlp." in name:
            codes, scales, values[name] = mxfp4(w)
            stored[name] = mx.array(codes.view(np.int8))
            groups = scales
        else:
            codes, scales, flat = ue8m0_block_fp8(w.reshape(-1, w.shape[-1]))
            values[name] = flat.reshape(w.shape)
            stored[name] = mx.array(codes)
            rows = np.repeat(scales, FP8_BLOCK, 0)[: codes.shape[0]]
            groups = np.repeat(rows, FP8_BLOCK // MX_BLOCK, 1)[:, : w.shape[-1] // MX_BLOCK]
            groups = groups.reshape(*w.shape[:-1], -1)
        stored[prefix + ".scale"] = mx.array(scales)
        expected[name] = mx.array(codes.view(np.uint8).reshape(*w.shape[:-1], -1)).view(mx.uint32)
        expected[prefix + ".scales"] = mx.array(groups)
    return Fp8Layer(stored, expected, values)


@dataclass(frozen=True)
class Encoding:
    """One of the formats: how it stores a layer's weights, and the config that declares it."""

    layer: Callable[[dict[str, mx.array]], Fp8Layer]
    quantization_config: dict[str, Any]


MXFP8 = Encoding(mxfp8_layer, MXFP8_CONFIG)
BLOCK_FP8 = Encoding(block_fp8_layer, BLOCK_FP8_CONFIG)


def assert_dequantized(head: nn.Module, layer: Fp8Layer) -> None:
    """Every encoded weight of the loaded ``head`` stands for the oracle's value exactly: a
    quantized layer's as MLX dequantizes it by the layer's own mode, a float one's as held."""
    modules = dict(head.named_modules())
    params = dict(tree_flatten(head.parameters()))
    for name, want in layer.values.items():
        module = modules[name.removesuffix(".weight")]
        if hasattr(module, "scales"):
            got = mx.dequantize(
                module.weight,
                module.scales,
                None,
                group_size=module.group_size,
                bits=module.bits,
                mode=module.mode,
                dtype=mx.float32,
            )
        else:
            got = params[name].astype(mx.float32)
        assert np.array_equal(np.array(got), want.astype(np.float32)), name


def mark_e4m3(file: Path) -> None:
    """The safetensors ``file``'s uint8 weights (not the scales) typed F8_E4M3 in its header
    (DeepSeek V4's ``.scale`` bytes F8_E8M0), as real fp8 checkpoints type them
    (``mx.save_safetensors`` writes only MLX's dtypes)."""
    raw = file.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    for key, entry in header.items():
        if key == "__metadata__" or entry["dtype"] != "U8":
            continue
        if key.endswith(".scale"):  # DeepSeek V4's: E8M0 bytes
            entry["dtype"] = "F8_E8M0"
        elif not key.endswith("_scale"):
            entry["dtype"] = "F8_E4M3"
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    file.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + size :])
