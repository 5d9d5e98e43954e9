"""K/V bytes the paged-attention kernel reads per dispatch, against the minimum (each byte once).

Runs the kernel under the MSL emulator (Linux, g++), which counts every page read made through
``kv_load`` in ``paged_attention.h``. Decode attention is bandwidth-bound, so on a Mac this ratio
times the minimum over the memory bandwidth is the kernel's floor. Usage:

    PYTHONPATH=. python benchmarks/kernel_bytes.py
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from macbatch.engine.stores.pages import PageFormat
from tests.support.attention_cases import Case, emulated_attention
from tests.support.msl.emulator import Emulator

SCENARIOS = {
    "decode, 8 seqs x 256 ctx, GQA 4": Case([256] * 8, [1] * 8, 8, 2, 128, 16, mx.float16),
    "decode, MHA, 4 seqs x 200 ctx": Case([200] * 4, [1] * 4, 4, 4, 128, 16, mx.float16),
    "decode, window 64 of 256 ctx": Case(
        [256] * 4, [1] * 4, 8, 2, 128, 16, mx.float16, sliding_window=64
    ),
    "prefill chunk 64 of fresh prompt, GQA 4": Case([64], [64], 8, 2, 128, 16, mx.float16),
    "prefill chunk 32 on 96 cached, GQA 4": Case([128], [32], 8, 2, 128, 16, mx.float16),
    "mixed: 6 decodes x 120 + chunk 32": Case(
        [120] * 6 + [32], [1] * 6 + [32], 8, 2, 128, 16, mx.float16
    ),
    # Quantized pages (group size 64): the same decode step reads codes and scales once.
    "decode, 8 seqs x 256 ctx, GQA 4, 8-bit": Case(
        [256] * 8, [1] * 8, 8, 2, 128, 16, mx.float16, kv_bits=8
    ),
    "decode, 8 seqs x 256 ctx, GQA 4, 4-bit": Case(
        [256] * 8, [1] * 8, 8, 2, 128, 16, mx.float16, kv_bits=4
    ),
    "mixed: 6 decodes x 120 + chunk 32, 4-bit": Case(
        [120] * 6 + [32], [1] * 6 + [32], 8, 2, 128, 16, mx.float16, kv_bits=4
    ),
}


def minimum_bytes(case: Case) -> int:
    """Each K and V element a row of the step can see, read once (quantized: its code bytes
    and its share of the row's scales)."""
    fmt = PageFormat(case.dtype, case.kv_bits, case.group_size)
    keys = 0
    for n, q_len in zip(case.seq_lens, case.q_lens, strict=True):
        first = n - q_len
        lo = 0 if case.sliding_window is None else max(0, first - case.sliding_window + 1)
        keys += n - lo
    return keys * case.num_kv_heads * 2 * fmt.row_bytes(case.head_dim)


def main() -> None:
    print(f"{'scenario':44} {'threadgroups':>12} {'read KiB':>9} {'min KiB':>8} {'ratio':>6}")
    for name, case in SCENARIOS.items():
        emulator = Emulator()
        out = emulated_attention(emulator)(*case.args(poisoned=True))
        assert not np.isnan(np.array(out.astype(mx.float32))).any()
        d = emulator.dispatches[-1]
        low = minimum_bytes(case)
        print(
            f"{name:44} {d.threadgroups:12d} {d.bytes_read / 1024:9.1f} {low / 1024:8.1f} "
            f"{d.bytes_read / low:6.2f}"
        )


if __name__ == "__main__":
    main()
