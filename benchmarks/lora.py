"""Benchmark: requests over several LoRA adapters in one engine's packed steps, against the same
requests on the base model alone (same engine, same run), and against mlx-lm serving the
adapters one after another (its ``batch_generate`` over a model with each adapter loaded: its
only way to serve several).

Random weights (the benchmarks' Qwen3 shape), adapters of rank ``--rank`` on every attention and
MLP projection made by mlx-lm's own tuner, random prompts, greedy, EOS ignored. Load time is
left out of every number. Each rate is also given per second of this process's CPU time (every
thread's): on a machine shared with other work, what the wall clock mostly measures is the
others' load, while the CPU seconds are this work's own.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python benchmarks/lora.py [--requests 32] [--adapters 4] [--rank 16] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.common import (  # noqa: E402
    bench_tokenizer,
    build_bench_model,
    warn_without_openblas,
)
from tests.support.lora import ATTENTION, MLP, save_adapter  # noqa: E402


class Rate(NamedTuple):
    """Output tokens per second of wall clock and per second of this process's CPU time."""

    wall: float
    cpu: float

    def best(self, other: Rate) -> Rate:
        return Rate(max(self.wall, other.wall), max(self.cpu, other.cpu))


def seconds(work: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and CPU seconds ``work`` took."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def engine_rate(engine, prompts, names, max_tokens: int) -> Rate:
    """The rate of ``prompts``, request i under adapter ``names[i]``."""
    from macbatch.engine import PromptInput, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    inputs = [PromptInput(p, adapter=n) for p, n in zip(prompts, names)]
    wall, cpu = seconds(lambda: engine.generate(inputs, params))
    tokens = len(prompts) * max_tokens  # EOS ignored: every request gives max_tokens
    return Rate(tokens / wall, tokens / cpu)


def mlx_lm_rate(adapters: list[Path], prompts, names, max_tokens: int, layers: int) -> Rate:
    """mlx-lm: each adapter's requests in one ``batch_generate``, the adapters in turn."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.tuner.utils import load_adapters

    tokenizer = bench_tokenizer()
    wall = cpu = 0.0
    for index, path in enumerate(adapters):
        model = load_adapters(build_bench_model(num_hidden_layers=layers), str(path))
        mine = [p for p, n in zip(prompts, names) if n == f"a{index}"]
        took = seconds(partial(batch_generate, model, tokenizer, mine, max_tokens=max_tokens))
        wall, cpu = wall + took[0], cpu + took[1]
    tokens = len(prompts) * max_tokens  # the random tokenizer has no EOS
    return Rate(tokens / wall, tokens / cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    warn_without_openblas()
    from macbatch.engine import Engine, EngineConfig

    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 32000, args.prompt).tolist() for _ in range(args.requests)]
    names = [f"a{i % args.adapters}" for i in range(args.requests)]
    with tempfile.TemporaryDirectory() as work:
        paths = [
            save_adapter(
                Path(work) / f"a{i}",
                seed=i + 1,
                keys=ATTENTION + MLP,
                rank=args.rank,
                num_layers=args.layers,
                model=build_bench_model(num_hidden_layers=args.layers),
            )
            for i in range(args.adapters)
        ]
        config = EngineConfig(
            adapters=tuple((f"a{i}", str(p)) for i, p in enumerate(paths)),
            max_num_seqs=args.requests,
            enable_prefix_caching=False,
        )
        model = build_bench_model(num_hidden_layers=args.layers)
        engine = Engine(model, bench_tokenizer(), config)
        engine_rate(engine, prompts[:4], names[:4], 4)  # warm up: kernels built
        adapted = base = Rate(0.0, 0.0)
        for _ in range(args.repeats):  # interleaved, the best of each: a shared machine's load
            adapted = adapted.best(engine_rate(engine, prompts, names, args.max_tokens))
            alone = engine_rate(engine, prompts, [None] * len(prompts), args.max_tokens)
            base = base.best(alone)
        mlx_lm = mlx_lm_rate(paths, prompts, names, args.max_tokens, args.layers)
    print(
        f"{args.requests} requests x {args.max_tokens} tokens, {args.adapters} adapters of "
        f"rank {args.rank} on q/k/v/o/gate/up/down, {args.layers} layers; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("                                         tok/s  tok per CPU-second")
    for label, rate in (
        ("macbatch, adapters mixed in each step", adapted),
        ("macbatch, base model alone", base),
        ("mlx-lm, one adapter after another", mlx_lm),
    ):
        print(f"{label:38} {rate.wall:8.1f} {rate.cpu:10.1f}")
    for unit, ours, theirs, alone in (
        ("wall", adapted.wall, mlx_lm.wall, base.wall),
        ("CPU", adapted.cpu, mlx_lm.cpu, base.cpu),
    ):
        print(
            f"{unit}: adapters / base x{ours / alone:.2f}; macbatch / mlx-lm x{ours / theirs:.2f}"
        )


if __name__ == "__main__":
    main()
