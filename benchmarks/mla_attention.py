"""MLA decode attention over latent pages: the CPU kernel vs the pure-MLX reference and vs mlx-lm's
own decode attention over its latent cache, same process, same inputs.

GLM-4.7-Flash's attention (20 query heads on one latent KV head, rows of 512 latent + 64 RoPE
columns, the values their leading 512), bfloat16 pages of 16 tokens scattered at random over the
pool; one decode row per sequence, 1 and 16 sequences, 4K and 16K tokens of context each.
mlx-lm's form (``glm4_moe_lite``'s ``L == 1`` branch): the RoPE scores ``q_pe @ k_pe^T`` as an
additive mask, then ``scaled_dot_product_attention`` of the latent queries over the contiguous
latent cache ``[B, 1, context, 512]`` (keys and values both), in the pages' dtype. Both
wall-clock and process CPU time per call are printed: on a machine shared with other work the CPU
time (all threads, BLAS's too) is the steadier measure of the work done. Run it on a machine
without Metal:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.mla_attention
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

from benchmarks.common import warn_without_openblas
from macbatch.metal import AttentionMetadata, LayerParams
from macbatch.metal.cpu_kernel import paged_attention_cpu
from macbatch.metal.reference import paged_attention_reference

HEADS, LATENT, ROPE, BLOCK = 20, 512, 64, 16
SHAPES = [(1, 4096), (1, 16384), (16, 4096), (16, 16384)]  # (sequences, context of each)


def make_inputs(seqs: int, context: int, dtype: mx.Dtype, rng: np.random.Generator):
    """One decode row per sequence over ``context`` latent rows in shuffled blocks."""
    width = -(-context // BLOCK)
    pool = seqs * width + 8
    pages = mx.array(rng.standard_normal((pool, 1, BLOCK, LATENT + ROPE), dtype=np.float32))
    q = mx.array(rng.standard_normal((seqs, HEADS, LATENT + ROPE), dtype=np.float32))
    pages, q = pages.astype(dtype), q.astype(dtype)
    mx.eval(pages, q)
    tables = rng.permutation(pool)[: seqs * width].reshape(seqs, width)
    cu = np.arange(seqs + 1, dtype=np.int32)
    meta = AttentionMetadata.build(tables, np.full(seqs, context, np.int32), cu)
    return q, pages, pages, meta, LayerParams((LATENT + ROPE) ** -0.5, value_dim=LATENT)


def mlx_lm_inputs(q: mx.array, pages: mx.array, meta: AttentionMetadata, scale: float):
    """The same rows as mlx-lm's latent cache holds them, contiguous per sequence: the latent
    ``[B, 1, context, 512]`` and the roped shared key ``[B, 1, context, 64]``."""
    seqs = q.shape[0]
    rows = pages[meta.block_tables].reshape(seqs, 1, -1, LATENT + ROPE)
    rows = rows[:, :, : int(meta.host_seq_lens[0])]
    latent, k_pe = mx.contiguous(rows[..., :LATENT]), mx.contiguous(rows[..., LATENT:])
    mx.eval(latent, k_pe)
    return q, latent, k_pe, scale


def mlx_lm_attention(q: mx.array, latent: mx.array, k_pe: mx.array, scale: float) -> mx.array:
    """mlx-lm's MLA decode attention (``glm4_moe_lite``, one token): RoPE scores as the mask."""
    q_nope, q_pe = q[:, :, None, :LATENT], q[:, :, None, LATENT:]
    pe_scores = (q_pe * scale) @ k_pe.swapaxes(-1, -2)
    return mx.fast.scaled_dot_product_attention(q_nope, latent, latent, scale=scale, mask=pe_scores)


def mlx_lm_attention_runs(seqs: int, context: int) -> bool:
    """Whether mlx-lm's MLA decode attention runs at this size here: MLX 0.32's CPU
    ``scaled_dot_product_attention`` segfaults once the latent keys broadcast to every head pass
    2^31 elements (16 x 16K at 20 heads does; 8 x 16K runs)."""
    return seqs * HEADS * context * LATENT < 2**31 or mx.default_device() != mx.cpu


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--no-reference", action="store_true", help="the kernel and mlx-lm only")
    args = parser.parse_args()
    warn_without_openblas()
    rng = np.random.default_rng(0)
    for seqs, context in SHAPES:
        inputs = make_inputs(seqs, context, getattr(mx, args.dtype), rng)
        q, pages, _, meta, params = inputs
        kernel, kernel_cpu = milliseconds(paged_attention_cpu, inputs)
        name = f"{seqs:2d} x decode on {context // 1024}K latent rows"
        line = f"{name:32s} CPU kernel {kernel:7.1f} ms wall, {kernel_cpu:7.1f} ms CPU | mlx-lm "
        if mlx_lm_attention_runs(seqs, context):
            peer = mlx_lm_inputs(q, pages, meta, params.scale)
            theirs, theirs_cpu = milliseconds(mlx_lm_attention, peer)
            del peer
            ratio = theirs_cpu / kernel_cpu
            line += f"{theirs:7.1f} / {theirs_cpu:7.1f} ms: kernel x{ratio:.2f} (CPU)"
        else:
            line += "not run (its CPU attention segfaults at this size)"
        if not args.no_reference:
            ref, ref_cpu = milliseconds(paged_attention_reference, inputs)
            line += f" | reference {ref:8.1f} / {ref_cpu:8.1f} ms"
        print(line)


if __name__ == "__main__":
    main()
