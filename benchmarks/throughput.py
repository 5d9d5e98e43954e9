"""Throughput and time to first token: macbatch vs mlx-lm's BatchGenerator, same process.

Workload (issue 2): 32 requests, prompt lengths uniform in 32..512 (seeded), 64 new tokens each,
EOS ignored, a random Qwen3-shaped float32 model (8 layers, hidden 512, 8/4 heads, head_dim 64,
vocab 32000). All requests arrive at once.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python benchmarks/throughput.py [--requests 32] [--budget 1024]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from benchmarks.common import (
    bench_tokenizer,
    build_bench_model,
    random_prompts,
    warn_without_openblas,
)


def run_mlx_lm(model, prompts, max_tokens):
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=None)
    clock = Clock()
    uids = gen.insert(prompts, [max_tokens] * len(prompts))
    first: dict[int, tuple[float, float]] = {}
    generated = 0
    while responses := gen.next_generated():
        now = clock.read()
        for r in responses:
            first.setdefault(r.uid, now)
            generated += 1
    elapsed = clock.read()
    gen.close()
    return elapsed, generated, [first[u] for u in uids]


class Clock:
    """Wall time and this process's CPU time since creation. CPU time is what to compare on a
    shared machine: other processes stretch wall time, not the CPU work a run needs."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0


class _TimedEval:
    """Stands in for ``mx`` inside the engine module to time the step's single mx.eval."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __getattr__(self, name):
        return getattr(mx, name)

    def eval(self, *arrays):
        t = time.perf_counter()
        mx.eval(*arrays)
        self.seconds += time.perf_counter() - t


def run_macbatch(model, tokenizer, prompts, max_tokens, budget):
    import macbatch.engine.engine as engine_module
    from macbatch.engine import Engine, EngineConfig, SamplingParams

    total_tokens = sum(len(p) for p in prompts) + max_tokens * len(prompts)
    config = EngineConfig(
        num_blocks=total_tokens // 16 + 2 * len(prompts),
        max_num_batched_tokens=budget,
        max_num_seqs=len(prompts),
    )
    engine = Engine(model, tokenizer, config)
    timed = _TimedEval()
    engine_module.mx = timed
    step_tokens: list[int] = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    first: dict[str, tuple[float, float]] = {}
    generated = 0
    try:
        clock = Clock()
        for p in prompts:
            engine.add_request(p, params)
        while engine.has_unfinished():
            outputs = engine.step()
            now = clock.read()
            for out in outputs:
                first.setdefault(out.request_id, now)
                generated += len(out.new_token_ids)
            step_tokens.append(engine.stats().tokens_last_step)
        elapsed = clock.read()
    finally:
        engine_module.mx = mx
    return elapsed, generated, list(first.values()), timed.seconds, step_tokens


def bare_forward_seconds(model, step_tokens):
    """The model's linear layers alone (no attention context, no head) for each step's N."""
    inner = model.model
    total = 0.0
    for n in step_tokens:
        tokens = mx.zeros((n, 1), dtype=mx.int32)
        t = time.perf_counter()
        mx.eval(inner(tokens))
        total += time.perf_counter() - t
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--min-prompt", type=int, default=32)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=1024, help="max_num_batched_tokens")
    args = parser.parse_args()
    warn_without_openblas()

    model = build_bench_model()
    tokenizer = bench_tokenizer()
    prompts = random_prompts(args.requests, args.min_prompt, args.max_prompt)
    prompt_tokens = sum(len(p) for p in prompts)
    print(f"{len(prompts)} requests, {prompt_tokens} prompt tokens, {args.max_tokens} new each")

    ours = run_macbatch(model, tokenizer, prompts, args.max_tokens, args.budget)
    peer = run_mlx_lm(model, prompts, args.max_tokens)
    bare = bare_forward_seconds(model, ours[4])

    for kind, index in (("wall", 0), ("cpu", 1)):
        rows = []
        for name, (elapsed, generated, ttft, *_) in (("macbatch", ours), ("mlx-lm", peer)):
            seconds = elapsed[index]
            median_ttft = statistics.median(t[index] for t in ttft)
            total = (prompt_tokens + generated) / seconds
            rows.append((total, generated / seconds, median_ttft))
            print(
                f"{name:9s} {kind:4s} {seconds:6.1f} s  total {total:7.1f} tok/s  "
                f"generated {generated / seconds:6.1f} tok/s  median TTFT {median_ttft:6.2f} s"
            )
        (t0, g0, f0), (t1, g1, f1) = rows
        print(
            f"ratio     {kind:4s} total tok/s x{t0 / t1:.2f}  generated tok/s x{g0 / g1:.2f}  "
            f"median TTFT {f1 / f0:.2f}x lower"
        )
    wall = ours[0][0]
    eval_s, steps = ours[3], ours[4]
    host = wall - eval_s
    print(
        f"macbatch  {len(steps)} steps: {eval_s:.1f} s in the step's mx.eval, {host:.2f} s on the "
        f"host (scheduling, packing, graph building, sampling bookkeeping) = "
        f"{100 * host / wall:.1f}% of step time; bare forward (no attention) for the same "
        f"token counts: {bare:.1f} s"
    )


if __name__ == "__main__":
    main()
