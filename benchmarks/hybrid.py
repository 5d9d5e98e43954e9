"""A hybrid model on the engine against mlx-lm, same process (issue 31): prompt processing of one
long prompt (macbatch's time to first token vs mlx-lm's ``generate_step``), and the long-tailed
many-request workload of ``benchmarks/throughput.py`` (vs mlx-lm's ``BatchGenerator``).

Model: random Qwen3.5-shaped float32 (``qwen3_5``: hidden 1024, 24 layers, 3 of every 4 Gated
DeltaNet, 16 value / 8 key heads of 128 for them, 8/4 attention heads of 128, vocab 32000). On
the CPU mlx-lm steps a Gated DeltaNet layer through a prompt token by token; macbatch runs its
chunked prefill (``engine/model/hooks/gated_delta.py``). Repeats interleave the two sides; medians
reported.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.hybrid [--prompt 2048] [--repeats 3] [--requests 32] [--skip-workload]
            [--layers 24]

``--layers 4`` (one attention layer after three Gated DeltaNet layers) is a cut of the same model
that runs the workload in about 2 minutes instead of 18, for comparing changes; the issue's
numbers are the 24-layer model's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import mlx.core as mx

from benchmarks.common import (
    QWEN3_5_SHAPE,
    bench_tokenizer,
    build_bench_model,
    warn_without_openblas,
)
from benchmarks.throughput import run_macbatch, run_mlx_lm
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams

MODEL = QWEN3_5_SHAPE


def macbatch_prefill(engine: Engine, prompt: list[int]) -> None:
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))


def mlx_lm_prefill(model, prompt: list[int]) -> None:
    from mlx_lm.generate import generate_step

    for token, _ in generate_step(mx.array(prompt), model, max_tokens=1):
        mx.eval(token)
        break


def clocked(run: Callable[[], None]) -> tuple[float, float]:
    """Wall and process CPU seconds of ``run`` (CPU time: what a loaded, shared machine's
    waiting for a core does not inflate)."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=2048, help="tokens of the long prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--skip-workload", action="store_true")
    parser.add_argument(
        "--layers", type=int, default=MODEL["num_hidden_layers"], help="a multiple of 4"
    )
    args = parser.parse_args()
    if args.layers <= 0 or args.layers % MODEL["full_attention_interval"]:
        parser.error(f"--layers {args.layers}: a positive multiple of 4 keeps the 3:1 layout")
    warn_without_openblas()
    model = build_bench_model(**dict(MODEL, num_hidden_layers=args.layers))
    tokenizer = bench_tokenizer()
    prompt = synthetic_prompts(1, args.prompt, args.prompt, 32000, seed=1)[0]
    config = EngineConfig(num_blocks=1024, max_num_batched_tokens=args.prompt)
    ours, peer = [], []
    for _ in range(args.repeats):  # a fresh engine each time: nothing cached
        engine = Engine(model, tokenizer, config)
        ours.append(clocked(partial(macbatch_prefill, engine, prompt)))
        peer.append(clocked(partial(mlx_lm_prefill, model, prompt)))
    for clock, kind in ((0, "wall"), (1, "cpu")):
        mine = statistics.median(t[clock] for t in ours)
        theirs = statistics.median(t[clock] for t in peer)
        print(
            f"prefill of one {args.prompt}-token prompt, {kind}: macbatch {mine:.2f} s "
            f"({args.prompt / mine:.0f} tok/s), mlx-lm generate {theirs:.2f} s "
            f"({args.prompt / theirs:.0f} tok/s): x{theirs / mine:.2f}"
        )
    if args.skip_workload:
        return
    prompts = synthetic_prompts(args.requests, 32, 512, 32000)
    result, _, _ = run_macbatch(model, tokenizer, prompts, 64, 1024, True)
    base, _ = run_mlx_lm(model, prompts, 64)
    for clock, kind in ((0, "wall"), (1, "cpu")):
        print(
            f"{args.requests}-request workload, {kind}: macbatch "
            f"{result.total_tokens_per_s(clock):.1f} tok/s, mlx-lm BatchGenerator "
            f"{base.total_tokens_per_s(clock):.1f} tok/s: "
            f"x{result.total_tokens_per_s(clock) / base.total_tokens_per_s(clock):.2f}; median "
            f"TTFT {base.median_ttft(clock) / result.median_ttft(clock):.2f}x lower"
        )


if __name__ == "__main__":
    main()
