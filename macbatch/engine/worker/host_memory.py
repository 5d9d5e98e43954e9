"""The C allocator's settings for MLX's CPU backend on Linux (glibc).

MLX's CPU allocator keeps no cache of freed buffers: every array is a fresh ``malloc``, and glibc
serves one above its mmap threshold (dynamic, at most 32 MiB) with a fresh ``mmap`` that the
kernel zero-fills page by page, unmapped again on ``free``. A prefill step of a few thousand
tokens allocates hundreds of such buffers: measured here, one element-wise op on 2,048 x 4,096
float32 took 27 ms of CPU, 5 ms once the buffer came from the heap. So a runner on the CPU raises
the threshold to 64 MiB (bigger buffers, the pool's pages among them, are still mapped apart) and
the heap's trim threshold with it (else its top is given back and faulted in again every step).
Like MLX's own buffer cache on Metal, the heap then keeps up to the largest step's working set
of such buffers; ``release`` hands it back when the engine idles (``kv_shrink_after_s``).
Elsewhere (macOS, musl, Metal) nothing changes.
"""

from __future__ import annotations

import ctypes
import platform
from functools import cache

import mlx.core as mx

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEPT_BYTES = 64 << 20


@cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_step_buffers() -> None:
    """Let freed step buffers be reused from the heap (idempotent; CPU backend on glibc only)."""
    libc = _glibc()
    if libc is not None and not mx.metal.is_available():
        libc.mallopt(_M_MMAP_THRESHOLD, _KEPT_BYTES)
        libc.mallopt(_M_TRIM_THRESHOLD, _KEPT_BYTES)


def release() -> None:
    """Give the heap's free memory back to the system (after the pool shrinks)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
