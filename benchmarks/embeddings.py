"""Embedding throughput: the packed engine against a plain padded batched forward of the same
model (what a simple embedding server does: take inputs in batches, pad each batch to its
longest input, one forward, pool), on long-tailed document lengths (issue 34). Random
Qwen3-shaped float32 model, last-token pooling; both sides' vectors are checked to agree.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.embeddings [--docs 192] [--batch 32]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.commands.workload import Clock, run_pooling_workload
from macbatch.engine import Engine, EngineConfig, PoolingParams


def long_tailed_lengths(count: int, median: int, longest: int, seed: int = 0) -> list[int]:
    """Log-normal document lengths (most short, a few long, as a real corpus), within
    [8, longest]."""
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(median), 1.0, size=count)
    return [int(n) for n in np.clip(lengths, 8, longest)]


def padded_batches(
    docs: list[list[int]], batch: int
) -> Iterator[tuple[list[list[int]], np.ndarray]]:
    """Batches of ``batch`` documents in arrival order, each with its ids right-padded (0) to
    its longest document, [B, width]."""
    for start in range(0, len(docs), batch):
        group = docs[start : start + batch]
        ids = np.zeros((len(group), max(map(len, group))), dtype=np.int32)
        for i, doc in enumerate(group):
            ids[i, : len(doc)] = doc
        yield group, ids


def padded_forward(model: nn.Module, docs: list[list[int]], batch: int) -> list[np.ndarray]:
    """Batches in arrival order, each right-padded to its longest document: with causal
    attention padding after a document never reaches its tokens, so its last token's state is
    exact, and no mask is needed. Normalized like the engine's."""
    vectors = []
    for group, ids in padded_batches(docs, batch):
        hidden = model.model(mx.array(ids))
        last = hidden[mx.arange(len(group)), mx.array([len(d) - 1 for d in group])]
        last = last.astype(mx.float32)
        last = last / mx.linalg.norm(last, axis=-1, keepdims=True)
        mx.eval(last)
        vectors.extend(np.array(last))
    return vectors


def describe_corpus(lengths: list[int], batch: int) -> int:
    """Print the corpus and what padded batches of ``batch`` compute; its token count."""
    tokens = sum(lengths)
    padded = sum(
        max(lengths[i : i + batch]) * len(lengths[i : i + batch])
        for i in range(0, len(lengths), batch)
    )
    print(
        f"{len(lengths)} documents, {tokens:,} tokens (median {int(np.median(lengths))}, longest "
        f"{max(lengths)}); padded batches of {batch} compute {padded:,} positions"
    )
    return tokens


def report(
    side: str, tokens: int, packed: tuple[float, float], padded: tuple[float, float], worst: float
) -> None:
    """Both sides' tok/s (wall and CPU time) and their ratio."""
    print(f"packed {side}: {tokens / packed[0]:,.0f} tok/s wall, {tokens / packed[1]:,.0f} CPU")
    print(f"padded batches: {tokens / padded[0]:,.0f} tok/s wall, {tokens / padded[1]:,.0f} CPU")
    print(
        f"ratio ({side} / padded): {padded[0] / packed[0]:.2f}x wall, "
        f"{padded[1] / packed[1]:.2f}x CPU; lowest cosine between the two sides {worst:.6f}"
    )


def corpus_arguments(
    description: str, docs: int, median: int, longest: int, budget: int
) -> argparse.ArgumentParser:
    """The options both embedding benchmarks take, with their defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--docs", type=int, default=docs)
    parser.add_argument("--median", type=int, default=median, help="median document tokens")
    parser.add_argument("--longest", type=int, default=longest)
    parser.add_argument("--batch", type=int, default=32, help="the padded side's batch size")
    parser.add_argument("--budget", type=int, default=budget, help="packed tokens per step")
    return parser


def main() -> None:
    args = corpus_arguments(__doc__.splitlines()[0], 192, 48, 1024, 2048).parse_args()
    warn_without_openblas()
    model = build_bench_model()
    rng = np.random.default_rng(1)
    lengths = long_tailed_lengths(args.docs, args.median, args.longest)
    docs = [rng.integers(10, 32000, size=n).tolist() for n in lengths]
    tokens = describe_corpus(lengths, args.batch)
    config = EngineConfig(max_num_batched_tokens=args.budget, max_num_seqs=256)
    engine = Engine(model, bench_tokenizer(), config)
    run_pooling_workload(engine, docs[:4])  # warm up: kernels, the pool's first growth
    padded_forward(model, docs[:4], 4)

    result, packed = run_pooling_workload(engine, docs, PoolingParams())
    clock = Clock()
    plain = padded_forward(model, docs, args.batch)
    padded_wall, padded_cpu = clock.read()
    worst = min(float(np.dot(a, b)) for a, b in zip(packed, plain))
    report("engine", tokens, result.elapsed, (padded_wall, padded_cpu), worst)


if __name__ == "__main__":
    main()
