"""Sparse MLA decode attention (DeepSeek's top-k selection) at the kernel level: the CPU kernel's
sparse path vs its dense path vs the reference's sparse form, same process, same inputs.

The GLM-5 / DeepSeek V3.2 attention shape: query heads (64 by default; GLM-5 has 64, DeepSeek
V3.2 128, mlx-lm's ``deepseek_v32`` defaults to 32) on one latent KV head whose rows hold 512
latent and 64 RoPE columns, the values their leading 512; pages of 16 tokens scattered over the
pool; one decode row per sequence, each listing ``--top-k`` (2,048, the models' ``index_topk``)
distinct positions of its context, its own among them. The dense path attends to the whole
context (what the model computed before its indexer); the sparse paths read only the listed
rows. Wall-clock and process CPU time per call are printed (on a shared machine the CPU time, all
threads, is the steadier measure). Run it on a machine without Metal:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.sparse_attention
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np

from benchmarks.common import warn_without_openblas
from benchmarks.mla_attention import milliseconds
from macbatch.metal import AttentionMetadata, LayerParams
from macbatch.metal.cpu_kernel import paged_attention_cpu
from macbatch.metal.reference import paged_attention_reference

LATENT, ROPE, BLOCK = 512, 64, 16


def make_inputs(
    seqs: int, context: int, heads: int, top_k: int, dtype: mx.Dtype, rng: np.random.Generator
):
    """One decode row per sequence over ``context`` latent rows in shuffled blocks, and its
    selection of ``top_k`` positions."""
    width = -(-context // BLOCK)
    pool = seqs * width + 8
    pages = mx.array(rng.standard_normal((pool, 1, BLOCK, LATENT + ROPE), dtype=np.float32))
    q = mx.array(rng.standard_normal((seqs, heads, LATENT + ROPE), dtype=np.float32))
    pages, q = pages.astype(dtype), q.astype(dtype)
    tables = rng.permutation(pool)[: seqs * width].reshape(seqs, width)
    others = np.stack([rng.permutation(context - 1)[: top_k - 1] for _ in range(seqs)])
    own = np.full((seqs, 1), context - 1)
    selected = mx.array(np.concatenate([others, own], axis=1).astype(np.int32))
    mx.eval(pages, q, selected)
    cu = np.arange(seqs + 1, dtype=np.int32)
    meta = AttentionMetadata.build(tables, np.full(seqs, context, np.int32), cu)
    dense = LayerParams((LATENT + ROPE) ** -0.5, value_dim=LATENT)
    return (q, pages, pages, meta, dense._replace(selected=selected)), dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=2048)
    parser.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="float32")
    args = parser.parse_args()
    warn_without_openblas()
    rng = np.random.default_rng(0)
    print(f"{args.heads} heads, latent {LATENT + ROPE}/{LATENT}, top-{args.top_k}, {args.dtype}")
    for seqs in args.seqs:
        for context in args.contexts:
            sparse, dense = make_inputs(
                seqs, context, args.heads, args.top_k, getattr(mx, args.dtype), rng
            )
            sparse_wall, sparse_cpu = milliseconds(paged_attention_cpu, sparse)
            dense_wall, dense_cpu = milliseconds(paged_attention_cpu, (*sparse[:4], dense))
            ref_wall, ref_cpu = milliseconds(paged_attention_reference, sparse)
            print(
                f"{seqs:2d} x decode on {context // 1024}K: sparse kernel {sparse_wall:7.1f} ms "
                f"wall / {sparse_cpu:7.1f} ms CPU | dense kernel {dense_wall:7.1f} / "
                f"{dense_cpu:7.1f} (x{dense_cpu / sparse_cpu:.1f} CPU, "
                f"x{dense_wall / sparse_wall:.1f} wall) | sparse reference {ref_wall:7.1f} / "
                f"{ref_cpu:7.1f} (x{ref_cpu / sparse_cpu:.1f} CPU, x{ref_wall / sparse_wall:.1f} "
                "wall)"
            )
            del sparse, dense


if __name__ == "__main__":
    main()
