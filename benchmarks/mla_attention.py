"""MLA decode attention over latent pages: the CPU kernel vs the pure-MLX reference, same process,
same inputs.

GLM-4.7-Flash's attention (20 query heads on one latent KV head, rows of 512 latent + 64 RoPE
columns, the values their leading 512), bfloat16 pages of 16 tokens scattered at random over the
pool; one decode row per sequence, 1 and 16 sequences, 4K and 16K tokens of context each. Both
wall-clock and process CPU time per call are printed: on a machine shared with other work the CPU
time (all threads, BLAS's too) is the steadier measure of the work done. Run it on a machine
without Metal:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.mla_attention
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from benchmarks.common import warn_without_openblas
from macbatch.metal import AttentionMetadata, LayerParams
from macbatch.metal.cpu_kernel import paged_attention_cpu
from macbatch.metal.reference import paged_attention_reference

HEADS, LATENT, ROPE, BLOCK = 20, 512, 64, 16
SHAPES = [(1, 4096), (1, 16384), (16, 4096), (16, 16384)]  # (sequences, context of each)


def make_inputs(seqs: int, context: int, rng: np.random.Generator):
    """One decode row per sequence over ``context`` latent rows in shuffled blocks."""
    width = -(-context // BLOCK)
    pool = seqs * width + 8
    pages = mx.array(rng.standard_normal((pool, 1, BLOCK, LATENT + ROPE), dtype=np.float32))
    q = mx.array(rng.standard_normal((seqs, HEADS, LATENT + ROPE), dtype=np.float32))
    pages, q = pages.astype(mx.bfloat16), q.astype(mx.bfloat16)
    mx.eval(pages, q)
    tables = rng.permutation(pool)[: seqs * width].reshape(seqs, width)
    cu = np.arange(seqs + 1, dtype=np.int32)
    meta = AttentionMetadata.build(tables, np.full(seqs, context, np.int32), cu)
    return q, pages, pages, meta, LayerParams((LATENT + ROPE) ** -0.5, value_dim=LATENT)


def milliseconds(fn, args, repeats: int = 3) -> tuple[float, float]:
    """Medians of wall-clock and process CPU time per call, after a warm-up."""
    mx.eval(fn(*args))
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        mx.eval(fn(*args))
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return 1000 * float(np.median(wall)), 1000 * float(np.median(cpu))


def main() -> None:
    warn_without_openblas()
    rng = np.random.default_rng(0)
    for seqs, context in SHAPES:
        args = make_inputs(seqs, context, rng)
        ref, ref_cpu = milliseconds(paged_attention_reference, args)
        kernel, kernel_cpu = milliseconds(paged_attention_cpu, args)
        name = f"{seqs:2d} x decode on {context // 1024}K latent rows"
        print(
            f"{name:32s} wall: reference {ref:8.1f} ms, CPU kernel {kernel:7.1f} ms, "
            f"x{ref / kernel:.2f} | CPU time: {ref_cpu:8.1f} ms, {kernel_cpu:7.1f} ms, "
            f"x{ref_cpu / kernel_cpu:.2f}"
        )


if __name__ == "__main__":
    main()
