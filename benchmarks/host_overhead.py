"""Host overhead per decode step: macbatch vs mlx-lm's BatchGenerator, same process.

The model's compute is negligible (1 layer, hidden 64, vocab 2048), so a step's time is what the
host does around it: scheduling, packing, graph building, sampling bookkeeping, detokenization.
On a Mac a small model's decode step takes a few milliseconds on the GPU, so this decides the
race there. For each number of running requests, every request is prefilled (16-token prompts)
and generating; then windows of ``--steps`` decode steps are timed, ``--repeats`` per engine,
interleaved (mlx-lm, synchronous macbatch, pipelined macbatch, mlx-lm, ...) so that load
drifting on a shared machine hits them alike; medians over the windows are reported, ratios
window by window against the mlx-lm window beside it. Neither
side detokenizes here: macbatch's outputs carry text that is detokenized when read
(engine/text.py), and nothing reads it.

On a shared machine wall time is stretched by other processes, so CPU time is reported too (the
ratio to trust there, as in benchmarks/throughput.py). On the CPU backend MLX computes on its own
stream thread, so a step's CPU time splits into the engine thread's (host: scheduling, packing,
graph building, reading results, outputs) and the rest (device: the forward and sampling). The
host critical path is the host time the device cannot hide: all of it for synchronous steps, and
for pipelined steps, which build and dispatch step N+1 while step N runs, what is left once a
step's device time overlaps it: max(0, host - device), an estimate that assumes the overlap is
complete (MLX's CPU backend caps it: docs/engine.md). The "graph" row is the decode step's
graph alone (forward, greedy sampling, ``mx.async_eval``, no engine around it): the floor of a
macbatch step on this backend.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.host_overhead [--sizes 1 32 128 256] [--steps 32] [--repeats 9]

(one BLAS thread: at this size BLAS threads only spin, which CPU time would count.)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from benchmarks.common import bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.bench import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.packing import pack

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
WARMUP_STEPS = 4


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


class MacbatchArm:
    """An engine with every request prefilled and generating, stepped on demand."""

    def __init__(
        self, model, tokenizer, prompts: list[list[int]], max_tokens: int, pipelined: bool
    ) -> None:
        self.n = n = len(prompts)
        self.name = "pipelined" if pipelined else "sync"
        blocks_per_request = -(-(PROMPT_LEN + max_tokens + 1) // 16)
        config = EngineConfig(
            num_blocks=n * blocks_per_request + 1,
            max_num_batched_tokens=max(n * PROMPT_LEN, 1024),
            max_num_seqs=n,
            enable_prefix_caching=False,
            pipelined=pipelined,
        )
        self.engine = Engine(model, tokenizer, config)
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        ids = {self.engine.add_request(p, params) for p in prompts}
        started: set[str] = set()
        while started != ids:  # prefill everyone and let every request emit a token
            started.update(o.request_id for o in self.engine.step() if o.new_token_ids)
        for _ in range(WARMUP_STEPS):
            self.engine.step()

    def step(self) -> None:
        self.engine.step()

    def check(self) -> None:
        assert self.engine.stats().running == self.n, "a request finished inside a timed window"

    def close(self) -> None:
        pass


class GraphArm:
    """The decode step's graph alone: macbatch's packed forward over the paged cache, greedy
    sampling and ``mx.async_eval``, built each step on one packed batch with no scheduling,
    packing or outputs. The floor of a macbatch step on this backend: the rest of a step's
    host time is the engine's own."""

    name = "graph"

    def __init__(self, model, tokenizer, prompts: list[list[int]], max_tokens: int) -> None:
        self.engine = engine = MacbatchArm(model, tokenizer, prompts, max_tokens, False).engine
        plan = engine.scheduler.schedule()
        tables = [engine.kv.block_table(c.request.request_id) for c in plan.chunks]
        heads = {s.num_kv_heads for s in engine.adapter.layer_shapes}
        self.batch = pack(plan, tables, engine.config.block_size, heads)

    def step(self) -> None:
        logits = self.engine.adapter.forward(self.batch, self.engine.runner.kv_stores)
        mx.async_eval(mx.argmax(logits, axis=-1), *self.engine.store.arrays())

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


