"""KV bytes of one long request on a Gemma 3-shaped model: sliding-window layers hold only their
window (docs/engine.md, "Cache groups").

The model has Gemma 3 1B's attention layout (26 layers, one full-attention layer in six, windows
of 512 tokens, 1 KV head of dim 256; the rest shrunk, which changes no KV byte) with random
weights. One request of ``--prompt`` tokens generates ``--max-tokens``; after every step the bytes
of the pages the request holds (both groups' blocks in use; window blocks it gave back sit idle
in the prefix cache, reused first) are read. Prints their most while prefilling and while
decoding, and after the request finished what the prefix cache keeps (``kv_bytes_used``), each
against every layer at the prompt's full length (``ModelInfo.kv_bytes_per_token`` times it).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.window_kv [--prompt 2000] [--chunk 1024]
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.window import SlidingWindowGroup

GEMMA3_1B_ATTENTION = dict(
    model_type="gemma3_text",
    num_hidden_layers=26,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    query_pre_attn_scalar=256,
    hidden_size=256,
    intermediate_size=512,
    sliding_window=512,
    sliding_window_pattern=6,
    max_position_embeddings=32768,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=1024, help="max_num_batched_tokens")
    args = parser.parse_args()
    warn_without_openblas()
    model = build_bench_model(**GEMMA3_1B_ATTENTION)
    config = EngineConfig(max_num_batched_tokens=args.chunk)
    engine = Engine(model, bench_tokenizer(), config)
    prompt = np.random.default_rng(0).integers(3, 32000, size=args.prompt).tolist()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    engine.add_request(prompt, params)
    prefill, decode = [0], [0]
    while engine.has_unfinished():
        engine.step()
        stats = engine.stats()
        if stats.running:
            (decode if stats.tokens_last_step == 1 else prefill).append(_held_bytes(engine))
    full = engine.info.model.kv_bytes_per_token * args.prompt
    print(f"every layer at {args.prompt} tokens: {full / 2**20:.2f} MiB")
    for label, used in (
        ("prefilling, most", max(prefill)),
        ("decoding, most", max(decode)),
        ("finished (prefix cache)", engine.stats().kv_bytes_used),
    ):
        print(f"{label:>24}: {used / 2**20:.2f} MiB = {used / full:.1%}")


def _held_bytes(engine: Engine) -> int:
    """Bytes of the pages requests hold in both groups (not idle prefix-cache blocks)."""
    pool = engine.kv.pool
    held = (pool.num_blocks - pool.num_free) * engine.runner.store.bytes_per_block
    window = engine.kv.group(SlidingWindowGroup)
    if window is not None:
        held += (window.pool.num_blocks - window.pool.num_free) * window.spec.bytes_per_block
    return held


if __name__ == "__main__":
    main()
