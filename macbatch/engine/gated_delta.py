"""A chunked gated-delta-rule prefill, for where mlx-lm has no kernel (the CPU).

Gated DeltaNet layers (Qwen3.5, Qwen3-Next) update a matrix state per head and token:
``S_t = g_t S_{t-1} + b_t (v_t - g_t S_{t-1} k_t) k_t^T``, ``y_t = S_t q_t``. mlx-lm runs a Metal
kernel on a Mac and, elsewhere, steps through the prompt one token at a time (a few small ops per
token and layer: a 2,048-token prompt is ~100,000 tiny ops). This computes the same recurrence a
chunk of ``CHUNK`` tokens at a time with matrix products (the WY form of Yang et al., "Gated Delta
Networks"): within a chunk, with ``G_i`` the decay from the chunk's start to token ``i``,

    U = (I + diag(b) A)^-1 diag(b) (V - diag(G) K S0^T),   A_ij = (G_i / G_j) k_i.k_j  (j < i)
    Y = diag(G) Q S0^T + (causal (G_t / G_i) Q K^T) U
    S = G_C S0 + U^T diag(G_C / G) K

(only ratios of decays appear, so nothing overflows). The unit-triangular inverse is a product
of log2(CHUNK) squarings, so everything is matrix products. It agrees with the token-by-token
recurrence to float32 rounding (tests/engine/test_gated_delta.py).

Only the engine's own packed step uses it (``prefill``): mlx-lm's generation in the same process,
the tests' oracle and the benchmarks' peer, keeps its own code.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

CHUNK = 64  # tokens per chunk; prompts shorter than this take mlx-lm's own path
_state = {"active": False}


def chunked_gated_delta(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """The recurrence over ``T`` tokens; shapes as mlx-lm's ``gated_delta_ops``: q, k
    ``[B, T, Hk, Dk]``, v ``[B, T, Hv, Dv]``, g and beta ``[B, T, Hv]``, state
    ``[B, Hv, Dv, Dk]``. Returns y ``[B, T, Hv, Dv]`` (q's dtype) and the new state (float32)."""
    out_dtype = q.dtype
    heads = v.shape[2]
    if (repeat := heads // k.shape[2]) > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    # [B, H, T, D], float32: the decays' products need it
    q, k, v = (x.astype(mx.float32).transpose(0, 2, 1, 3) for x in (q, k, v))
    log_g = mx.log(g.astype(mx.float32)).transpose(0, 2, 1)
    beta = beta.astype(mx.float32).transpose(0, 2, 1)
    state = state.astype(mx.float32)
    ys = []
    for start in range(0, q.shape[2], CHUNK):
        part = slice(start, start + CHUNK)
        y, state = _chunk(q[:, :, part], k[:, :, part], v[:, :, part], log_g[:, :, part],
                          beta[:, :, part], state)  # fmt: skip
        ys.append(y)
    y = ys[0] if len(ys) == 1 else mx.concatenate(ys, axis=2)
    return y.transpose(0, 2, 1, 3).astype(out_dtype), state


def _chunk(
    q: mx.array, k: mx.array, v: mx.array, log_g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One chunk: ``[B, H, C, D]`` inputs, ``[B, H, C]`` log decays and betas."""
    length = q.shape[2]
    cum = mx.cumsum(log_g, axis=-1)  # log G_i
    rows, cols = mx.arange(length)[:, None], mx.arange(length)[None, :]
    ratio = cum[..., :, None] - cum[..., None, :]  # log(G_i / G_j)
    causal = mx.exp(mx.where(cols <= rows, ratio, -mx.inf))  # G_i / G_j, j <= i; else 0
    strict = mx.where(cols < rows, causal, 0.0)
    lower = beta[..., :, None] * strict * (k @ k.swapaxes(-1, -2))
    decay = mx.exp(cum)[..., None]  # G_i
    state_t = state.swapaxes(-1, -2)  # [B, H, Dk, Dv]
    rhs = beta[..., None] * (v - decay * (k @ state_t))
    u = _unit_lower_inverse(lower) @ rhs
    y = decay * (q @ state_t) + (causal * (q @ k.swapaxes(-1, -2))) @ u
    to_end = mx.exp(cum[..., -1:] - cum)[..., None]  # G_C / G_i
    new_state = mx.exp(cum[..., -1])[..., None, None] * state + (u * to_end).swapaxes(-1, -2) @ k
    return y, new_state


def _unit_lower_inverse(lower: mx.array) -> mx.array:
    """``(I + L)^-1`` for strictly lower-triangular ``L`` (nilpotent: ``L^n = 0``), as
    ``(I - L)(I + L^2)(I + L^4)...``: log2(n) matrix products instead of n substitution steps."""
    n = lower.shape[-1]
    eye = mx.eye(n, dtype=lower.dtype)
    inverse, power = eye - lower, lower @ lower
    while n > 2:
        inverse = inverse @ (eye + power)
        power = power @ power
        n = (n + 1) // 2
    return inverse


@contextlib.contextmanager
def prefill() -> Iterator[None]:
    """While inside, Gated DeltaNet layers without mlx-lm's kernel run their long sequences
    chunked (the engine enters it around its recurrent layers)."""
    _state["active"] = True
    try:
        yield
    finally:
        _state["active"] = False


def install() -> None:
    """Route mlx-lm's ``gated_delta_update``, in every loaded model module that imported it,
    through ``_dispatch`` (mlx-lm's own function unless inside ``prefill``)."""
    from mlx_lm.models import gated_delta

    original = gated_delta.gated_delta_update
    for name, module in list(sys.modules.items()):
        ours = name.startswith("mlx_lm.models.") and module is not gated_delta
        if ours and getattr(module, "gated_delta_update", None) is original:
            vars(module)["gated_delta_update"] = _dispatcher(original)


def _dispatcher(original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **options):  # noqa: N803
        if not _chunked(q, a, mask, options):
            return original(q, k, v, a, b, A_log, dt_bias, state, mask, **options)
        from mlx_lm.models.gated_delta import compute_g

        if state is None:
            state = mx.zeros((q.shape[0], v.shape[-2], v.shape[-1], q.shape[-1]), mx.float32)
        return chunked_gated_delta(q, k, v, compute_g(A_log, a, dt_bias), mx.sigmoid(b), state)

    return dispatch


def _chunked(q: mx.array, a: mx.array, mask: Any, options: dict[str, Any]) -> bool:
    """Whether a call is one this module computes: inside the engine's step, a sequence of at
    least a chunk, no kernel to run it, no mask, scalar gates, mlx-lm's default gate options."""
    kernel = mx.metal.is_available() and mx.default_device() == mx.gpu
    plain = not options.get("allow_neg_eigval") and options.get("lower_bound") is None
    return (
        _state["active"] and not kernel and mask is None and plain
        and q.shape[1] >= CHUNK and a.ndim == 3
    )  # fmt: skip
