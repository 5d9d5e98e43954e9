"""The chunked gated-delta prefill and the decode step against mlx-lm's token-by-token
recurrence (float32)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.gated_delta import compute_g, gated_delta_ops, normalize_qk

from macbatch.engine.model.hooks.gated_delta import CHUNK, chunked_gated_delta, decode_gated_delta


def _inputs(tokens: int, seed: int, batch: int = 2, hk: int = 2, hv: int = 4, dk: int = 16):
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32))

    q, k = normalize_qk(normal(batch, tokens, hk, dk), normal(batch, tokens, hk, dk),
                        inv_scale=dk**-0.5, eps=1e-6)  # fmt: skip
    v = normal(batch, tokens, hv, 24)
    g = compute_g(normal(hv), normal(batch, tokens, hv), normal(hv))  # decays in (0, 1)
    beta = mx.sigmoid(normal(batch, tokens, hv))
    state = normal(batch, hv, 24, dk) * 0.1
    return q, k, v, g, beta, state


@pytest.mark.parametrize("tokens", [1, 5, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_chunked_equals_the_recurrence(tokens: int) -> None:
    q, k, v, g, beta, state = _inputs(tokens, seed=tokens)
    want_y, want_state = gated_delta_ops(q, k, v, g, beta, state)
    y, new_state = chunked_gated_delta(q, k, v, g, beta, state)
    np.testing.assert_allclose(np.array(y), np.array(want_y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(new_state), np.array(want_state), rtol=1e-5, atol=1e-5)


def test_strong_decay_does_not_overflow() -> None:
    """Gates near 0 make the decay over a chunk underflow float32; only ratios are used."""
    q, k, v, _, beta, state = _inputs(2 * CHUNK, seed=3)
    g = mx.full((2, 2 * CHUNK, 4), 0.05)
    want_y, want_state = gated_delta_ops(q, k, v, g, beta, state)
    y, new_state = chunked_gated_delta(q, k, v, g, beta, state)
    assert np.isfinite(np.array(y)).all()
    np.testing.assert_allclose(np.array(y), np.array(want_y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(new_state), np.array(want_state), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hk", [1, 2, 4])
def test_decode_step_equals_the_recurrence(hk: int) -> None:
    """One token for each of a batch of sequences, with grouped (hk < hv) and plain heads."""
    q, k, v, g, beta, state = _inputs(1, seed=10 + hk, batch=5, hk=hk)
    want_y, want_state = gated_delta_ops(q, k, v, g, beta, state)
    y, new_state = decode_gated_delta(q, k, v, g, beta, state)
    assert y.shape == want_y.shape and new_state.shape == want_state.shape
    np.testing.assert_allclose(np.array(y), np.array(want_y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(new_state), np.array(want_state), rtol=1e-5, atol=1e-5)
