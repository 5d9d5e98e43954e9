"""Host overhead per decode step: macbatch vs mlx-lm's BatchGenerator, same process.

The model's compute is negligible (1 layer, hidden 64, vocab 2048), so a step's time is what the
host does around it: scheduling, packing, graph building, sampling bookkeeping, detokenization.
On a Mac a small model's decode step takes a few milliseconds on the GPU, so this decides the
race there. For each number of running requests, every request is prefilled (16-token prompts)
and generating; then ``--steps`` decode steps are timed. macbatch detokenizes every token;
mlx-lm does not.

Columns: wall ms per step for both; for macbatch also the host time per step (wall minus the time
the engine thread was blocked waiting for the device) and the host critical path: the host time
that does not overlap device work. Synchronous steps overlap nothing (critical path = host time);
pipelined steps (``--sync`` turns them off) build and dispatch step N+1 while step N runs, so
their critical path is the wall time the device sat idle, estimated as wall minus the device time
the synchronous run measured for the same steps.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.host_overhead [--sizes 1 32 128 256] [--steps 64]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import mlx.core as mx

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.bench import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams

TINY = dict(
    hidden_size=64,
    num_hidden_layers=1,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=2048,
)
PROMPT_LEN = 16


@dataclass
class EngineTiming:
    wall_ms: float  # per step
    wait_ms: float  # per step, engine thread blocked on the device

    @property
    def host_ms(self) -> float:
        return self.wall_ms - self.wait_ms


def time_macbatch(
    model, tokenizer, prompts: list[list[int]], steps: int, pipelined: bool
) -> EngineTiming:
    n = len(prompts)
    max_tokens = steps + 16
    blocks_per_request = -(-(PROMPT_LEN + max_tokens + 1) // 16)
    config = EngineConfig(
        num_blocks=n * blocks_per_request + 1,
        max_num_batched_tokens=max(n * PROMPT_LEN, 1024),
        max_num_seqs=n,
        enable_prefix_caching=False,
        pipelined=pipelined,
    )
    engine = Engine(model, tokenizer, config)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ids = {engine.add_request(p, params) for p in prompts}
    started: set[str] = set()
    while started != ids:  # prefill everyone and let every request emit a token
        started.update(o.request_id for o in engine.step() if o.new_token_ids)
    for _ in range(4):
        engine.step()
    wait0 = engine.stats().device_wait_s
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - t0
    wait = engine.stats().device_wait_s - wait0
    assert engine.stats().running == n, "a request finished inside the timed window"
    return EngineTiming(1e3 * wall / steps, 1e3 * wait / steps)


def time_mlx_lm(model, prompts: list[list[int]], steps: int) -> float:
    from mlx_lm.generate import BatchGenerator

    n = len(prompts)
    gen = BatchGenerator(
        model,
        max_tokens=steps + 16,
        stop_tokens=None,
        completion_batch_size=n,
        prefill_batch_size=n,
    )
    uids = set(gen.insert(prompts, [steps + 16] * n))
    started: set[int] = set()
    while started != uids:
        started.update(r.uid for r in gen.next_generated())
    for _ in range(4):
        gen.next_generated()
    t0 = time.perf_counter()
    for _ in range(steps):
        assert len(gen.next_generated()) == n
    wall = time.perf_counter() - t0
    gen.close()
    return 1e3 * wall / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--sync", action="store_true", help="macbatch without the pipelined step")
    args = parser.parse_args()
    warn_without_openblas()

    model = build_bench_model(**TINY)
    tokenizer = bench_tokenizer(TINY["vocab_size"])
    print(
        f"ms per decode step, {args.steps} steps, {PROMPT_LEN}-token prompts, "
        f"1 layer / hidden 64 / vocab {TINY['vocab_size']}, float32, {mx.default_device()}"
    )
    print(
        "requests | mlx-lm wall | macbatch wall | ratio | macbatch host | host critical path"
        " | device idle"
    )
    for n in args.sizes:
        prompts = synthetic_prompts(n, PROMPT_LEN, PROMPT_LEN, TINY["vocab_size"], seed=n)
        peer = time_mlx_lm(model, prompts, args.steps)
        sync = time_macbatch(model, tokenizer, prompts, args.steps, pipelined=False)
        ours = sync
        critical = sync.host_ms  # nothing overlaps in a synchronous step
        if not args.sync:
            ours = time_macbatch(model, tokenizer, prompts, args.steps, pipelined=True)
            critical = max(0.0, ours.wall_ms - sync.wait_ms)
        print(
            f"{n:8d} | {peer:8.2f} ms | {ours.wall_ms:10.2f} ms | x{ours.wall_ms / peer:4.2f} | "
            f"{ours.host_ms:10.2f} ms | {critical:15.2f} ms | {100 * critical / ours.wall_ms:9.1f}%"
        )


if __name__ == "__main__":
    main()
