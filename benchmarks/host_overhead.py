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
(engine/parsers/text.py), and nothing reads it.

On a shared machine wall time is stretched by other processes, so CPU time is reported too (the
ratio to trust there, as in benchmarks/throughput.py). On the CPU backend MLX computes on its own
stream thread, so a step's CPU time splits into the engine thread's (host: scheduling, packing,
graph building, reading results, outputs) and the rest (device: the forward and sampling). The
host critical path is the host time the device cannot hide: all of it for synchronous steps, and
for pipelined steps, which build and dispatch step N+1 while step N runs, what is left once a
step's device time overlaps it: max(0, host - device), an estimate that assumes the overlap is
complete (MLX's CPU backend caps it: docs/engine.md). The "graph" row is the decode step's
uncompiled graph alone (forward, greedy sampling, ``mx.async_eval``, no engine around it). The
"sync" and "pipelined" rows never compile; the "compiled" row (up to 8 requests) is pipelined
with its decode forward compiled from the first step (engine/worker/compiled_step.py).

At one request the single-request path is also held against mlx-lm's ``generate_step`` (what
``mlx_lm.generate`` runs; its host is the thread calling it), host ms per step and ratio. Last,
decode tokens per second of one request on a Qwen3-0.6B-shaped float32 model, macbatch with its
default config against ``generate_step`` (``--speed-tokens 0`` skips it).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.host_overhead [--sizes 1 32 128 256] [--steps 32] [--repeats 9] \\
        [--speed-tokens 128] [--disk-cache]

(one BLAS thread: at this size BLAS threads only spin, which CPU time would count.)

``--disk-cache`` adds a "disk" row: pipelined macbatch with the prefix cache on and the disk
tier below it (each size in an empty directory), against the "pipelined" row beside it (prefix
cache off): what the tier costs a decode step, where it writes the prompts' blocks once and then
only checks, each step, that nothing waits to be copied.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from benchmarks.common import (
    QWEN3_0_6B,
    TINY_MODEL,
    bench_tokenizer,
    build_bench_model,
    warn_without_openblas,
)
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.core.packing import pack
from macbatch.engine.worker.compiled_step import MAX_BATCH

