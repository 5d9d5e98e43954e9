"""Memory under long load (issue 61): serve thousands of requests of every kind and check that
memory after ten times the warm-up's requests stays within 10% of memory after the warm-up.

``macbatch serve``'s own pool and app (in this process, so MLX's counters are the server's),
under uvicorn on a loopback port, over the demo model and a copy of it in a ``--models-dir``,
``--max-loaded-models 1`` (every model switch unloads one and loads the other) and the disk tier
on. The requests cycle through: chat, chat streamed, a stream cancelled after its first chunks,
completions, an invalid body (400), a chat with tools, a chat with a JSON schema, embeddings, a
model card; the model switches every ``--switch-every`` requests. After each block of requests:
the process's RSS and MLX's active and cache memory. Printed: a row per sample, then the check.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.soak [--warmup 200] [--blocks 10] [--switch-every 100]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

MIB = 2**20
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
        },
    },
}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    import resource  # macOS: no /proc; the peak is the nearest there is

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def sample() -> dict[str, int]:
    import mlx.core as mx

    return {
        "rss": rss_bytes(),
        "active": int(mx.get_active_memory()),
        "cache": int(mx.get_cache_memory()),
    }


def serve(home: Path) -> tuple[str, Callable[[], None]]:
    """The serve command's pool and app over demo and demo-b; the base URL and a stop."""
    import uvicorn

    from macbatch.demo import MODEL_DIR
    from macbatch.engine import EngineConfig
    from macbatch.models.pool import PoolLimits
    from macbatch.openai import DATA_ONLY
    from macbatch.server.app import ServerOptions, create_pool_app
    from macbatch.server.listen import ConnectionLimits, bind_socket, server_config
    from macbatch.server.serve_models import model_pool

    shelf = home / "models"
    shutil.copytree(MODEL_DIR, shelf / "demo-b")
    config = EngineConfig(disk_cache_dir=str(home / "kv"), max_num_seqs=8)
    pool = model_pool(("demo",), (shelf,), PoolLimits(max_loaded=1), config, DATA_ONLY)
    app = create_pool_app(pool, ServerOptions())
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(server_config(app, ConnectionLimits(), "warning"))
    runner = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    runner.start()
    while not server.started:
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        runner.join(timeout=60)
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()

    return f"http://127.0.0.1:{sock.getsockname()[1]}", stop


def kinds(client: httpx.Client, url: str) -> list[Callable[[str, int], object]]:
    """One function per kind of request: (model, index) -> None."""

    def chat(model: str, i: int, **more: object) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": f"what is {i}+1?"}]}
        client.post(url + "/v1/chat/completions", json={**body, "max_tokens": 12, **more})

    def streamed(model: str, i: int, cancel: bool = False) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"count to {i % 50}"}],
            "max_tokens": 24,
            "stream": True,
        }
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            for n, _ in enumerate(response.iter_lines()):
                if cancel and n == 2:
                    break  # the connection closes mid-stream: the request is cancelled

    return [
        chat,
        streamed,
        lambda m, i: streamed(m, i, cancel=True),
        lambda m, i: client.post(
            url + "/v1/completions", json={"model": m, "prompt": f"{i} apples", "max_tokens": 8}
        ),
        lambda m, i: client.post(url + "/v1/chat/completions", content=b'{"model": "x", '),
        lambda m, i: chat(m, i, tools=TOOLS),
        lambda m, i: chat(m, i, response_format=SCHEMA),
        lambda m, i: client.post(url + "/v1/embeddings", json={"model": m, "input": f"t {i}"}),
        lambda m, i: client.get(url + f"/v1/models/{m}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=200, help="requests before the baseline")
    parser.add_argument("--blocks", type=int, default=10, help="blocks of --warmup requests after")
    parser.add_argument("--switch-every", type=int, default=100, help="requests per model turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url, stop = serve(Path(tmp))
        try:
            with httpx.Client(timeout=120) as client:
                order = itertools.cycle(kinds(client, url))
                models = itertools.cycle(["demo", "demo-b"])
                model, done, rows = next(models), 0, []
                started = time.monotonic()
                for _ in range(args.blocks + 1):
                    for _request in range(args.warmup):
                        if done and done % args.switch_every == 0:
                            model = next(models)
                        next(order)(model, done)
                        done += 1
                    rows.append((done, time.monotonic() - started, sample()))
                    print(_row(*rows[-1]), flush=True)
        finally:
            stop()
    _check(rows)


def _row(done: int, seconds: float, memory: dict[str, int]) -> str:
    return (
        f"| {done:,} | {seconds:,.0f} | {memory['rss'] / MIB:,.1f} | "
        f"{memory['active'] / MIB:,.1f} | {memory['cache'] / MIB:,.1f} |"
    )


def _check(rows: list[tuple[int, float, dict[str, int]]]) -> None:
    """Memory at the end against memory after the warm-up (the first row): within 10%."""
    base, last = rows[0][2], rows[-1][2]
    for name in ("rss", "active"):
        growth = last[name] / base[name] - 1 if base[name] else 0.0
        verdict = "ok" if growth <= 0.10 else "GROWS"
        before, after = base[name] / MIB, last[name] / MIB
        print(f"{name}: {before:,.1f} -> {after:,.1f} MiB ({growth:+.1%}) {verdict}")


if __name__ == "__main__":
    main()
