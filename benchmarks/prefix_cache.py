"""Prefix caching on and off: time to first token of turn 10 of a conversation, and a 200-request
job sharing a 500-token system prompt (issue 7). Random Qwen3-shaped float32 model, or with
``--hybrid`` a Qwen3.5-shaped one of the same size (issue 31).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.prefix_cache [--requests 200] [--hybrid]
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import (
    HYBRID_BENCH_MODEL,
    bench_tokenizer,
    build_bench_model,
    warn_without_openblas,
)
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams


def conversation_ttfts(engine: Engine, turns: int, user_tokens: int, reply_tokens: int):
    """Each turn resends the whole conversation plus a new user message."""
    params = SamplingParams(max_tokens=reply_tokens, temperature=0, ignore_eos=True)
    conversation: list[int] = []
    ttfts = []
    for turn in range(turns):
        conversation = (
            conversation + synthetic_prompts(1, user_tokens, user_tokens, 32000, seed=turn)[0]
        )
        out = engine.generate([conversation], params)[0]
        ttfts.append(out.metrics.time_to_first_token_s)
        conversation = conversation + out.token_ids
    return ttfts


def shared_prompt_job(engine: Engine, requests: int, system_tokens: int):
    system = synthetic_prompts(1, system_tokens, system_tokens, 32000, seed=99)[0]
    prompts = [system + p for p in synthetic_prompts(requests, 20, 60, 32000, seed=5)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    engine.generate(prompts, params)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--system-tokens", type=int, default=500)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument(
        "--hybrid",
        action="store_true",
        help="a Qwen3.5-shaped hybrid of the same size (3 of 4 layers Gated DeltaNet): its cache "
        "resumes from recurrent-state checkpoints",
    )
    args = parser.parse_args()
    warn_without_openblas()
    model = build_bench_model(**(HYBRID_BENCH_MODEL if args.hybrid else {}))
    tokenizer = bench_tokenizer()
    results = {}
    for caching in (True, False):
        config = EngineConfig(num_blocks=4096, enable_prefix_caching=caching, max_num_seqs=64)
        engine = Engine(model, tokenizer, config)
        ttfts = conversation_ttfts(engine, args.turns, 120, 64)
        hits = engine.stats().prefix_cache_hit_rate
        wall = shared_prompt_job(
            Engine(model, tokenizer, config), args.requests, args.system_tokens
        )
        results[caching] = (ttfts, wall)
        label = "on " if caching else "off"
        print(
            f"caching {label}: conversation TTFT turn 1 {ttfts[0] * 1000:7.1f} ms, "
            f"turn {args.turns} {ttfts[-1] * 1000:7.1f} ms (x{ttfts[-1] / ttfts[0]:.2f}), "
            f"prefix cache hit rate {hits:.0%}; "
            f"{args.requests}-request job {wall:6.1f} s ({args.requests / wall:.1f} req/s)"
        )
    on, off = results[True], results[False]
    print(
        f"caching speeds turn {args.turns}'s TTFT x{off[0][-1] / on[0][-1]:.2f} and the shared-"
        f"prompt job x{off[1] / on[1]:.2f}"
    )


if __name__ == "__main__":
    main()
