"""Throughput and time to first token: macbatch vs mlx-lm's BatchGenerator, same process.

Also the device idle fraction (wall time with no step in flight) of macbatch with synchronous
and with pipelined steps, and of mlx-lm (issue 18): measured as the wall time MLX's stream thread
neither ran nor waited for a core (``DeviceClock``); for synchronous steps also as the engine
thread's time outside MLX's evaluation calls, a cross-check.

Workload (issue 2): 32 requests, prompt lengths uniform in 32..512 (seeded), 64 new tokens each,
EOS ignored, a random Qwen3-shaped float32 model (8 layers, hidden 512, 8/4 heads, head_dim 64,
vocab 32000). All requests arrive at once. Wall and CPU time are both reported: on a shared
machine the CPU-time ratio is the one to trust.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.throughput [--requests 32] [--budget 1024] [--disk-cache]

``--disk-cache`` also runs pipelined macbatch with the disk tier below its prefix cache, as the
front ends run it, in an empty temporary directory: no prompt is found on disk and every
prompt's blocks are written (the tier's whole cost, none of its gain), against the pipelined
run without it.
"""

from __future__ import annotations

import tempfile
import time

import mlx.core as mx
import numpy as np

from benchmarks.common import (
    DeviceClock,
    bench_tokenizer,
    build_bench_model,
    warn_without_openblas,
    workload_arguments,
)
from macbatch.commands.workload import Clock, WorkloadResult, run_workload, synthetic_prompts


def run_mlx_lm(
    model, prompts: list[list[int]], max_tokens: int
) -> tuple[WorkloadResult, float | None]:
    """The workload's result and the seconds a step was in flight."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=None)
    device = DeviceClock()
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
    busy = device.busy_seconds()
    gen.close()
    result = WorkloadResult(
        prompt_tokens=sum(len(p) for p in prompts),
        generated_tokens=generated,
        elapsed=elapsed,
        first_token=[first[u] for u in uids],
    )
    return result, busy


def run_macbatch(
    model, tokenizer, prompts, max_tokens, budget, pipelined: bool, disk_cache: str | None = None
) -> tuple[WorkloadResult, float, float | None]:
    """The workload's result, the seconds the engine thread waited for the device, and the
    seconds a step was in flight; ``disk_cache``: the disk tier's directory (None: off)."""
    from macbatch.engine import Engine, EngineConfig

    total_tokens = sum(len(p) for p in prompts) + max_tokens * len(prompts)
    config = EngineConfig(
        num_blocks=total_tokens // 16 + 2 * len(prompts),
        max_num_batched_tokens=budget,
        max_num_seqs=len(prompts),
        pipelined=pipelined,
        disk_cache_dir=disk_cache,
    )
    engine = Engine(model, tokenizer, config)
    device = DeviceClock()
    result = run_workload(engine, prompts, max_tokens)
    engine.close()  # the disk tier's writer drained
    return result, engine.stats().device_wait_s, device.busy_seconds()


def bare_forward_seconds(model, step_tokens: list[int]) -> list[float]:
    """The model's layers alone (no attention context, no head) for each step's token count."""
    seconds = []
    for n in step_tokens:
        if n == 0:  # a pipelined engine's last call only reads the step before it
            seconds.append(0.0)
            continue
        tokens = mx.zeros((n, 1), dtype=mx.int32)
        t = time.perf_counter()
        mx.eval(model.model(tokens))
        seconds.append(time.perf_counter() - t)
    return seconds


def print_bounds(ours: WorkloadResult, peer: WorkloadResult, bare: list[float]) -> None:
    """What the model's own matmuls allow on this machine: the ratios macbatch would reach if
    attention, the LM head, sampling and scheduling cost nothing (same steps, same order)."""
    cumulative = np.cumsum(bare)
    ttft_floor = float(np.median(cumulative[ours.first_token_step]))
    print(
        f"bounds    the same steps with free attention/head/sampling: {cumulative[-1]:.1f} s, "
        f"median TTFT {ttft_floor:.2f} s -> at most x{peer.elapsed[0] / cumulative[-1]:.2f} "
        f"throughput and {peer.median_ttft(0) / ttft_floor:.2f}x lower TTFT vs mlx-lm (wall)"
    )