class MlxLmArm:
    """mlx-lm's BatchGenerator with every request prefilled and generating."""

    name = "mlx-lm"

    def __init__(self, model, prompts: list[list[int]], max_tokens: int) -> None:
        from mlx_lm.generate import BatchGenerator

        self.n = n = len(prompts)
        self.gen = BatchGenerator(
            model,
            max_tokens=max_tokens,
            stop_tokens=None,
            completion_batch_size=n,
            prefill_batch_size=n,
        )
        uids = set(self.gen.insert(prompts, [max_tokens] * n))
        started: set[int] = set()
        while started != uids:
            started.update(r.uid for r in self.gen.next_generated())
        for _ in range(WARMUP_STEPS):
            self.gen.next_generated()

    def step(self) -> None:
        assert len(self.gen.next_generated()) == self.n

    def check(self) -> None:
        pass

    def close(self) -> None:
        self.gen.close()


def timed(arm: MacbatchArm | MlxLmArm | GraphArm, steps: int) -> Timing:
    """``steps`` steps and the drain of the last one: every window does the same work, and the
    next arm's window starts with nothing of this one's in flight."""
    window = _Window()
    for _ in range(steps):
        arm.step()
    mx.synchronize()
    timing = window.per_step(steps)
    arm.check()
    return timing


def median(values: list[float]) -> float:
    return float(np.median(values))


def measure(model, tokenizer, n: int, steps: int, repeats: int) -> list[list[Timing]]:
    """Per-step timings of ``repeats`` windows each of mlx-lm, synchronous and pipelined
    macbatch and the graph alone, interleaved so that load drifting on a shared machine hits
    all of them alike: window i of every arm ran at about the same time."""
    prompts = synthetic_prompts(n, PROMPT_LEN, PROMPT_LEN, TINY["vocab_size"], seed=n)
    max_tokens = WARMUP_STEPS + steps * repeats + 16
    arms = [
        MlxLmArm(model, prompts, max_tokens),
        MacbatchArm(model, tokenizer, prompts, max_tokens, pipelined=False),
        MacbatchArm(model, tokenizer, prompts, max_tokens, pipelined=True),
        GraphArm(model, tokenizer, prompts, max_tokens),
    ]
    windows: list[list[Timing]] = [[] for _ in arms]
    for _ in range(repeats):
        for arm, timings in zip(arms, windows):
            timings.append(timed(arm, steps))
    for arm in arms:
        arm.close()
    return windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--steps", type=int, default=32, help="steps per timed window")
    parser.add_argument("--repeats", type=int, default=9, help="timed windows per engine")
    args = parser.parse_args()
    warn_without_openblas()

    model = build_bench_model(**TINY)
    tokenizer = bench_tokenizer(TINY["vocab_size"])
    print(
        f"ms per decode step (medians of {args.repeats} interleaved windows of {args.steps} "
        f"steps), {PROMPT_LEN}-token prompts, 1 layer / hidden 64 / vocab {TINY['vocab_size']}, "
        f"float32, {mx.default_device()}"
    )
    print(
        "requests | engine    | wall / cpu        | ratio wall / cpu | "
        "host (engine thread) | device | host critical path"
    )
    for n in args.sizes:
        peer, *ours = measure(model, tokenizer, n, args.steps, args.repeats)
        print(
            f"{n:8d} | mlx-lm    | {median([t.wall for t in peer]):6.2f} / "
            f"{median([t.cpu for t in peer]):6.2f} ms |"
        )
        for name, windows in zip(("sync", "pipelined", "graph"), ours):
            # Ratios window by window (each against mlx-lm's window run beside it), then the
            # median: steadier than a ratio of medians when the load drifts.
            wall = median([t.wall / p.wall for t, p in zip(windows, peer)])
            cpu = median([t.cpu / p.cpu for t, p in zip(windows, peer)])
            critical = median(
                [t.host if name == "sync" else max(0.0, t.host - t.device) for t in windows]
            )
            print(
                f"{n:8d} | {name:9s} | {median([t.wall for t in windows]):6.2f} / "
                f"{median([t.cpu for t in windows]):6.2f} ms | x{wall:4.2f} / x{cpu:4.2f}    | "
                f"{median([t.host for t in windows]):8.2f} ms          | "
                f"{median([t.device for t in windows]):6.2f} | {critical:6.2f} ms"
            )


if __name__ == "__main__":
    main()
