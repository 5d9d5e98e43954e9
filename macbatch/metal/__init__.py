"""Attention as pure functions on arrays: the engine calls `paged_attention` once per layer.

One contract (``reference.py``), several backends, each one file, all in one registry
(``registry.py``) keyed by the name ``MACBATCH_ATTENTION`` selects them by:

- ``metal``: the custom Metal kernel (``kernels.py``), on a Mac;
- ``cpu``: the C++ CPU kernel (``cpu_kernel.py``), without Metal (Linux, CI), built on first use;
- ``reference``: the pure-MLX reference, the oracle for both and the fallback.

A step's sequences reach a backend as one `AttentionMetadata`, a layer's scale, window, softcap,
sinks and latent value width (MLA) as one `LayerParams` (``backend.py``, with the
`AttentionBackend` protocol). A kernel is used only once it has passed its start-up self-test
against the reference (`ensure_selftest()`, which the engine calls once); `attention_backend()`
says which backend runs and why (``macbatch doctor`` prints it). This package never imports the
engine.
"""

from __future__ import annotations

import mlx.core as mx

from macbatch.metal import registry
from macbatch.metal.backend import (
    AttentionBackend,
    AttentionMetadata,
    BackendUnavailable,
    LayerParams,
    Pages,
)
from macbatch.metal.cpu_kernel import CpuKernelUnavailable, paged_attention_cpu
from macbatch.metal.kernels import paged_attention_kernel
from macbatch.metal.quant import QuantizedPages
from macbatch.metal.reference import paged_attention_reference
from macbatch.metal.registry import (
    BACKENDS,
    ENV,
    attention_backend,
    cpu_kernel_status,
    ensure_selftest,
)
from macbatch.metal.selftest import selftest


def paged_attention(
    q: mx.array, k_pages: Pages, v_pages: Pages, meta: AttentionMetadata, layer: LayerParams
) -> mx.array:
    """Varlen paged attention (contract in ``reference.py``) on the selected backend; K/V pages
    are float arrays or ``QuantizedPages`` (8 or 4 bits, format in ``quant.py``)."""
    return registry.selection.backend(q, k_pages, v_pages, meta, layer)


def traceable(head_dims: set[int], block_size: int) -> bool:
    """Whether the selected backend serves every layer of these head dims from the metadata
    arrays alone, so a step's graph can be compiled once and replayed (``AttentionBackend``)."""
    backend = registry.selection.backend
    return all(backend.traceable(d, block_size) for d in head_dims)


__all__ = [
    "BACKENDS",
    "ENV",
    "AttentionBackend",
    "AttentionMetadata",
    "BackendUnavailable",
    "CpuKernelUnavailable",
    "LayerParams",
    "Pages",
    "QuantizedPages",
    "attention_backend",
    "cpu_kernel_status",
    "ensure_selftest",
    "paged_attention",
    "paged_attention_cpu",
    "paged_attention_kernel",
    "paged_attention_reference",
    "selftest",
    "traceable",
]
