"""Depthwise convolutions as shifted sums (the CPU prefill's) against MLX's own ``conv1d``."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from macbatch.engine.model.hooks import depthwise_conv, gated_delta


@pytest.mark.parametrize(("taps", "bias", "dtype"), [(4, False, mx.float32), (3, True, mx.float32),
                                                      (4, True, mx.bfloat16)])  # fmt: skip
def test_shifted_sums_equal_the_convolution(taps: int, bias: bool, dtype: mx.Dtype) -> None:
    mx.random.seed(taps)
    conv = nn.Conv1d(48, 48, taps, groups=48, bias=bias)
    conv.set_dtype(dtype)
    x = mx.random.normal((2, 37, 48)).astype(dtype)
    want = conv(x)
    layer = nn.Sequential(conv)
    depthwise_conv.install([layer])
    assert type(conv) is depthwise_conv.ShiftedConv1d
    with gated_delta.prefill():
        got = conv(x)
    tolerance = 1e-5 if dtype == mx.float32 else 1e-2
    got_32, want_32 = np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))
    np.testing.assert_allclose(got_32, want_32, rtol=tolerance, atol=tolerance)
    assert got.dtype == dtype and got.shape == want.shape


def test_only_depthwise_unpadded_convs_are_swapped() -> None:
    dense, padded = nn.Conv1d(8, 8, 3), nn.Conv1d(8, 8, 3, groups=8, padding=1)
    depthwise_conv.install([nn.Sequential(dense, padded)])
    assert type(dense) is nn.Conv1d and type(padded) is nn.Conv1d
