"""Benchmark (not a test): what the HTTP layer costs. The same workload runs through
``Engine.generate`` in-process and through a ``macbatch serve`` process with concurrent streaming
clients; prints tokens/s and time to first token for both.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        python -m tests.server.bench_serve --clients 64 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.tiny import save_model

SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4)
RUN_SERVE = (
    "import typer; from macbatch.server.command import serve_command; typer.run(serve_command)"
)


def prompts(count: int) -> list[str]:
    return [f"{i}: the quick brown fox jumps over the lazy dog " * 3 for i in range(count)]


def bench_engine(model: Path, texts: list[str], max_tokens: int) -> None:
    from macbatch.engine import Engine, EngineConfig, SamplingParams

    engine = Engine.load(str(model), EngineConfig(num_blocks=2048))
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.generate(texts[:2], params)  # warm up
    started = time.perf_counter()
    outs = engine.generate(texts, params)
    elapsed = time.perf_counter() - started
    ttfts = [o.metrics.time_to_first_token_s for o in outs]
    generated = sum(len(o.token_ids) for o in outs)
    print(
        f"engine.generate : {generated / elapsed:8.1f} generated tok/s, "
        f"median TTFT {statistics.median(ttfts) * 1000:7.1f} ms, {elapsed:.2f} s"
    )


async def bench_server(url: str, texts: list[str], max_tokens: int) -> None:
    async def one(client: httpx.AsyncClient, text: str) -> tuple[float, int]:
        body = {
            "prompt": text,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        sent, first, tokens = time.perf_counter(), None, 0
        async with client.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.perf_counter()
                if '"usage":{' in line:
                    tokens = int(line.split('"completion_tokens":')[1].split(",")[0])
        return (first or time.perf_counter()) - sent, tokens

    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=1000)
    ) as client:
        await one(client, texts[0])  # warm up
        started = time.perf_counter()
        results = await asyncio.gather(*(one(client, t) for t in texts))
        elapsed = time.perf_counter() - started
    generated = sum(tokens for _, tokens in results)
    print(
        f"serve, {len(texts):3d} SSE  : {generated / elapsed:8.1f} generated tok/s, "
        f"median TTFT {statistics.median(r[0] for r in results) * 1000:7.1f} ms, {elapsed:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    model = save_model(Path(tempfile.mkdtemp()) / "bench-model", **SHAPE)
    texts = prompts(args.clients)
    bench_engine(model, texts, args.max_tokens)
    port = args.port
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUN_SERVE,
            "--model",
            str(model),
            "--port",
            str(port),
            "--kv-blocks",
            "2048",
            "--log-level",
            "warning",
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        asyncio.run(bench_server(url, texts, args.max_tokens))
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
