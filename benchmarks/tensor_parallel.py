"""Step time on 1 vs 2 ranks (ring backend over loopback), and the collective traffic per step.

The same random Qwen3-shaped float32 model (benchmarks/common.py: 8 layers, hidden 512, 8/4
heads), 16 requests of 256 prompt tokens and 32 new tokens each, a 1024-token step budget. One
rank runs in this process; two ranks run under `mlx.launch -n 2 --backend ring` on 127.0.0.1 (the
script starts itself there). For each, the median wall and rank-0 CPU time of prefill steps (1024
tokens) and of decode steps (16 tokens). The collectives of one step of each kind are counted on
rank 0 by wrapping ``mx.distributed.all_sum`` while the step's graph is built: calls and bytes
per step, split into the plan broadcast and the model's own all_sums (two per layer). A loopback
round trip of one all_sum is timed too, as the latency floor of a collective here.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.tensor_parallel
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import mlx.core as mx

from benchmarks.common import BENCH_MODEL, bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams

CONFIG = EngineConfig(num_blocks=1024, block_size=16, max_num_batched_tokens=1024)
REQUESTS, PROMPT, NEW = 16, 256, 32


class CollectiveCounter:
    """Counts the all_sums a step builds (calls and payload bytes, by dtype)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self._original = mx.distributed.all_sum

    def __enter__(self) -> CollectiveCounter:
        def counting(x, *args, **kwargs):
            kind = "plan broadcast" if x.dtype == mx.int32 else "model all_sum"
            self.calls[kind] += 1
            self.bytes[kind] += x.nbytes
            return self._original(x, *args, **kwargs)

        mx.distributed.all_sum = counting
        return self

    def __exit__(self, *exc: object) -> None:
        mx.distributed.all_sum = self._original


def measure(engine: Engine) -> dict:
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    for prompt in synthetic_prompts(REQUESTS, PROMPT, PROMPT, BENCH_MODEL["vocab_size"], seed=1):
        engine.add_request(prompt, params)
    times: dict[str, list[tuple[float, float]]] = {"prefill": [], "decode": []}
    traffic: dict[str, dict] = {}
    while engine.has_unfinished():
        counter = CollectiveCounter()
        start = (time.perf_counter(), time.process_time())
        with counter:
            engine.step()
        elapsed = (time.perf_counter() - start[0], time.process_time() - start[1])
        tokens = engine.stats().tokens_last_step
        kind = "decode" if tokens == REQUESTS else "prefill" if tokens == 1024 else None
        if kind:
            times[kind].append(elapsed)
            traffic.setdefault(
                kind, {"tokens": tokens, "calls": dict(counter.calls), "bytes": dict(counter.bytes)}
            )
    result: dict = {
        k: [statistics.median(t[clock] for t in (v[1:] or v)) for clock in (0, 1)]
        for k, v in times.items()
    }
    result["traffic"] = traffic
    return result


def all_sum_round_trip(group) -> float:
    """Seconds per all_sum of one token's hidden state (every rank runs this together)."""
    one = mx.zeros((1, BENCH_MODEL["hidden_size"]), mx.float32)
    mx.eval(mx.distributed.all_sum(one, group=group))
    start = time.perf_counter()
    for _ in range(200):
        mx.eval(mx.distributed.all_sum(one, group=group))
    return (time.perf_counter() - start) / 200


def build_engine(group) -> Engine:
    return Engine(build_bench_model(), bench_tokenizer(), CONFIG, model_name="bench", group=group)


def child(out: Path) -> None:
    """One rank under mlx.launch: rank 0 measures, the others follow its steps."""
    from macbatch.engine.distributed.channel import channel_of
    from macbatch.engine.distributed.follower import run_steps
    from macbatch.engine.distributed.group import join

    group = join()
    round_trip = all_sum_round_trip(group)
    engine = build_engine(group)
    if group.rank() == 0:
        out.write_text(json.dumps(dict(measure(engine), all_sum_round_trip_s=round_trip)))
        channel_of(group).send_stop()
    else:
        run_steps(engine.runner, channel_of(group))


def two_ranks() -> dict:
    launcher = Path(sys.executable).with_name("mlx.launch")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "two.json"
        command = [str(launcher), "-n", "2", "--backend", "ring", "--starting-port", "42323"]
        command += ["--", sys.executable, "-m", "benchmarks.tensor_parallel", "--child", str(out)]
        subprocess.run(command, check=True, timeout=900, env=dict(os.environ))
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    warn_without_openblas()
    one = measure(build_engine(None))
    two = two_ranks()
    layers = BENCH_MODEL["num_hidden_layers"]
    for kind in ("prefill", "decode"):
        tokens = two["traffic"][kind]["tokens"]
        for clock, name in enumerate(("wall", "rank 0 CPU")):
            a, b = one[kind][clock], two[kind][clock]
            print(
                f"{kind} step ({tokens} tokens), {name}: 1 rank {a * 1000:.1f} ms, 2 ranks "
                f"{b * 1000:.1f} ms, ratio {b / a:.2f}"
            )
        calls, sizes = two["traffic"][kind]["calls"], two["traffic"][kind]["bytes"]
        for what in sorted(calls):
            print(
                f"  {what}: {calls[what]} calls, {sizes[what]:,} bytes per step"
                + (
                    f" ({calls[what] / layers:g} calls, {sizes[what] / layers:,.0f} bytes per "
                    "layer)"
                    if what == "model all_sum"
                    else ""
                )
            )
    print(
        f"one all_sum of 1x{BENCH_MODEL['hidden_size']} float32 over loopback: "
        f"{two['all_sum_round_trip_s'] * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
