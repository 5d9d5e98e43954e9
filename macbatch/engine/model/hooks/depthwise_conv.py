"""Depthwise causal convolutions of recurrent layers as shifted sums, for the CPU's prefill.

Every recurrent layer mlx-lm has (Gated DeltaNet, Mamba 2, LFM2's short convolution) runs its
input through an ``nn.Conv1d`` with one group per channel and a kernel of 3 or 4 taps. MLX's CPU
convolution takes such a conv one channel group at a time: measured on this machine, 0.59 s for
2,048 tokens of 4,096 channels, where the same function as ``kernel`` multiply-adds of shifted
views takes 0.16 s (it was a third of a Qwen3.5-shaped layer's prefill). Inside the engine's
recurrent prefill (``gated_delta.prefill``) and without Metal, those convs compute that way;
everywhere else (mlx-lm's own generation in the same process, a Mac's GPU) they are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.model import state_cut
from macbatch.engine.model.hooks import gated_delta


class ShiftedConv1d(nn.Conv1d):
    """An ``nn.Conv1d`` (depthwise, unpadded, stride and dilation 1) whose prefill on the CPU
    is ``sum_i x[t + i] * w[i]``: the same function, summed in float32."""

    def __call__(self, x: mx.array) -> mx.array:
        if (cut := state_cut.current()) is not None:
            cut.conv_inputs.append(x)  # the window after the cut is a slice of it
        taps = self.weight.shape[1]
        if not gated_delta.active() or gated_delta.on_gpu() or x.shape[1] < 2 * taps:
            return super().__call__(x)
        length = x.shape[1] - taps + 1
        wide = x.astype(mx.float32)
        weight = self.weight[:, :, 0].T.astype(mx.float32)  # [taps, channels]
        y = wide[:, :length] * weight[0]
        for i in range(1, taps):
            y = y + wide[:, i : i + length] * weight[i]
        if "bias" in self:
            y = y + self.bias
        return y.astype(x.dtype)


def install(layers: Sequence[Any]) -> None:
    """Swap every depthwise ``nn.Conv1d`` inside ``layers`` for ``ShiftedConv1d`` (its class
    only: the parameters and their names stay)."""
    for layer in layers:
        for _, module in layer.named_modules():
            if type(module) is nn.Conv1d and _depthwise(module):
                module.__class__ = ShiftedConv1d


def _depthwise(conv: nn.Conv1d) -> bool:
    channels = conv.weight.shape[0]
    plain = conv.padding == 0 and conv.stride == 1 and conv.dilation == 1
    return plain and conv.groups == channels and conv.weight.shape[2] == 1
