"""The engine's vectorized logistic function (``cpu_activations``) against float64 numpy, and
its routing: mlx-lm's model modules get it only inside the engine's recurrent layers."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from macbatch.engine.model.hooks import cpu_activations, gated_delta
from tests.support.tiny import build_model


def _inputs() -> mx.array:
    rng = np.random.default_rng(0)
    edges = [-1e4, -100.0, -88.0, -87.5, -20.0, -1e-8, 0.0, 1e-8, 0.3465, 20.0, 88.0, 1e4]
    values = np.concatenate([rng.standard_normal(20000) * 6, np.linspace(-30, 30, 6001), edges])
    return mx.array(values.astype(np.float32))


def test_sigmoid_within_float32_rounding_of_float64() -> None:
    x = _inputs()
    wide = np.array(x, dtype=np.float64)
    with np.errstate(over="ignore"):  # e^10000: inf, and 1 / inf = 0 is the value
        want = 1.0 / (1.0 + np.exp(-wide))
    got = np.array(cpu_activations.sigmoid(x), dtype=np.float64)
    assert np.abs(got - want).max() < 1.2e-7  # absolute: float32 spacing near 1 is 6e-8
    normal = want > 1e-37  # relative where float32 holds the value as a normal number
    assert (np.abs(got - want)[normal] / want[normal]).max() < 4e-7
    silu = np.array(cpu_activations.silu(x), dtype=np.float64)
    np.testing.assert_allclose(silu, wide * want, rtol=4e-7, atol=1e-30)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision_rounds_like_mlx(dtype) -> None:
    """Computed in float32 and rounded once: within one step of the type's spacing of MLX's."""
    x = _inputs().astype(dtype)
    ours = np.array(cpu_activations.sigmoid(x).astype(mx.float32))
    theirs = np.array(mx.sigmoid(x).astype(mx.float32))
    spacing = 2.0**-10 if dtype == mx.float16 else 2.0**-7
    assert np.abs(ours - theirs).max() <= spacing / 2 + 1e-9
    assert cpu_activations.sigmoid(x).dtype == dtype


@pytest.mark.skipif(gated_delta.on_gpu(), reason="on a Mac's GPU MLX's own functions run")
def test_model_modules_route_here_only_inside_the_engine_step() -> None:
    build_model("qwen3_5")  # imports mlx-lm's qwen3_5 and qwen3_next modules
    cpu_activations.install()
    from mlx_lm.models import activations, qwen3_5, qwen3_next

    gate, x = _inputs()[None], mx.ones((1, _inputs().shape[0]))
    outside = np.array(qwen3_next.swiglu(gate, x))
    np.testing.assert_array_equal(outside, np.array(activations.swiglu(gate, x)))
    np.testing.assert_array_equal(np.array(qwen3_5.nn.silu(gate)), np.array(nn.silu(gate)))
    with gated_delta.decode():
        inside = np.array(qwen3_next.swiglu(gate, x))
        silu = np.array(qwen3_5.nn.silu(gate))
    np.testing.assert_array_equal(inside, np.array(cpu_activations.silu(gate)))
    np.testing.assert_array_equal(silu, inside)
    assert qwen3_5.nn.Linear is nn.Linear  # everything else is mlx.nn's
