"""Step buffers on the CPU come from the heap, not fresh mappings
(``engine/worker/host_memory.py``)."""

from __future__ import annotations

import ctypes
import platform

import mlx.core as mx
import pytest

from macbatch.engine.worker import host_memory

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or mx.metal.is_available(),
    reason="glibc's allocator on MLX's CPU backend only",
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def _mapped_bytes() -> int:
    """Bytes glibc holds in separate mappings (``mallinfo2().hblkhd``)."""
    mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().hblkhd)


def test_a_32_mib_step_buffer_is_not_a_fresh_mapping() -> None:
    host_memory.keep_step_buffers()
    before = _mapped_bytes()
    buffer = mx.ones((2048, 4096)) * 2.0  # 32 MiB of float32, as a prefill step's
    mx.eval(buffer)
    assert _mapped_bytes() - before < 1 << 20
    del buffer
    host_memory.release()  # hands the heap's free memory back; must not disturb MLX
    assert (mx.ones((4, 4)) * 2).sum().item() == 32
