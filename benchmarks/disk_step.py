"""What the disk tier costs the engine thread per admission step: many prompts arriving at once on
a model whose compute is negligible (as a small model on a Mac's GPU, where host time per step
decides time to first token), the tier on against off, same process.

Each round builds two engines as ``macbatch serve`` does (its defaults: an elastic pool, the
prefix cache on, 64 running requests; one with ``disk_cache_dir`` set to an empty temporary
directory, one without), queues ``--requests`` new prompts in each at once and steps until every
prompt is computed (its admission steps: each schedules prompt chunks), then a few decode steps.
The arms alternate, so that load drifting on a shared machine hits them alike. Reported per arm:
the engine thread's CPU time (``time.thread_time``: the tier's writer and reader threads and
MLX's stream thread are not in it) per admission step, and for queuing the prompts (which the
engine thread does too: ``EngineThread`` runs ``enqueue``), medians over the rounds; ratios
round by round against the other arm beside it. ``--profile`` prints, for the disk arm of the
last round, cProfile's top functions over its admission steps instead (their times are
cProfile's, inflated).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m benchmarks.disk_step [--requests 48] [--min-prompt 200] [--max-prompt 400] \\
        [--rounds 5] [--shape tiny|wide] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import tempfile
import time
from dataclasses import dataclass

from benchmarks.common import TINY_MODEL, bench_tokenizer, build_bench_model, warn_without_openblas
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams

DECODE_STEPS = 8
# ``--shape``: the tiny model, or the same with Qwen3-0.6B's attention (28 layers, 8 KV heads of
# 128): a real model's bytes per block on disk (3.5 MiB in float32), its compute still small
SHAPES = {
    "tiny": TINY_MODEL,
    "wide": dict(
        TINY_MODEL, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128,
    ),
}  # fmt: skip


@dataclass
class Arm:
    """One round of one arm: engine-thread milliseconds."""

    enqueue_ms: float  # queuing every prompt
    step_ms: list[float]  # each admission step's


def run_arm(model, tokenizer, prompts: list[list[int]], disk: str | None, profile: bool) -> Arm:
    config = EngineConfig(max_num_seqs=64, disk_cache_dir=disk)  # ``macbatch serve``'s defaults
    engine = Engine(model, tokenizer, config)
    params = SamplingParams(max_tokens=DECODE_STEPS, temperature=0, ignore_eos=True)
    requests = [engine.prepare_request(p, params, None) for p in prompts]  # on the callers' threads
    gc.collect()  # the engines of earlier rounds freed now, not inside a timed step
    start = time.thread_time()
    for request in requests:
        engine.enqueue(request)
    enqueue_ms = (time.thread_time() - start) * 1e3
    profiler = cProfile.Profile() if profile else None
    steps = []
    while any(not r.finished and r.num_computed_tokens < r.num_prompt_tokens for r in requests):
        if profiler is not None:
            profiler.enable()
        start = time.thread_time()
        engine.step()
        steps.append((time.thread_time() - start) * 1e3)
        if profiler is not None:
            profiler.disable()
    while engine.has_unfinished():
        engine.step()
    engine.close()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return Arm(enqueue_ms, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--min-prompt", type=int, default=200)
    parser.add_argument("--max-prompt", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    warn_without_openblas()
    model = build_bench_model(**SHAPES[args.shape])
    tokenizer = bench_tokenizer(TINY_MODEL["vocab_size"])
    arms: dict[str, list[Arm]] = {"off": [], "disk": []}
    for i in range(args.rounds + 1):  # round 0 warms both arms up, and is not counted
        prompts = synthetic_prompts(
            args.requests, args.min_prompt, args.max_prompt, TINY_MODEL["vocab_size"], seed=i
        )
        order = ["off", "disk"] if i % 2 else ["disk", "off"]
        for name in order:
            with tempfile.TemporaryDirectory() as directory:
                disk = directory if name == "disk" else None
                last = args.profile and i == args.rounds and name == "disk"
                arm = run_arm(model, tokenizer, prompts, disk, last)
            if i:
                arms[name].append(arm)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.shape} model, {args.requests} prompts of "
          f"{args.min_prompt}-{args.max_prompt} tokens, {args.rounds} rounds")  # fmt: skip
    for name, rounds in arms.items():
        per_step = [statistics.fmean(r.step_ms) for r in rounds]
        print(
            f"{name:5} engine thread ms per admission step {statistics.median(per_step):6.2f} "
            f"(rounds: {' '.join(f'{m:.2f}' for m in per_step)}; "
            f"{len(rounds[0].step_ms)} steps), enqueue ms "
            f"{statistics.median(r.enqueue_ms for r in rounds):6.2f}"
        )
    ratios = [
        statistics.fmean(d.step_ms) / statistics.fmean(o.step_ms)
        for d, o in zip(arms["disk"], arms["off"])
    ]
    print(f"disk / off per admission step: x{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