TINY = TINY_MODEL
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
    """An engine with every request prefilled and generating, stepped on demand; its decode
    steps compiled from the first (``compiled``) or never."""

    def __init__(
        self,
        model,
        tokenizer,
        prompts: list[list[int]],
        max_tokens: int,
        pipelined: bool,
        compiled: bool = False,
        disk_cache: str | None = None,
    ) -> None:
        self.n = n = len(prompts)
        blocks_per_request = -(-(PROMPT_LEN + max_tokens + 1) // 16)
        config = EngineConfig(
            num_blocks=n * blocks_per_request + 1,
            max_num_batched_tokens=max(n * PROMPT_LEN, 1024),
            max_num_seqs=n,
            enable_prefix_caching=disk_cache is not None,  # the tier sits below it
            pipelined=pipelined,
            compile_decode_after=0 if compiled else None,
            disk_cache_dir=disk_cache,
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
        compiled = self.engine.runner.compiled
        assert (
            compiled is None
            or self.engine.config.compile_decode_after is None
            or (compiled.compiled_shapes)
        ), "the compiled arm ran uncompiled"

    def close(self) -> None:
        self.engine.close()  # the disk tier's threads, when it has one


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
        heads = {s.num_kv_heads for s in engine.runner.adapter.layer_shapes}
        self.batch = pack(plan, tables, engine.config.block_size, heads)

    def step(self) -> None:
        logits = self.engine.runner.adapter.forward(self.batch, self.engine.runner.kv_stores)
        mx.async_eval(mx.argmax(logits, axis=-1), *self.engine.runner.store.arrays())

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


class GenerateArm:
    """mlx-lm's single-request ``generate_step`` (what ``mlx_lm.generate`` runs), mid-reply."""

    def __init__(self, model, prompt: list[int], max_tokens: int) -> None:
        from mlx_lm.generate import generate_step

        self.tokens = generate_step(mx.array(prompt), model, max_tokens=max_tokens)
        for _ in range(WARMUP_STEPS + 1):
            next(self.tokens)

    def step(self) -> None:
        next(self.tokens)

    def check(self) -> None:
        pass

    def close(self) -> None:
        self.tokens.close()


Arm = MacbatchArm | MlxLmArm | GraphArm | GenerateArm


def timed(arm: Arm, steps: int) -> Timing:
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


def measure(
    model, tokenizer, n: int, steps: int, repeats: int, disk_cache: str | None = None
) -> dict[str, list[Timing]]:
    """Per-step timings of ``repeats`` windows each of mlx-lm's ``BatchGenerator``,
    synchronous, pipelined and compiled macbatch, the graph alone and (at one request) mlx-lm's
    ``generate_step``, interleaved so that load drifting on a shared machine hits all of them
    alike: window i of every arm ran at about the same time. ``disk_cache``: also pipelined
    macbatch with the prefix cache and the disk tier below it, in a directory of its own under
    this one (the "disk" row)."""
    prompts = synthetic_prompts(n, PROMPT_LEN, PROMPT_LEN, TINY["vocab_size"], seed=n)
    max_tokens = WARMUP_STEPS + steps * repeats + 16
    arms: dict[str, Arm] = {
        "mlx-lm": MlxLmArm(model, prompts, max_tokens),
        "sync": MacbatchArm(model, tokenizer, prompts, max_tokens, pipelined=False),
        "pipelined": MacbatchArm(model, tokenizer, prompts, max_tokens, pipelined=True),
        "graph": GraphArm(model, tokenizer, prompts, max_tokens),
    }
    if disk_cache is not None:
        arms["disk"] = MacbatchArm(
            model, tokenizer, prompts, max_tokens, True, disk_cache=f"{disk_cache}/{n}"
        )
    if n <= MAX_BATCH:
        arms["compiled"] = MacbatchArm(model, tokenizer, prompts, max_tokens, True, True)
    if n == 1:
        arms["generate"] = GenerateArm(model, prompts[0], max_tokens)
    windows: dict[str, list[Timing]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, arm in arms.items():
            windows[name].append(timed(arm, steps))
    for arm in arms.values():
        arm.close()
    return windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--steps", type=int, default=32, help="steps per timed window")
    parser.add_argument("--repeats", type=int, default=9, help="timed windows per engine")
    parser.add_argument(
        "--speed-tokens", type=int, default=128,
        help="tokens per timed reply on the Qwen3-0.6B-shaped model (0: skip that part)",
    )  # fmt: skip
    parser.add_argument(
        "--disk-cache", action="store_true",
        help="also time pipelined macbatch with the prefix cache and the disk tier below it "
        "(the 'disk' row)",
    )  # fmt: skip
    args = parser.parse_args()
    warn_without_openblas()
    with tempfile.TemporaryDirectory() as cache:
        run(args, cache if args.disk_cache else None)


def run(args: argparse.Namespace, disk_cache: str | None) -> None:
    """Every size's rows, then the decode speed."""

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
        timings = measure(model, tokenizer, n, args.steps, args.repeats, disk_cache)
        generate = timings.pop("generate", None)
        print_rows(n, timings)
        if generate is not None:
            print_single_request(timings, generate)
    if args.speed_tokens:
        print_decode_speed(args.speed_tokens, args.repeats)


def print_rows(n: int, timings: dict[str, list[Timing]]) -> None:
    """One row per engine; ratios against mlx-lm's ``BatchGenerator``."""
    peer = timings["mlx-lm"]
    print(
        f"{n:8d} | mlx-lm    | {median([t.wall for t in peer]):6.2f} / "
        f"{median([t.cpu for t in peer]):6.2f} ms |"
    )
    for name, windows in timings.items():
        if name == "mlx-lm":
            continue
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


def print_single_request(timings: dict[str, list[Timing]], generate: list[Timing]) -> None:
    """Host ms per step at one request against mlx-lm's ``generate_step`` (its host: the
    thread that calls it), window by window."""
    print(
        f"one request, mlx-lm generate_step: host {median([t.host for t in generate]):.2f} ms, "
        f"cpu {median([t.cpu for t in generate]):.2f} ms per step"
    )
    for name in ("pipelined", "compiled"):
        windows = timings[name]
        host = median([t.host / g.host for t, g in zip(windows, generate)])
        cpu = median([t.cpu / g.cpu for t, g in zip(windows, generate)])
        print(
            f"  macbatch {name:9s}: host {median([t.host for t in windows]):.2f} ms "
            f"(x{host:.2f} of generate_step's), cpu x{cpu:.2f}"
        )


def print_decode_speed(tokens: int, repeats: int) -> None:
    """Decode tokens per second of one request on a Qwen3-0.6B-shaped float32 model: macbatch
    as configured by default (its decode compiled once a shape recurs) against mlx-lm's
    ``generate_step``, replies interleaved, ratio per pair."""
    model = build_bench_model(**QWEN3_0_6B)
    tokenizer = bench_tokenizer(QWEN3_0_6B["vocab_size"])
    prompt = synthetic_prompts(1, PROMPT_LEN, PROMPT_LEN, QWEN3_0_6B["vocab_size"], seed=0)[0]
    engine = Engine(model, tokenizer, EngineConfig(enable_prefix_caching=False))
    params = SamplingParams(max_tokens=tokens + WARMUP_STEPS, temperature=0, ignore_eos=True)
    _macbatch_reply_speed(engine, prompt, params)  # past compile_decode_after
    _generate_reply_speed(model, prompt, tokens)
    ours, theirs = [], []
    for _ in range(max(1, repeats // 3)):
        ours.append(_macbatch_reply_speed(engine, prompt, params))
        theirs.append(_generate_reply_speed(model, prompt, tokens))
    compiled = engine.runner.compiled
    print(
        f"decode tok/s at one request, Qwen3-0.6B-shaped float32 (random weights), {tokens} "
        f"tokens after {WARMUP_STEPS}: macbatch {median(ours):.1f}, mlx-lm generate_step "
        f"{median(theirs):.1f}, x{median([a / b for a, b in zip(ours, theirs)]):.2f} "
        f"(macbatch compiled shapes: {compiled.compiled_shapes if compiled else 0})"
    )


def _macbatch_reply_speed(engine: Engine, prompt: list[int], params: SamplingParams) -> float:
    """Tokens per second of one reply after its first ``WARMUP_STEPS`` tokens."""
    engine.add_request(prompt, params)
    counted, started = 0, 0.0
    while engine.has_unfinished():
        for out in engine.step():
            counted += len(out.new_token_ids)
            if counted == WARMUP_STEPS and not started:
                started = time.perf_counter()
    return (counted - WARMUP_STEPS) / (time.perf_counter() - started)


def _generate_reply_speed(model, prompt: list[int], tokens: int) -> float:
    from mlx_lm.generate import generate_step

    replies = generate_step(mx.array(prompt), model, max_tokens=tokens + WARMUP_STEPS)
    for _ in range(WARMUP_STEPS):
        next(replies)
    started = time.perf_counter()
    counted = sum(1 for _ in replies)
    return counted / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
