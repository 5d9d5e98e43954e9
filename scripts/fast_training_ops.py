"""Faster stand-ins for the ops of the demo model's training step on MLX's CPU backend.

On x86 MLX computes `exp` (and so sigmoid and softmax) one element at a time, about 17 ns an
element against 1 ns for an add, and its attention fallback scores every query against every key,
the half the causal mask then hides included. With conversations of up to 512 tokens attention is
most of a training step. These stand-ins compute the same functions to float32 rounding:

- `exp` by range reduction and a polynomial, from adds and multiplies that `mx.compile` fuses;
- causal attention by blocks of queries, each scored against the keys up to its own last one.

`fast_training_ops()` puts them into mlx-lm's llama module for the forward passes of training
only (no KV cache); generation and the saved model use mlx-lm's own ops untouched.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx_lm.models.llama as llama

# 2**f for f in [-0.5, 0.5]: the Taylor series of e**(f ln 2) to degree 7, within float32 rounding.
_EXP2_COEFFICIENTS = [math.log(2) ** k / math.factorial(k) for k in range(8)]
_FLOAT32_EXPONENT_BIAS = 127
_FLOAT32_MANTISSA_BITS = 23
# Scores hidden by the causal mask: their weight is under 1e-37, next to the row's largest, 1.
_MASKED = -1e9
# Queries per attention block: smaller blocks skip more masked scores but add ops per step.
QUERY_BLOCK = 64


@mx.custom_function
def fast_exp(x: mx.array) -> mx.array:
    """e**x for float32 x from -87 to 87 as mx.exp computes it, up to rounding (relative error
    under 2e-6 for |x| <= 10, under 1e-5 at the ends, where x * log2(e) itself rounds); below,
    under 1e-37; above, it stays at about 1e38 (its uses take e**x of x <= 0, or of -x in a
    sigmoid, where the difference is below float32's resolution)."""
    y = mx.clip(x * math.log2(math.e), -126.0, 126.0)
    whole = mx.floor(y + 0.5)
    fraction = y - whole
    power = _EXP2_COEFFICIENTS[-1]
    for coefficient in reversed(_EXP2_COEFFICIENTS[:-1]):
        power = power * fraction + coefficient
    scale_bits = (whole.astype(mx.int32) + _FLOAT32_EXPONENT_BIAS) << _FLOAT32_MANTISSA_BITS
    return power * scale_bits.view(mx.float32)


@fast_exp.vjp
def _fast_exp_vjp(primals, cotangent, output):
    return (cotangent * output,)


@mx.custom_function
def fast_softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis."""
    e = fast_exp(x - x.max(axis=-1, keepdims=True))
    return e * mx.reciprocal(e.sum(axis=-1, keepdims=True))


@fast_softmax.vjp
def _fast_softmax_vjp(primals, cotangent, output):
    return (output * (cotangent - (cotangent * output).sum(axis=-1, keepdims=True)),)


def fast_swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x, as mlx-lm's llama MLP computes it."""
    return gate * mx.reciprocal(1.0 + fast_exp(-gate)) * x


def fast_cross_entropy(logits: mx.array, targets: mx.array) -> mx.array:
    """Per-token cross-entropy, as `nn.losses.cross_entropy` with its defaults."""
    top = mx.stop_gradient(logits.max(axis=-1, keepdims=True))
    log_sum = mx.log(fast_exp(logits - top).sum(axis=-1)) + top.squeeze(-1)
    return log_sum - mx.take_along_axis(logits, targets[..., None], axis=-1).squeeze(-1)


def causal_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
    """Causal attention of a whole sequence (no cache), by blocks of `QUERY_BLOCK` queries."""
    length = queries.shape[-2]
    blocks = []
    for start in range(0, length, QUERY_BLOCK):
        end = min(length, start + QUERY_BLOCK)
        scores = (queries[..., start:end, :] * scale) @ keys[..., :end, :].swapaxes(-1, -2)
        visible = mx.arange(start, end)[:, None] >= mx.arange(end)[None]
        weights = fast_softmax(mx.where(visible, scores, _MASKED))
        blocks.append(weights @ values[..., :end, :])
    return mx.concatenate(blocks, axis=-2)


def _training_attention(original):
    def attention(queries, keys, values, cache, scale, mask, sinks=None):
        if cache is None and sinks is None and isinstance(mask, str) and mask == "causal":
            return causal_attention(queries, keys, values, scale)
        return original(queries, keys, values, cache, scale, mask, sinks)

    return attention


@contextmanager
def fast_training_ops() -> Iterator[None]:
    """Within: mlx-lm's llama computes silu and cache-less attention with the ops above. Wrap
    the calls of a compiled training step (it is traced on its first call per shape)."""
    saved = llama.swiglu, llama.scaled_dot_product_attention
    llama.swiglu = fast_swiglu
    llama.scaled_dot_product_attention = _training_attention(saved[1])
    try:
        yield
    finally:
        llama.swiglu, llama.scaled_dot_product_attention = saved
