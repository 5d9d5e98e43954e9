"""An adapted linear layer of a packed step: the base layer (float or quantized) as it is, plus
each row's adapter's low-rank product.

Every adapter the runner holds has a slot in the layer's stacked ``lora_a`` ``[S, in, r]`` and
``lora_b`` ``[S, r, out]`` (slot 0, the base model, and any adapter that leaves this layer
alone, are zeros), and the step's rows name their slots (``StepAdapters.rows``). Two
``mx.gather_mm`` calls add every row's product at once: no sorting, no per-adapter loop, one
graph whatever mix of adapters the step holds (measured against a matmul per adapter segment
and a masked concatenation of every adapter on CPU: docs/models.md, "Fine-tunes"). A step
without adapter rows runs the base layer alone."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


class StepAdapters:
    """The step's row -> adapter slot, ``[N]`` uint32 (None: every row is the base model's), set
    by the runner before each forward and read by every adapted layer as the graph is built."""

    rows: mx.array | None = None


class PackedLoRALinear(nn.Module):
    """Wraps a ``nn.Linear`` / ``nn.QuantizedLinear``; the weights are the bank's."""

    def __init__(self, base: nn.Module, step: StepAdapters) -> None:
        super().__init__()
        self.base = base
        self.step = step
        self.lora_a: mx.array | None = None  # [S, in, r]
        self.lora_b: mx.array | None = None  # [S, r, out]
        # DoRA: per slot, the learned norm over the adapted weight's norm (ones for LoRA slots)
        self.dora_factor: mx.array | None = None  # [S, out]

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        rows = self.step.rows
        if rows is None or self.lora_a is None or self.lora_b is None:
            return y
        flat = x.reshape(rows.shape[0], -1, x.shape[-1])  # [N, M, in]: M inputs of each row
        z = mx.gather_mm(flat, self.lora_a, rhs_indices=rows)
        delta = mx.gather_mm(z, self.lora_b, rhs_indices=rows).reshape(y.shape)
        if self.dora_factor is None:
            return y + delta.astype(y.dtype)
        factor = self.dora_factor[rows].reshape(rows.shape[0], *([1] * (y.ndim - 2)), -1)
        bias = self.base.get("bias")
        unbiased = y if bias is None else y - bias
        out = (factor * (unbiased + delta)).astype(y.dtype)
        return out if bias is None else out + bias


def base_weight(linear: Any) -> mx.array:
    """A linear layer's weight ``[out, in]``, dequantized when it is quantized."""
    if isinstance(linear, nn.QuantizedLinear):
        return mx.dequantize(
            linear.weight,
            linear.scales,
            linear.biases,
            group_size=linear.group_size,
            bits=linear.bits,
            mode=linear.mode,
        )
    return linear.weight


def base_dims(linear: Any) -> tuple[int, int]:
    """``(in, out)`` of a float or quantized linear layer."""
    out, packed = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        return packed * 32 // linear.bits, out
    return packed, out
