"""Two models served at once on one device (issue 49): what sharing costs, and how fair it is.

Two copies of the benchmarks' random model (seeds 0 and 1, saved in the Hugging Face layout)
each run on their own engine thread, started by ``macbatch serve``'s own starter, their MLX work
in turns of the device (``server/device.py``). The same workload (``--requests`` prompts of 64
tokens, ``--max-tokens`` new tokens each, greedy, EOS ignored) runs on model A alone, then on A
and B at the same time. Printed: output tokens per second alone and together (the ratio: what
the second model's work adds to the device's total), each model's share of its tokens done when
the first of the two finished (fairness: 100% / 100% is perfect interleaving), and how often a
turn went to the other engine when it was waiting.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.many_models [--requests 8] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import build_bench_model, warn_without_openblas
from benchmarks.peer_server import save_model
from macbatch.engine import EngineConfig, EngineThread, RequestOutput, SamplingParams, Turns
from macbatch.models.catalog import starter
from macbatch.models.pool import Servable

Snapshots = list[tuple[str, dict[str, int]]]


def run(
    threads: dict[str, EngineThread], requests: int, max_tokens: int
) -> tuple[Snapshots, float]:
    """Submit the workload to every engine at once; returns every engine's token count at each
    moment one engine finished (in finishing order), and the wall time."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    counts = {name: 0 for name in threads}
    unfinished = {name: requests for name in threads}
    snapshots: Snapshots = []
    done = threading.Event()
    lock = threading.Lock()

    def listener(name: str):
        def on_output(out: RequestOutput) -> None:
            with lock:
                counts[name] += len(out.new_token_ids)
                if out.finished:
                    unfinished[name] -= 1
                    if unfinished[name] == 0:
                        snapshots.append((name, dict(counts)))
                        if all(left == 0 for left in unfinished.values()):
                            done.set()

        return on_output

    start = time.perf_counter()
    for i in range(requests):
        prompt = " ".join(f"w{(i * 97 + j) % 31000 + 1}" for j in range(64))
        for name, thread in threads.items():
            thread.submit(prompt, params, listener(name))
    done.wait()
    return snapshots, time.perf_counter() - start


def save(directory: Path, seed: int) -> Path:
    """The benchmarks' random model with its own weights, in the Hugging Face layout."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    save_model(directory)
    weights = dict(tree_flatten(build_bench_model(seed).parameters()))
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--compile-after",
        type=int,
        default=64,
        help="EngineConfig.compile_decode_after (-1: never)",
    )
    args = parser.parse_args()
    warn_without_openblas()
    workdir = Path(tempfile.mkdtemp(prefix="many-models-"))
    turns = Turns(keep_log=True)
    config = EngineConfig(
        max_num_seqs=args.requests,
        compile_decode_after=None if args.compile_after < 0 else args.compile_after,
    )
    start = starter(config, turns)
    threads = {}
    for name, seed in (("A", 0), ("B", 1)):
        path = save(workdir / name, seed)
        threads[name] = start(Servable(name, str(path), path))
        threads[name].wait_ready()
    total = args.requests * args.max_tokens
    _, alone_s = run({"A": threads["A"]}, args.requests, args.max_tokens)
    assert turns.log is not None
    turns.log.clear()
    snapshots, both_s = run(threads, args.requests, args.max_tokens)
    alone_rate, both_rate = total / alone_s, 2 * total / both_s
    first, at_first = snapshots[0]
    waited = [i for i, (_, waiting) in enumerate(turns.log[:-1]) if waiting]
    handed = sum(turns.log[i + 1][0] != turns.log[i][0] for i in waited)
    print(f"workload: {args.requests} requests x {args.max_tokens} new tokens per model")
    print(f"A alone:      {alone_rate:8.1f} output tok/s")
    print(f"A and B:      {both_rate:8.1f} output tok/s together ({both_rate / alone_rate:.2f}x)")
    shares = ", ".join(f"{n} {at_first[n] / total:.0%}" for n in sorted(at_first))
    print(f"when {first} finished: {shares} of each model's tokens done")
    print(f"turns handed to a waiting engine: {handed} of {len(waited)}")
    for thread in threads.values():
        thread.shutdown()


if __name__ == "__main__":
    main()
