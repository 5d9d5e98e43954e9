"""Resident memory of one short chat on a Qwen3-0.6B-shaped float32 model, as `macbatch chat`
runs it (an `EngineThread` with the default `EngineConfig`): the issue's scenario for the
elastic KV pool (docs/engine.md, "Elastic pool").

Prints the process's resident memory (RSS, from /proc) after the random weights are built (the
baseline: Python, MLX, the weights), after the engine loads, after the chat, and its peak, with
the KV pool's bytes now, in use, and at its cap (what a pool sized once at load reserved). With
``--fixed`` the pool is pinned at its cap (``num_blocks``), as before the elastic pool: that
takes about half the machine's memory.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.chat_memory [--fixed]
"""

from __future__ import annotations

import argparse
import re
import threading
from pathlib import Path

from mlx.utils import tree_flatten

from benchmarks.common import (
    QWEN3_0_6B,
    bench_tokenizer,
    build_bench_model,
    warn_without_openblas,
)
from macbatch.engine import Engine, EngineConfig, EngineThread, RequestOutput, SamplingParams
from macbatch.engine.worker.model_runner import blocks_for_memory

GIB = 2**30


def _status(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM), in bytes."""
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert match, field
    return int(match[1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="pin the pool at its cap")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    warn_without_openblas()

    model = build_bench_model(**QWEN3_0_6B)
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    baseline = _status("VmRSS")
    print(f"weights            {weights / GIB:6.2f} GiB")
    print(f"RSS with weights   {baseline / GIB:6.2f} GiB  (the baseline)")

    config = EngineConfig()
    runner_config = config
    if args.fixed:
        shape = QWEN3_0_6B  # K and V of every layer, float32
        per_token = shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * 128 * 4
        cap = blocks_for_memory(model, per_token * config.block_size, 40960, config)
        runner_config = EngineConfig(num_blocks=cap)
    tokenizer = bench_tokenizer(QWEN3_0_6B["vocab_size"])
    thread = EngineThread(lambda: Engine(model, tokenizer, runner_config)).start()
    thread.wait_ready()
    loaded = _status("VmRSS")
    print(f"RSS after load     {loaded / GIB:6.2f} GiB  (+{(loaded - baseline) / GIB:.2f})")

    # One short chat turn: a question of about 40 tokens, a reply of --max-tokens.
    prompt = " ".join(f"w{100 + 7 * i}" for i in range(40))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    finished = threading.Event()
    replies = []

    def on_output(out: RequestOutput) -> None:
        if out.finished:
            replies.append(out)
            finished.set()

    thread.submit(prompt, params, on_output)
    finished.wait()
    reply = replies[0]
    after = _status("VmRSS")
    stats = thread.call(lambda engine: engine.stats()).result()
    per_block = thread.call(lambda engine: engine.runner.store.bytes_per_block).result()
    print(f"RSS after the chat {after / GIB:6.2f} GiB  (+{(after - baseline) / GIB:.2f})")
    print(f"peak RSS           {_status('VmHWM') / GIB:6.2f} GiB")
    print(
        f"KV pool            {stats.kv_cache_bytes / GIB:6.2f} GiB now, "
        f"{stats.kv_bytes_used / 2**20:.1f} MiB used ({len(reply.token_ids)} tokens generated), "
        f"cap {stats.kv_blocks_cap * per_block / GIB:.2f} GiB"
    )
    thread.shutdown()


if __name__ == "__main__":
    main()
