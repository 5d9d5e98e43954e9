"""The start-up self-test: a kernel serves on this machine only after matching the reference here.

A kernel that compiles on one machine can miscompile, or fail to build, on another (another
Metal compiler, another C++ toolchain), so the registry runs this once per backend before
trusting it. It covers what a step can mix: decode rows and prefill chunks, each page dtype,
8-bit and 4-bit pages, with and without sliding window, softcap and sinks.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from macbatch.metal.backend import AttentionBackend, AttentionMetadata, LayerParams, Pages
from macbatch.metal.quant import QuantizedPages, quantize
from macbatch.metal.reference import paged_attention_reference

# (query dtype, tolerance against the reference, page bits: None for float pages)
_FORMATS = [
    (mx.float32, 1e-4, None),
    (mx.float16, 5e-3, None),
    (mx.bfloat16, 3e-2, None),
    (mx.float32, 1e-4, 8),
    (mx.float32, 1e-4, 4),
]


def selftest(backend: AttentionBackend, seed: int = 0) -> tuple[bool, str]:
    """Compare ``backend`` with the reference on a small random mixed batch in each format.

    Returns (passed, reason). Any exception (a compile error) counts as a failure.
    """
    rng = np.random.default_rng(seed)
    hq, hkv, d, bs, blocks = 4, 2, 64, 16, 24
    q_lens = np.array([1, 9, 1, 3])
    lens = np.array([40, 20, 1, 35], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    tables = rng.permutation(blocks)[:12].reshape(4, 3).astype(np.int32)
    meta = AttentionMetadata.build(tables, lens, cu)
    q_shape, page_shape = (int(cu[-1]), hq, d), (blocks, hkv, bs, d)
    for dtype, tol, bits in _FORMATS:
        q = mx.array(rng.standard_normal(q_shape), dtype=dtype)
        kv = [mx.array(rng.standard_normal(page_shape), dtype=dtype) for _ in range(2)]
        k, v = _pages(kv, bits)
        sinks = mx.array(rng.standard_normal(hq), dtype=mx.float32)
        layers = {
            "plain": LayerParams(d**-0.5),
            "sliding_window+softcap+sinks": LayerParams(d**-0.5, 8, 20.0, sinks),
        }
        for options, layer in layers.items():
            want = paged_attention_reference(q, k, v, meta, layer).astype(mx.float32)
            try:
                got = backend(q, k, v, meta, layer).astype(mx.float32)
                mx.eval(got)
            except Exception as exc:  # a compile or launch error: fall back, never crash
                return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
            err = float(np.array(mx.max(mx.abs(got - want))))
            if not err <= tol:  # NaN fails too
                pages = f"{bits}-bit pages" if bits else f"{dtype} pages"
                return False, f"{pages} {options}: max error {err:.3g} > {tol}"
    return True, ""


def _pages(kv: list[mx.array], bits: int | None) -> list[Pages]:
    """K and V pages as they are, or quantized to ``bits`` in groups of 32."""
    if bits is None:
        return list(kv)
    return [QuantizedPages(*quantize(x, bits, 32), bits, 32) for x in kv]
