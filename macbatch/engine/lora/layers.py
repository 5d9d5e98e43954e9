"""The adapted layers of a packed step: the base layer (float or quantized) as it is, plus each
row's adapter's low-rank product.

A linear layer's ``x A`` comes from its group's ``SharedInput`` (dense, one matmul for the
projections that read the same input, each row masked to its own adapter); its ``B`` stack
``[C, r, out]`` (one per adapter slot 1.., zeros where an adapter leaves it alone) flattened
to ``[C * r, out]`` sums just that adapter's part. A step without adapter rows runs the base
layer alone. An MoE block's experts keep one low rank per (slot, expert), indexed per pair
with ``mx.gather_mm``, which the block's own expert matmuls already are."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.lora.shared_input import SharedInput, StepAdapters


class PackedLoRALinear(nn.Module):
    """Wraps a ``nn.Linear`` / ``nn.QuantizedLinear``; the weights are the bank's: its member
    index in ``shared`` (None: no adapter adapts it) and its ``B`` stack."""

    def __init__(self, base: nn.Module, shared: SharedInput) -> None:
        super().__init__()
        self.base = base
        self.shared = shared
        self.member: int | None = None
        self.lora_b: mx.array | None = None  # [C, r, out]
        # DoRA: per slot, the learned norm over the adapted weight's norm (ones for LoRA slots)
        self.dora_factor: mx.array | None = None  # [S, out]

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        step = self.shared.step
        rows = step.rows
        if rows is None or self.lora_b is None or self.member is None:
            return y
        z = self.shared.product(x, self.member)
        b = self.lora_b if step.present is None else mx.take(self.lora_b, step.present, axis=0)
        b = b.reshape(-1, b.shape[-1])
        z = z.reshape(-1, b.shape[0])  # 2-D: MLX's addmm over [N, 1, .] runs N 1-row matmuls
        if self.dora_factor is None:  # y + z b in the one matmul: a pass over y less
            out = mx.addmm(y.reshape(-1, y.shape[-1]), z, b).reshape(y.shape)
            return out if out.dtype == y.dtype else out.astype(y.dtype)
        delta = (z @ b).reshape(y.shape)
        factor = self.dora_factor[rows].reshape(rows.shape[0], *([1] * (y.ndim - 2)), -1)
        bias = self.base.get("bias")
        unbiased = y if bias is None else y - bias
        out = (factor * (unbiased + delta)).astype(y.dtype)
        return out if bias is None else out + bias


class PackedExperts(nn.Module):
    """Wraps an MoE block (mlx-lm's ``SwitchGLU`` / ``SwitchMLP``) whose experts are adapted: it
    runs the block as it is, telling its projections each expert index's slot. The block sorts
    a large step's (row, expert) pairs by expert with ``argsort``; the same argsort of the same
    indices here gives the order, so each sorted pair's row is known."""

    def __init__(self, inner: nn.Module, step: StepAdapters) -> None:
        super().__init__()
        self.inner = inner
        self.step = step

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        rows = self.step.rows
        if rows is None:
            return self.inner(x, indices)
        per_row = rows.reshape(rows.shape[0], *([1] * (indices.ndim - 1)))
        # a slot per row of x flattened as the block flattens it (all axes but the last)
        per_x = mx.broadcast_to(per_row, indices.shape[:-1] + (1,)).flatten()
        order = mx.argsort(indices.flatten())
        self.step.expert_slots = (per_row, per_x[order // indices.shape[-1]])
        try:
            return self.inner(x, indices)
        finally:
            self.step.expert_slots = None


class PackedLoRASwitch(nn.Module):
    """Wraps an MoE block's ``SwitchLinear`` / ``QuantizedSwitchLinear``: every (adapter slot,
    expert) pair has its low rank at ``slot * E + expert`` of the stacks ``[S * E, in, r]`` and
    ``[S * E, r, out]``, as mlx-lm's ``LoRASwitchLinear`` keeps one per expert."""

    def __init__(self, base: nn.Module, step: StepAdapters) -> None:
        super().__init__()
        self.base = base
        self.step = step
        self.lora_a: mx.array | None = None
        self.lora_b: mx.array | None = None

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        y = self.base(x, indices, sorted_indices=sorted_indices)
        slots = self.step.expert_slots
        if slots is None or self.lora_a is None or self.lora_b is None:
            return y
        pairs = slots[1 if sorted_indices else 0] * self.base.num_experts + indices
        z = mx.gather_mm(x, self.lora_a, rhs_indices=pairs)  # sorted by expert, not by pair
        return y + mx.gather_mm(z, self.lora_b, rhs_indices=pairs).astype(y.dtype)


def is_switch(module: Any) -> bool:
    """Whether ``module`` is an MoE block's experts (one linear layer per expert)."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    return isinstance(module, (SwitchLinear, QuantizedSwitchLinear))


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
    """``(in, out)`` of a float or quantized linear layer (or an MoE block's experts)."""
    if is_switch(linear):
        return linear.input_dims, linear.output_dims
    out, packed = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        return packed * 32 // linear.bits, out
    return packed, out
