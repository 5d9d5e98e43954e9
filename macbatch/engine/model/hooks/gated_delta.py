"""A chunked gated-delta-rule prefill and a one-read decode step, for where mlx-lm has no kernel
(the CPU).

Gated DeltaNet layers (Qwen3.5, Qwen3-Next) update a matrix state per head and token:
``S_t = g_t S_{t-1} + b_t (v_t - g_t S_{t-1} k_t) k_t^T``, ``y_t = S_t q_t``. mlx-lm runs a Metal
kernel on a Mac and, elsewhere, steps through the prompt one token at a time (a few small ops per
token and layer: a 2,048-token prompt is ~100,000 tiny ops). This computes the same recurrence a
chunk of ``CHUNK`` tokens at a time with matrix products (the WY form of Yang et al., "Gated Delta
Networks"): within a chunk, with ``G_i`` the decay from the chunk's start to token ``i``,

    U = (I + diag(b) A)^-1 diag(b) (V - diag(G) K S0^T),   A_ij = (G_i / G_j) k_i.k_j  (j < i)
    Y = diag(G) Q S0^T + (causal (G_t / G_i) Q K^T) U
    S = G_C S0 + U^T diag(G_C / G) K

(only ratios of decays appear, so nothing overflows). Everything but the state's own flow is
computed for all chunks at once (``_within_chunks``: the products, the unit-triangular inverse by
LAPACK's ``tri_inv``); then each chunk takes three products from the state the chunk before left
(``_across``). It agrees with the token-by-token recurrence to float32 rounding
(tests/engine/model/test_gated_delta.py).

A decode step (one token per sequence, ``decode_gated_delta``) is the same recurrence with the
state read once for both of its products instead of mlx-lm's five passes over it.

Only the engine's own packed step uses them (``prefill``, ``decode``): mlx-lm's generation in the
same process, the tests' oracle and the benchmarks' peer, keeps its own code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from macbatch.engine.model import state_cut
from macbatch.engine.model.reroute import reroute

CHUNK = 64  # tokens per chunk; prompts shorter than this take mlx-lm's own path
_state = {"mode": ""}  # "prefill" or "decode" while the engine's recurrent layers run


def chunked_gated_delta(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """The recurrence over ``T`` tokens; shapes as mlx-lm's ``gated_delta_ops``: q, k
    ``[B, T, Hk, Dk]``, v ``[B, T, Hv, Dv]``, g and beta ``[B, T, Hv]``, state
    ``[B, Hv, Dv, Dk]``. Returns y ``[B, T, Hv, Dv]`` (q's dtype) and the new state (float32)."""
    out_dtype, length = q.dtype, q.shape[1]
    if (repeat := v.shape[2] // k.shape[2]) > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    # Padded to whole chunks with tokens that change nothing (beta 0, decay 1), then
    # [B, H, N, C, D] in float32: the decays' products need it.
    pad = -length % CHUNK
    q, k, v = (_chunks(x.astype(mx.float32), pad) for x in (q, k, v))
    log_g = _chunks(mx.log(g.astype(mx.float32))[..., None], pad)[..., 0]
    beta = _chunks(beta.astype(mx.float32)[..., None], pad)[..., 0]
    parts = _within_chunks(q, k, v, log_g, beta)
    state = state.astype(mx.float32)
    ys = []
    for n in range(q.shape[2]):  # only this carries from chunk to chunk
        y, state = _across(state, *(part[:, :, n] for part in parts))
        ys.append(y)
    y = mx.stack(ys, axis=2).reshape(q.shape[0], q.shape[1], -1, v.shape[-1])[:, :, :length]
    return y.transpose(0, 2, 1, 3).astype(out_dtype), state


def decode_gated_delta(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """One token per sequence (``T`` = 1; shapes as ``chunked_gated_delta``), with the state
    read once for both of its products: ``S' = g S + d k^T`` with ``d = b (v - g S k)``, so
    ``y = S' q = g S q + d (k.q)``. mlx-lm's step reads and writes the 16 x 128 x 128 state of
    a Qwen3.5 layer five times per sequence; this about halves a 32-row decode's recurrence."""
    return _decode_compiled(q, k, v, g, beta, state)


def _decode_body(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    out_dtype = q.dtype
    if (repeat := v.shape[2] // k.shape[2]) > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    q, k, v = (x[:, 0].astype(mx.float32) for x in (q, k, v))  # [B, H, D]
    g, beta = (x[:, 0, :, None].astype(mx.float32) for x in (g, beta))  # [B, H, 1]
    state = state.astype(mx.float32)
    products = state @ mx.stack([k, q], axis=-1)  # [B, H, Dv, 2]: S k and S q
    delta = (v - g * products[..., 0]) * beta
    y = g * products[..., 1] + delta * (k * q).sum(-1, keepdims=True)
    state = state * g[..., None] + delta[..., None] * k[..., None, :]
    return y[:, None].astype(out_dtype), state


# Compiled: the update's multiplies and add become one fused kernel, a single pass writing the
# new state (uncompiled, each op is a pass over the 1 MiB-a-row state with a temporary); MLX
# builds the fused kernels with the C++ compiler on first use (about 3 s, once per machine:
# cached on disk) and retraces per batch size (milliseconds).
_decode_compiled = mx.compile(_decode_body)


def _chunks(x: mx.array, pad: int) -> mx.array:
    """``[B, T, H, D]`` -> ``[B, H, N, C, D]``, zero-padded to ``N`` whole chunks."""
    if pad:
        x = mx.pad(x, [(0, 0), (0, pad), (0, 0), (0, 0)])
    b, t, h, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, h, t // CHUNK, CHUNK, d)


def _within_chunks(
    q: mx.array, k: mx.array, v: mx.array, log_g: mx.array, beta: mx.array
) -> tuple[mx.array, ...]:
    """Everything that does not depend on the state, for all chunks at once: with ``S`` the state
    at a chunk's start, ``U = u0 - w S^T``, ``Y = qd S^T + qk U``, ``S' = g_end S + U^T k_end``."""
    length = q.shape[-2]
    cum = mx.cumsum(log_g, axis=-1)  # log G_i
    rows, cols = mx.arange(length)[:, None], mx.arange(length)[None, :]
    ratio = cum[..., :, None] - cum[..., None, :]  # log(G_i / G_j)
    causal = mx.exp(mx.where(cols <= rows, ratio, -mx.inf))  # G_i / G_j, j <= i; else 0
    dots = mx.concatenate([k, q], axis=-2) @ k.swapaxes(-1, -2)  # k.k and q.k, one product
    lower = beta[..., :, None] * mx.where(cols < rows, causal, 0.0) * dots[..., :length, :]
    inverse = _unit_lower_inverse(lower) * beta[..., None, :]  # (I + L)^-1 diag(beta)
    decay = mx.exp(cum)[..., None]  # G_i
    solved = inverse @ mx.concatenate([v, decay * k], axis=-1)
    u0, w = solved[..., : v.shape[-1]], solved[..., v.shape[-1] :]
    qk = causal * dots[..., length:, :]
    k_end = mx.exp(cum[..., -1:] - cum)[..., None] * k  # (G_C / G_i) k_i
    g_end = mx.exp(cum[..., -1])[..., None, None]
    return mx.concatenate([w, decay * q], axis=-2), u0, qk, k_end, g_end


def _across(
    state: mx.array, wq: mx.array, u0: mx.array, qk: mx.array, k_end: mx.array, g_end: mx.array
) -> tuple[mx.array, mx.array]:
    """One chunk from its start state: its outputs and the state after it."""
    length = u0.shape[-2]
    products = wq @ state.swapaxes(-1, -2)  # [w; qd] S^T in one product
    u = u0 - products[..., :length, :]
    y = products[..., length:, :] + qk @ u
    return y, g_end * state + u.swapaxes(-1, -2) @ k_end


def _unit_lower_inverse(lower: mx.array) -> mx.array:
    """``(I + L)^-1`` for strictly lower-triangular ``L``: LAPACK's triangular inverse."""
    eye = mx.eye(lower.shape[-1], dtype=lower.dtype)
    return mx.linalg.tri_inv(eye + lower, upper=False, stream=mx.cpu)


@contextlib.contextmanager
def prefill() -> Iterator[None]:
    """While inside, Gated DeltaNet layers without mlx-lm's kernel run their long sequences
    chunked, and depthwise convolutions as shifted sums (``depthwise_conv``); the engine enters
    it around its recurrent layers' prefill chunks."""
    with _mode("prefill"):
        yield


@contextlib.contextmanager
def decode() -> Iterator[None]:
    """While inside, Gated DeltaNet layers without mlx-lm's kernel run one-token sequences
    with ``decode_gated_delta``; the engine enters it around its recurrent layers' decode rows."""
    with _mode("decode"):
        yield


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    _state["mode"] = mode
    try:
        yield
    finally:
        _state["mode"] = ""


def active() -> bool:
    """Whether the engine's recurrent prefill is running (inside ``prefill``)."""
    return _state["mode"] == "prefill"


def running() -> bool:
    """Whether the engine's recurrent layers are running (inside ``prefill`` or ``decode``)."""
    return bool(_state["mode"])


def on_gpu() -> bool:
    """Whether MLX computes on a Mac's GPU, where mlx-lm's own kernels run."""
    return mx.metal.is_available() and mx.default_device() == mx.gpu


def install() -> None:
    """Route mlx-lm's ``gated_delta_update``, in every loaded model module that imported it,
    through ``_dispatch`` (mlx-lm's own function unless inside ``prefill``)."""
    from mlx_lm.models import gated_delta

    for name in reroute(gated_delta, "gated_delta_update", _dispatcher):
        state_cut.route(name)


def _dispatcher(original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **options):  # noqa: N803
        cut = state_cut.current()
        if cut is None or not state_cut.splits(cut, q.shape[1], mask is None):
            return one(q, k, v, a, b, A_log, dt_bias, state, mask, **options)

        def part(span: slice, start: mx.array | None) -> tuple[mx.array, mx.array]:
            qs, ks, vs, as_, bs = (x[:, span] for x in (q, k, v, a, b))
            return one(qs, ks, vs, as_, bs, A_log, dt_bias, start, **options)

        return state_cut.in_two_parts(cut, part, state)

    def one(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **options):  # noqa: N803
        ours = _ours(q, a, mask, options)
        if ours is None:
            return original(q, k, v, a, b, A_log, dt_bias, state, mask, **options)
        from mlx_lm.models.gated_delta import compute_g

        if state is None:
            state = mx.zeros((q.shape[0], v.shape[-2], v.shape[-1], q.shape[-1]), mx.float32)
        return ours(q, k, v, compute_g(A_log, a, dt_bias), mx.sigmoid(b), state)

    return dispatch


def _ours(q: mx.array, a: mx.array, mask: Any, options: dict[str, Any]) -> Any:
    """Which of this module's forms computes a call (None: mlx-lm's own): inside the engine's
    step, no kernel to run it, no mask, scalar gates, mlx-lm's default gate options, and a
    sequence of at least a chunk (prefill) or of one token."""
    plain = not options.get("allow_neg_eigval") and options.get("lower_bound") is None
    if not _state["mode"] or on_gpu() or mask is not None or not plain or a.ndim != 3:
        return None
    if _state["mode"] == "prefill" and q.shape[1] >= CHUNK:
        return chunked_gated_delta
    if q.shape[1] == 1:
        return decode_gated_delta
    return None
