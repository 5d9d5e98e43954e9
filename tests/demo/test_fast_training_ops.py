"""The training step's faster ops (scripts/fast_training_ops.py) compute what mlx's own ops do.

Oracles: numpy in float64 for exp, softmax and causal attention; mlx-lm's llama with MLX's own
ops for the whole model's loss and gradients; MLX's own VJPs for the gradients of the pieces.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ops():
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield load_script("fast_training_ops")
    finally:
        sys.path.remove(str(SCRIPTS))


def random_array(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed)) * scale


def test_exp_matches_float64_over_the_float32_range(ops):
    x = mx.concatenate([mx.linspace(-87.0, 87.0, 100_001), random_array((10_000,), 0, 3.0)])
    got = np.array(ops.fast_exp(x), dtype=np.float64)
    want = np.exp(np.array(x, dtype=np.float64))
    error = np.abs(got - want) / want
    # x * log2(e) rounds in float32: ~|x| * 6e-8 of relative error at the ends, as in mx.exp.
    assert error.max() < 1e-5
    assert error[np.abs(np.array(x)) <= 10].max() < 2e-6
    # Far below the float32 range (a masked score): nothing, next to a row's weight of 1.
    assert np.array(ops.fast_exp(mx.array([-1e9, -200.0]))).max() < 1e-37


def test_exp_gradient_is_exp(ops):
    x = random_array((64,), 1, 2.0)
    grad = mx.grad(lambda v: (ops.fast_exp(v) * mx.arange(64)).sum())(x)
    assert np.allclose(np.array(grad), np.exp(np.array(x, np.float64)) * np.arange(64), rtol=2e-6)


def test_softmax_matches_float64_and_its_gradient_mlx(ops):
    x = random_array((3, 5, 77), 2, 4.0)
    x64 = np.array(x, np.float64)
    want = np.exp(x64 - x64.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    assert np.allclose(np.array(ops.fast_softmax(x)), want, rtol=1e-5, atol=1e-7)
    weights = random_array(x.shape, 3)
    fast = mx.grad(lambda v: (ops.fast_softmax(v) * weights).sum())(x)
    exact = mx.grad(lambda v: (mx.softmax(v, axis=-1) * weights).sum())(x)
    assert mx.allclose(fast, exact, rtol=1e-4, atol=1e-6).item()


def test_swiglu_and_cross_entropy_match_mlx(ops):
    gate, x = random_array((4, 9, 48), 4, 3.0), random_array((4, 9, 48), 5)
    assert mx.allclose(ops.fast_swiglu(gate, x), nn.silu(gate) * x, rtol=1e-5, atol=1e-6).item()
    logits, targets = random_array((4, 9, 259), 6, 5.0), mx.arange(36).reshape(4, 9) * 7
    fast = ops.fast_cross_entropy(logits, targets)
    assert mx.allclose(fast, nn.losses.cross_entropy(logits, targets), rtol=1e-5).item()


def numpy_causal_attention(q, k, v, scale):
    q, k, v = (np.array(a, np.float64) for a in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) * scale
    length = scores.shape[-1]
    scores[..., np.triu(np.ones((length, length), bool), 1)] = -np.inf
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("length", [1, 50, 64, 150])  # within, at and past a block's edge
def test_causal_attention_matches_float64_and_mlx_gradients(ops, length):
    q, k, v = (random_array((2, 4, length, 32), seed) for seed in (7, 8, 9))
    scale = 32**-0.5
    got = ops.causal_attention(q, k, v, scale)
    assert np.allclose(np.array(got), numpy_causal_attention(q, k, v, scale), atol=1e-5)
    weights = random_array(got.shape, 10)

    def loss(attention):
        return lambda q, k, v: (attention(q, k, v) * weights).sum()

    exact = mx.grad(
        loss(
            lambda q, k, v: mx.fast.scaled_dot_product_attention(
                q, k, v, scale=scale, mask="causal"
            )
        ),
        argnums=(0, 1, 2),
    )(q, k, v)
    fast = mx.grad(loss(lambda q, k, v: ops.causal_attention(q, k, v, scale)), argnums=(0, 1, 2))(
        q, k, v
    )
    for a, b in zip(exact, fast):
        assert mx.allclose(a, b, rtol=1e-4, atol=1e-5).item()


def test_model_loss_and_gradients_match_mlx_lm(ops):
    """The whole training forward (300 tokens: several attention blocks) against mlx-lm's llama
    with MLX's own ops; a cached forward (generation) still works inside the context, and the
    context puts mlx-lm's functions back."""
    import mlx_lm.models.llama as llama
    from mlx_lm.models.cache import make_prompt_cache

    script = load_script("train_demo_model")
    config = dict(script.MODEL_CONFIG, vocab_size=259)
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    tokens = mx.random.randint(0, 259, (2, 301), key=mx.random.key(11))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask = (mx.random.uniform(shape=inputs.shape, key=mx.random.key(12)) < 0.3).astype(mx.float32)
    count = mask.sum()

    exact = nn.value_and_grad(model, script.loss_fn)(model, inputs, targets, mask, count)
    originals = llama.swiglu, llama.scaled_dot_product_attention
    with ops.fast_training_ops():
        loss = lambda *a: script.loss_fn(*a, per_token=ops.fast_cross_entropy)  # noqa: E731
        fast = nn.value_and_grad(model, loss)(model, inputs, targets, mask, count)
        cache = make_prompt_cache(model)
        cached = model(inputs[:1, :40], cache=cache)
    assert (llama.swiglu, llama.scaled_dot_product_attention) == originals
    uncached = model(inputs[:1, :40], cache=make_prompt_cache(model))
    assert mx.allclose(cached, uncached, rtol=1e-4, atol=1e-5).item()
    assert abs(exact[0].item() - fast[0].item()) < 1e-5 * exact[0].item()
    for (name, a), (_, b) in zip(tree_flatten(exact[1]), tree_flatten(fast[1])):
        assert mx.allclose(a, b, rtol=1e-3, atol=1e-6).item(), name
