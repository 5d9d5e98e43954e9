"""One layer's attention: the CPU kernel vs the pure-MLX reference, same process, same inputs.

Shapes of the engine's benchmarks (8 query / 4 KV heads, head dim 64, block size 16, float32),
pages scattered at random over a 4,096-block pool. Run it on a machine without Metal:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.attention
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from benchmarks.common import warn_without_openblas
from macbatch.metal import AttentionMetadata, LayerParams
from macbatch.metal.cpu_kernel import paged_attention_cpu
from macbatch.metal.reference import paged_attention_reference

HEADS, KV_HEADS, HEAD_DIM, BLOCK, POOL = 8, 4, 64, 16, 4096

SHAPES = {  # name: (query rows per sequence, context length per sequence)
    "turn 10 of a chat: 185 new tokens on 1,850": ([185], [1850]),
    "4 prefill chunks of 256": ([256] * 4, [256, 512, 300, 400]),
    "32 decode rows, contexts 64-544": ([1] * 32, None),
    "mixed: 16 decode rows + a 512-token chunk": ([1] * 16 + [512], None),
}


def make_inputs(q_lens: list[int], ctx_lens: list[int], rng: np.random.Generator):
    pages = (POOL, KV_HEADS, BLOCK, HEAD_DIM)
    k = mx.array(rng.standard_normal(pages, dtype=np.float32))
    v = mx.array(rng.standard_normal(pages, dtype=np.float32))
    width = max(-(-c // BLOCK) for c in ctx_lens)
    tables = rng.permutation(POOL)[: len(q_lens) * width].reshape(len(q_lens), width)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = mx.array(rng.standard_normal((int(cu[-1]), HEADS, HEAD_DIM), dtype=np.float32))
    mx.eval(k, v, q)
    meta = AttentionMetadata.build(tables, np.array(ctx_lens, np.int32), cu)
    return q, k, v, meta, LayerParams(HEAD_DIM**-0.5)


def milliseconds(fn, args, repeats: int = 7) -> float:
    """Median of `repeats` timed calls after a warm-up."""
    mx.eval(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn(*args))
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def main() -> None:
    warn_without_openblas()
    rng = np.random.default_rng(0)
    for name, (q_lens, ctx_lens) in SHAPES.items():
        if ctx_lens is None:  # decode rows at random contexts, then any chunk on a fresh prompt
            decodes = sum(1 for n in q_lens if n == 1)
            ctx_lens = [int(c) for c in rng.integers(64, 545, decodes)] + q_lens[decodes:]
        args = make_inputs(q_lens, ctx_lens, rng)
        ref = milliseconds(paged_attention_reference, args)
        cpu = milliseconds(paged_attention_cpu, args)
        print(f"{name:45s} reference {ref:7.2f} ms  CPU kernel {cpu:7.2f} ms  x{ref / cpu:.2f}")


if __name__ == "__main__":
    main()
