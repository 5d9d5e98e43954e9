"""macbatch serve against vllm-mlx serve, a real peer server, on the same machine in one run.

Both servers load the same model directory (the benchmarks' random Qwen3-shaped float32 model,
8 layers, hidden 512, saved in the Hugging Face layout with a word-level tokenizer over its whole
vocabulary, so a prompt of N words is N tokens on both) and get the same workload over HTTP with
the ``openai`` client: the throughput workload (32 requests, prompts of 32 to 512 tokens, 64
new tokens each at temperature 0, all sent at once, streamed). The servers run one at a time and
alternate over the repeats; each gets one warm-up request first. Printed: output tokens per
second, time to first token (median and p90), each server's CPU seconds (its process tree's),
the ratios, and whether the two servers' greedy texts agree.

vllm-mlx is never a dependency of macbatch: install it into its own venv and pass its command,
e.g. ``python -m venv /tmp/vmx && /tmp/vmx/bin/pip install vllm-mlx 'mlx[cpu]'`` (on Linux its
``mlx`` needs the ``cpu`` extra), then

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.peer_server --peer /tmp/vmx/bin/vllm-mlx [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import BENCH_MODEL, bench_tokenizer, build_bench_model
from macbatch.bench import synthetic_prompts


@dataclass
class Served:
    """One server's run of the workload."""

    tokens: int
    seconds: float
    ttft: list[float]
    cpu_seconds: float
    texts: list[str]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def save_model(directory: Path) -> Path:
    """The benchmarks' random model and word-level tokenizer in the Hugging Face layout."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    directory.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(build_bench_model().parameters()))
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    (directory / "config.json").write_text(json.dumps(BENCH_MODEL))
    bench_tokenizer()._tokenizer.save_pretrained(str(directory))
    return directory


def start(command: list[str], port: int, log: Path) -> subprocess.Popen:
    """A server process, once its /v1/models answers."""
    process = subprocess.Popen(
        command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return process
        except OSError:
            time.sleep(1)
    process.kill()
    raise RuntimeError(f"{command[0]} did not answer within 600 s; see {log}")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants so far (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pending += [int(c) for c in children]
    return total


async def one_request(client, model: str, prompt: str, max_tokens: int) -> tuple[float, str]:
    """Time to first token and the text of one streamed greedy completion."""
    sent = time.perf_counter()
    first = None
    parts = []
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter() - sent
            parts.append(chunk.choices[0].text)
    return first or float("nan"), "".join(parts)


async def workload(port: int, model: str, prompts: list[str], max_tokens: int) -> Served:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=3600)
    await one_request(client, model, prompts[0], 4)  # warm-up
    started = time.perf_counter()
    done = await asyncio.gather(*(one_request(client, model, p, max_tokens) for p in prompts))
    seconds = time.perf_counter() - started
    texts = [text for _, text in done]
    tokens = sum(len(text.split()) for text in texts)
    await client.close()
    return Served(tokens, seconds, [t for t, _ in done], 0.0, texts)


def serve_once(command: list[str], port: int, model: str, prompts, max_tokens, log) -> Served:
    process = start(command, port, log)
    try:
        before = tree_cpu_seconds(process.pid)
        result = asyncio.run(workload(port, model, prompts, max_tokens))
        result.cpu_seconds = tree_cpu_seconds(process.pid) - before
        return result
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", required=True, help="the vllm-mlx command (its own venv's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=8311)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="peer-server-"))
    model = str(save_model(workdir / "model"))
    ids = synthetic_prompts(args.requests, 32, 512, BENCH_MODEL["vocab_size"], seed=0)
    prompts = [" ".join(f"w{i}" for i in p) for p in ids]
    macbatch = shutil.which("macbatch") or "macbatch"
    commands = {
        "macbatch": [macbatch, "serve", "--model", model, "--port", str(args.port)],
        "vllm-mlx": [args.peer, "serve", model, "--port", str(args.port), "--continuous-batching"],
    }
    runs: dict[str, list[Served]] = {name: [] for name in commands}
    for repeat in range(args.repeats):
        for name, command in commands.items():
            log = workdir / f"{name}-{repeat}.log"
            runs[name].append(serve_once(command, args.port, model, prompts, args.max_tokens, log))
            last = runs[name][-1]
            print(
                f"{name:9s} run {repeat + 1}: {last.tokens_per_s:7.1f} tok/s, "
                f"TTFT median {statistics.median(last.ttft):.2f} s, "
                f"CPU {last.cpu_seconds:.1f} s",
                flush=True,
            )
    best = {name: max(r, key=lambda s: s.tokens_per_s) for name, r in runs.items()}
    ours, peer = best["macbatch"], best["vllm-mlx"]
    same = sum(a == b for a, b in zip(ours.texts, peer.texts))
    print(f"\nbest of {args.repeats}, {args.requests} requests x {args.max_tokens} tokens:")
    for name, served in best.items():
        ttft = sorted(served.ttft)
        p90 = ttft[int(0.9 * (len(ttft) - 1))]
        print(
            f"  {name:9s} {served.tokens_per_s:7.1f} tok/s  TTFT median "
            f"{statistics.median(ttft):.2f} s, p90 {p90:.2f} s  CPU {served.cpu_seconds:.1f} s"
        )
    print(f"  throughput ratio macbatch / vllm-mlx: x{ours.tokens_per_s / peer.tokens_per_s:.2f}")
    print(f"  CPU-seconds ratio vllm-mlx / macbatch: x{peer.cpu_seconds / ours.cpu_seconds:.2f}")
    print(
        f"  median TTFT ratio vllm-mlx / macbatch: "
        f"x{statistics.median(peer.ttft) / statistics.median(ours.ttft):.2f}"
    )
    print(f"  greedy texts equal: {same} of {len(prompts)}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