def idle_percent(result: WorkloadResult, busy: float | None) -> str:
    """The share of the run's wall time with no step in flight."""
    if busy is None:
        return "n/a (no /proc)"
    return f"{100 * max(0.0, 1 - busy / result.elapsed[0]):.1f}%"


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.add_argument(
        "--disk-cache", action="store_true",
        help="also run pipelined macbatch with the disk tier below its prefix cache",
    )  # fmt: skip
    args = parser.parse_args()
    warn_without_openblas()

    model = build_bench_model()
    tokenizer = bench_tokenizer()
    prompts = synthetic_prompts(args.requests, args.min_prompt, args.max_prompt, 32000)
    sync, device_s, sync_busy = run_macbatch(
        model, tokenizer, prompts, args.max_tokens, args.budget, False
    )
    ours, _, ours_busy = run_macbatch(model, tokenizer, prompts, args.max_tokens, args.budget, True)
    peer, peer_busy = run_mlx_lm(model, prompts, args.max_tokens)
    bare = bare_forward_seconds(model, ours.step_tokens)
    print(
        f"{len(prompts)} requests, {ours.prompt_tokens} prompt tokens, {args.max_tokens} new each"
    )

    for clock, kind in ((0, "wall"), (1, "cpu")):
        for name, result in (("macbatch", ours), ("mlx-lm", peer)):
            print(
                f"{name:9s} {kind:4s} {result.elapsed[clock]:6.1f} s  "
                f"total {result.total_tokens_per_s(clock):7.1f} tok/s  "
                f"generated {result.generated_tokens_per_s(clock):6.1f} tok/s  "
                f"median TTFT {result.median_ttft(clock):6.2f} s"
            )
        print(
            f"ratio     {kind:4s} total tok/s "
            f"x{ours.total_tokens_per_s(clock) / peer.total_tokens_per_s(clock):.2f}  "
            f"median TTFT {peer.median_ttft(clock) / ours.median_ttft(clock):.2f}x lower"
        )
    # A synchronous step overlaps nothing: its wait is the device's time, the rest is host
    # time with no step in flight.
    host = sync.elapsed[0] - device_s
    print(
        f"macbatch  {len(ours.step_tokens)} steps: synchronous {sync.elapsed[0]:.1f} s wall, "
        f"pipelined {ours.elapsed[0]:.1f} s wall; bare forward (no attention, no head) for the "
        f"same token counts: {sum(bare):.1f} s"
    )
    print(
        f"device idle  synchronous {idle_percent(sync, sync_busy)} (engine thread outside MLX's "
        f"evaluation calls: {100 * host / sync.elapsed[0]:.1f}%), pipelined "
        f"{idle_percent(ours, ours_busy)}, mlx-lm {idle_percent(peer, peer_busy)}"
    )
    print_bounds(ours, peer, bare)
    if args.disk_cache:
        with tempfile.TemporaryDirectory() as cache:
            disk, _, _ = run_macbatch(
                model, tokenizer, prompts, args.max_tokens, args.budget, True, cache
            )
        print_disk_tier(ours, disk)


def print_disk_tier(off: WorkloadResult, on: WorkloadResult) -> None:
    """Pipelined macbatch with the disk tier (every prompt's blocks written, none found) against
    it without, wall and CPU time."""
    for clock, kind in ((0, "wall"), (1, "cpu")):
        print(
            f"disk tier {kind:4s} {on.elapsed[clock]:6.1f} s  total "
            f"{on.total_tokens_per_s(clock):7.1f} tok/s  median TTFT {on.median_ttft(clock):6.2f} "
            f"s: x{on.total_tokens_per_s(clock) / off.total_tokens_per_s(clock):.2f} total "
            f"tok/s, x{on.median_ttft(clock) / off.median_ttft(clock):.2f} median TTFT of the "
            f"run without it"
        )


if __name__ == "__main__":
    main()
