"""Host overhead per decode step: macbatch vs mlx-lm's BatchGenerator, same process.

The model's compute is negligible (1 layer, hidden 64, vocab 2048), so a step's time is what the
host does around it: scheduling, packing, graph building, sampling bookkeeping, detokenization.
On a Mac a small model's decode step takes a few milliseconds on the GPU, so this decides the
race there. For each number of running requests, every request is prefilled (16-token prompts)
and generating; then ``--steps`` decode steps are timed, with synchronous and with pipelined
macbatch steps. Neither side detokenizes here: macbatch's outputs carry text that is detokenized
when read (engine/text.py), and nothing reads it.

On a shared machine wall time is stretched by other processes, so CPU time is reported too (the
ratio to trust there, as in benchmarks/throughput.py). On the CPU backend MLX computes on its own
stream thread, so a step's CPU time splits into the engine thread's (host: scheduling, packing,
graph building, reading results, outputs) and the rest (device: the forward and sampling). The
host critical path is the host time the device cannot hide: all of it for synchronous steps, and
for pipelined steps, which build and dispatch step N+1 while step N runs, what is left once a
step's device time overlaps it: max(0, host - device), an estimate that assumes the overlap is
complete (MLX's CPU backend caps it: docs/engine.md).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.host_overhead [--sizes 1 32 128 256] [--steps 64]

(one BLAS thread: at this size BLAS threads only spin, which CPU time would count.)
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
class Timing:
    """Milliseconds per step."""

    wall: float
    cpu: float  # the whole process
    host: float = 0.0  # the engine thread's CPU time

    @property
    def device(self) -> float:
        return self.cpu - self.host


class _Window:
    def __init__(self) -> None:
        self.wall, self.cpu, self.host = (
            time.perf_counter(),
            time.process_time(),
            time.thread_time(),
        )

    def per_step(self, steps: int) -> Timing:
        ms = 1e3 / steps
        return Timing(
            (time.perf_counter() - self.wall) * ms,
            (time.process_time() - self.cpu) * ms,
            (time.thread_time() - self.host) * ms,
        )


def time_macbatch(
    model, tokenizer, prompts: list[list[int]], steps: int, pipelined: bool
) -> Timing:
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
    window = _Window()
    for _ in range(steps):
        engine.step()
    timing = window.per_step(steps)
    assert engine.stats().running == n, "a request finished inside the timed window"
    return timing


def time_mlx_lm(model, prompts: list[list[int]], steps: int) -> Timing:
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
    window = _Window()
    for _ in range(steps):
        assert len(gen.next_generated()) == n
    timing = window.per_step(steps)
    gen.close()
    return timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    warn_without_openblas()

    model = build_bench_model(**TINY)
    tokenizer = bench_tokenizer(TINY["vocab_size"])
    print(
        f"ms per decode step, {args.steps} steps, {PROMPT_LEN}-token prompts, "
        f"1 layer / hidden 64 / vocab {TINY['vocab_size']}, float32, {mx.default_device()}"
    )
    print(
        "requests | engine    | wall / cpu        | ratio wall / cpu | "
        "host (engine thread) | device | host critical path"
    )
    for n in args.sizes:
        prompts = synthetic_prompts(n, PROMPT_LEN, PROMPT_LEN, TINY["vocab_size"], seed=n)
        peer = time_mlx_lm(model, prompts, args.steps)
        print(f"{n:8d} | mlx-lm    | {peer.wall:6.2f} / {peer.cpu:6.2f} ms |")
        for pipelined in (False, True):
            ours = time_macbatch(model, tokenizer, prompts, args.steps, pipelined)
            critical = max(0.0, ours.host - ours.device) if pipelined else ours.host
            print(
                f"{n:8d} | {'pipelined' if pipelined else 'sync':9s} | "
                f"{ours.wall:6.2f} / {ours.cpu:6.2f} ms | "
                f"x{ours.wall / peer.wall:4.2f} / x{ours.cpu / peer.cpu:4.2f}    | "
                f"{ours.host:8.2f} ms          | {ours.device:6.2f} | {critical:6.2f} ms"
            )


if __name__ == "__main__":
    main()
