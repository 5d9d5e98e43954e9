"""Attention as pure functions on arrays: the engine calls `paged_attention` once per layer.

Three implementations of one contract (``reference.py``):

- on Metal, the custom Metal kernel (``kernels.py``);
- without Metal (Linux, CI), the C++ CPU kernel (``cpu_kernel.py``), built on first use;
- the pure-MLX reference: the oracle for both, and the fallback.

A kernel is used only once it has passed its start-up self-test against the reference
(`ensure_selftest()`, which the engine calls once). One that fails to build or disagrees is never
used: the self-test logs a warning and the reference takes over. ``MACBATCH_ATTENTION=reference``
forces the reference; ``MACBATCH_ATTENTION=kernel`` uses the Metal kernel even if its self-test
failed, for debugging. `attention_backend()` says which path is active (``macbatch doctor`` prints
it). This package never imports the engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from macbatch.metal.cpu_kernel import CpuKernelUnavailable, load_extension, paged_attention_cpu
from macbatch.metal.kernels import paged_attention_kernel
from macbatch.metal.quant import QuantizedPages, quantize
from macbatch.metal.reference import Pages, paged_attention_reference

log = logging.getLogger(__name__)
ENV = "MACBATCH_ATTENTION"
# kernel_ok: the Metal kernel's self-test; cpu_ok: the CPU kernel's (None: not run yet).
_state: dict[str, object] = {"kernel_ok": None, "why": "", "cpu_ok": None, "cpu_why": ""}


def _requested() -> str:
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "auto", "kernel", "reference"):
        return value or "auto"
    log.warning("%s=%r is not one of kernel, reference; using the default", ENV, value)
    return "auto"


def _active() -> Callable[..., mx.array]:
    if _requested() == "reference":
        return paged_attention_reference
    if mx.metal.is_available():
        proven = _state["kernel_ok"] is True or _requested() == "kernel"  # forced: for debugging
        return paged_attention_kernel if proven else paged_attention_reference
    return paged_attention_cpu if _state["cpu_ok"] is True else paged_attention_reference


def attention_backend() -> str:
    """Which attention path `paged_attention` takes now, in words."""
    if _requested() == "reference":
        return f"reference (forced by {ENV})"
    if not mx.metal.is_available():
        if _state["cpu_ok"] is None:
            return "reference (no Metal; CPU kernel self-test pending)"
        if _state["cpu_ok"]:
            return "CPU kernel (no Metal)"
        return f"reference (no Metal; CPU kernel unavailable: {_state['cpu_why']})"
    if _requested() == "kernel":
        return f"kernel (Metal, forced by {ENV})"
    if _state["kernel_ok"] is None:
        return "kernel (Metal, self-test pending)"
    if _state["kernel_ok"]:
        return "kernel (Metal)"
    return f"reference (kernel self-test failed: {_state['why']})"


def cpu_kernel_status() -> str:
    """Whether the C++ CPU kernel is built and proved by its self-test, in words."""
    if mx.metal.is_available():
        return "not used (Metal runs the Metal kernel)"
    if _state["cpu_ok"] is None:
        return "not checked yet"
    if _state["cpu_ok"]:
        return "built, self-test passed"
    return f"not available: {_state['cpu_why']}"


def paged_attention(
    q: mx.array,
    k_pages: Pages,
    v_pages: Pages,
    block_tables: mx.array,
    seq_lens: mx.array | np.ndarray,
    cu_seqlens_q: mx.array | np.ndarray,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: mx.array | None = None,
) -> mx.array:
    """Varlen paged attention (contract in ``reference.py``) on the active path; K/V pages are
    float arrays or ``QuantizedPages`` (8 or 4 bits, format in ``quant.py``)."""
    return _active()(
        q, k_pages, v_pages, block_tables, seq_lens, cu_seqlens_q, scale,
        sliding_window, softcap, sinks,
    )  # fmt: skip


def ensure_selftest() -> None:
    """Prove this machine's kernel once: the Metal kernel on Metal, else the CPU kernel (built
    here on first use). A no-op when forced to the reference or already done."""
    if _requested() == "reference":
        return
    if mx.metal.is_available():
        if _state["kernel_ok"] is None:
            ok, why = selftest(paged_attention_kernel)
            _state["kernel_ok"], _state["why"] = ok, why
            if not ok:
                log.warning("Metal attention kernel disabled, using the reference: %s", why)
        return
    if _state["cpu_ok"] is None:
        try:
            load_extension()
            ok, why = selftest(paged_attention_cpu)
        except (CpuKernelUnavailable, OSError) as exc:  # never stop the engine: fall back
            ok, why = False, str(exc).splitlines()[0]
        _state["cpu_ok"], _state["cpu_why"] = ok, why
        if not ok:
            log.warning("CPU attention kernel disabled, using the reference: %s", why)


def selftest(kernel: Callable[..., mx.array], seed: int = 0) -> tuple[bool, str]:
    """Compare `kernel` with the reference on a small random mixed batch, in each dtype, and
    with float32 queries over 8-bit and 4-bit pages.

    Returns (passed, reason). Any exception (a compile error) counts as a failure.
    """
    rng = np.random.default_rng(seed)
    hq, hkv, d, bs, blocks = 4, 2, 64, 16, 24
    q_lens = np.array([1, 9, 1, 3])
    lens = np.array([40, 20, 1, 35], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    tables = rng.permutation(blocks)[:12].reshape(4, 3).astype(np.int32)
    shapes = {"q": (int(cu[-1]), hq, d), "k": (blocks, hkv, bs, d)}
    formats = [(mx.float32, 1e-4, None), (mx.float16, 5e-3, None), (mx.bfloat16, 3e-2, None)]
    for dtype, tol, bits in [*formats, (mx.float32, 1e-4, 8), (mx.float32, 1e-4, 4)]:
        q = mx.array(rng.standard_normal(shapes["q"]), dtype=dtype)
        k = mx.array(rng.standard_normal(shapes["k"]), dtype=dtype)
        v = mx.array(rng.standard_normal(shapes["k"]), dtype=dtype)
        if bits is not None:
            k, v = (QuantizedPages(*quantize(x, bits, 32), bits, 32) for x in (k, v))
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
                pages = f"{bits}-bit pages" if bits else f"{dtype} pages"
                return False, f"{pages} {sorted(extra) or 'plain'}: max error {err:.3g} > {tol}"
    return True, ""


__all__ = [
    "CpuKernelUnavailable",
    "QuantizedPages",
    "attention_backend",
    "cpu_kernel_status",
    "ensure_selftest",
    "paged_attention",
    "paged_attention_cpu",
    "paged_attention_kernel",
    "paged_attention_reference",
    "selftest",
]
