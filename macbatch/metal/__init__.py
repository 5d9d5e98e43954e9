"""Attention as pure functions on arrays: the engine calls `paged_attention` once per layer.

On Metal the custom kernel is used once it has passed its start-up self-test
(`ensure_selftest()`, which the engine calls once); everywhere else, and whenever
``MACBATCH_ATTENTION=reference``, the pure-MLX reference runs (``MACBATCH_ATTENTION=kernel`` uses
the kernel on Metal even if its self-test failed, for debugging). A kernel that fails to compile or
disagrees with the reference is never used: the self-test logs a warning and the reference takes
over. `attention_backend()` says which path is active (``macbatch doctor`` prints it). This
package never imports the engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from macbatch.metal.kernels import paged_attention_kernel
from macbatch.metal.reference import paged_attention_reference

log = logging.getLogger(__name__)
ENV = "MACBATCH_ATTENTION"
_state: dict[str, object] = {"kernel_ok": None, "why": ""}


def _requested() -> str:
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "auto", "kernel", "reference"):
        return value or "auto"
    log.warning("%s=%r is not one of kernel, reference; using the default", ENV, value)
    return "auto"


def _use_kernel() -> bool:
    return _requested() != "reference" and mx.metal.is_available() and _state["kernel_ok"] is True


def attention_backend() -> str:
    """Which attention path `paged_attention` takes now, in words."""
    if _requested() == "reference":
        return f"reference (forced by {ENV})"
    if not mx.metal.is_available():
        return "reference (no Metal)"
    if _requested() == "kernel":
        return f"kernel (Metal, forced by {ENV})"
    if _state["kernel_ok"] is None:
        return "kernel (Metal, self-test pending)"
    if _state["kernel_ok"]:
        return "kernel (Metal)"
    return f"reference (kernel self-test failed: {_state['why']})"


def paged_attention(
    q: mx.array,
    k_pages: mx.array,
    v_pages: mx.array,
    block_tables: mx.array,
    seq_lens: mx.array | np.ndarray,
    cu_seqlens_q: mx.array | np.ndarray,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: mx.array | None = None,
) -> mx.array:
    """Varlen paged attention (contract in ``reference.py``) on the active path."""
    fn = paged_attention_kernel if _use_kernel() else paged_attention_reference
    return fn(
        q, k_pages, v_pages, block_tables, seq_lens, cu_seqlens_q, scale,
        sliding_window, softcap, sinks,
    )  # fmt: skip


def ensure_selftest() -> None:
    """Run the kernel self-test once on Metal (a no-op elsewhere or when forced to reference)."""
    if _state["kernel_ok"] is not None or _requested() == "reference":
        return
    if not mx.metal.is_available():
        return
    ok, why = selftest(paged_attention_kernel)
    _state["kernel_ok"], _state["why"] = ok, why
    if not ok:
        log.warning("Metal attention kernel disabled, using the reference: %s", why)


def selftest(kernel: Callable[..., mx.array], seed: int = 0) -> tuple[bool, str]:
    """Compare `kernel` with the reference on a small random mixed batch, in each dtype.

    Returns (passed, reason). Any exception (a compile error) counts as a failure.
    """
    rng = np.random.default_rng(seed)
    hq, hkv, d, bs, blocks = 4, 2, 64, 16, 24
    q_lens = np.array([1, 9, 1, 3])
    lens = np.array([40, 20, 1, 35], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    tables = rng.permutation(blocks)[:12].reshape(4, 3).astype(np.int32)
    shapes = {"q": (int(cu[-1]), hq, d), "k": (blocks, hkv, bs, d)}
    for dtype, tol in ((mx.float32, 1e-4), (mx.float16, 5e-3), (mx.bfloat16, 3e-2)):
        q = mx.array(rng.standard_normal(shapes["q"]), dtype=dtype)
        k = mx.array(rng.standard_normal(shapes["k"]), dtype=dtype)
        v = mx.array(rng.standard_normal(shapes["k"]), dtype=dtype)
        sinks = mx.array(rng.standard_normal(hq), dtype=mx.float32)
        args = (q, k, v, mx.array(tables), mx.array(lens), mx.array(cu), d**-0.5)
        for extra in ({}, {"sliding_window": 8, "softcap": 20.0, "sinks": sinks}):
            want = paged_attention_reference(*args, **extra).astype(mx.float32)
            try:
                got = kernel(*args, **extra).astype(mx.float32)
                mx.eval(got)
            except Exception as exc:  # a compile or launch error: fall back, never crash
                return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
            err = float(mx.max(mx.abs(got - want)).item())
            if not err <= tol:  # NaN fails too
                return False, f"{dtype} {sorted(extra) or 'plain'}: max error {err:.3g} > {tol}"
    return True, ""


__all__ = [
    "attention_backend",
    "ensure_selftest",
    "paged_attention",
    "paged_attention_kernel",
    "paged_attention_reference",
    "selftest",
]
