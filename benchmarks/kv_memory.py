"""Quantized KV pages: context per GiB, peak memory and throughput, float vs 8-bit vs 4-bit.

1. Tokens of context per GiB of pool for a 32-layer model with 8 KV heads (head dims 64 and
   128), from the engine's own byte count (`PageFormat.bytes_per_block`, scales included), at
   group size 64, and the ratio to float16.
2. A 32-request long-context run (prompts of ``--prompt`` tokens, ``--max-tokens`` new ones) on
   the benchmarks' random Qwen3-shaped model (8 layers, 4 KV heads, head dim 64), the pool sized
   to the workload: the pool's bytes, MLX's peak memory over the whole run (weights included),
   and throughput (process CPU time, the number to trust on a shared machine), each format in
   the same process. On CPU the float pages are float32 (the engine's CPU dtype).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.kv_memory [--prompt 1024] [--max-tokens 32]
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.commands.workload import run_workload, synthetic_prompts
from macbatch.engine import Engine, EngineConfig
from macbatch.engine.stores.pages import LayerShape, PageFormat

FORMATS = {"float": None, "8-bit": 8, "4-bit": 4}
GIB = 2**30


def context_per_gib() -> None:
    print("tokens of context per GiB of pool, 32 layers x 8 KV heads, group size 64")
    print(f"{'head dim':>8} {'format':8} {'bytes/token':>12} {'tokens/GiB':>11} {'vs float16':>10}")
    for head_dim in (64, 128):
        shapes = [LayerShape(8, head_dim)] * 32
        base = None
        for name, bits in {"float16": None, "8-bit": 8, "4-bit": 4}.items():
            per_token = PageFormat(mx.float16, bits, 64).bytes_per_block(shapes, 16) / 16
            tokens = GIB / per_token
            base = base or tokens
            print(f"{head_dim:8d} {name:8} {per_token:12.0f} {tokens:11.0f} {tokens / base:9.2f}x")


def long_context_run(prompt_len: int, max_tokens: int, requests: int) -> None:
    model = build_bench_model()
    tokenizer = bench_tokenizer()
    prompts = synthetic_prompts(requests, prompt_len, prompt_len, 32000)
    blocks = requests * -(-(prompt_len + max_tokens) // 16)
    print(
        f"\n{requests} requests x ({prompt_len} prompt + {max_tokens} new tokens), "
        f"{blocks} blocks of 16"
    )
    print(
        f"{'KV':6} {'pool MiB':>9} {'peak MiB':>9} {'gen tok/s (cpu)':>16} {'vs float':>9} "
        f"{'total tok/s (cpu)':>18}"
    )
    base = None
    for name, bits in FORMATS.items():
        mx.clear_cache()
        mx.reset_peak_memory()
        config = EngineConfig(
            num_blocks=blocks, max_num_seqs=requests, max_num_batched_tokens=2048, kv_bits=bits
        )
        engine = Engine(model, tokenizer, config)
        result = run_workload(engine, prompts, max_tokens)
        peak = mx.get_peak_memory()
        rate = result.generated_tokens_per_s(clock=1)
        base = base or rate
        print(
            f"{name:6} {engine.stats().kv_cache_bytes / 2**20:9.1f} {peak / 2**20:9.1f} "
            f"{rate:16.1f} {rate / base:8.2f}x {result.total_tokens_per_s(clock=1):18.1f}"
        )
        del engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    warn_without_openblas()
    context_per_gib()
    long_context_run(args.prompt, args.max_tokens, args.requests)


if __name__ == "__main__":
    main()
