"""A real server on 127.0.0.1 (uvicorn on a background thread, a free port) over an EngineThread
running a tiny test model, plus the engine's own greedy output as the oracle. It lives here, not
in tests/server/conftest.py, because test modules across packages start servers and import these
by name, and no test imports another test module (a conftest included)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette

from macbatch.engine import Engine, EngineConfig, EngineThread, RequestOutput, SamplingParams
from macbatch.server.app import ServerOptions, create_app
from macbatch.server.listen import ConnectionLimits, bind_socket, server_config

ENGINE_CONFIG = EngineConfig(num_blocks=512, max_num_seqs=64)


def start_engine(
    model_path: Path, wrap: Callable[[Engine], Engine] = lambda engine: engine
) -> EngineThread:
    thread = EngineThread(lambda: wrap(Engine.load(str(model_path), ENGINE_CONFIG))).start()
    thread.wait_ready(timeout=120)
    return thread


@dataclass
class Served:
    url: str
    thread: EngineThread
    app: Starlette

    @property
    def api(self) -> str:
        return self.url + "/v1"


@contextmanager
def serving(
    thread: EngineThread,
    options: ServerOptions | None = None,
    limits: ConnectionLimits | None = None,
    send_buffer: int | None = None,
) -> Iterator[Served]:
    """Run ``create_app(thread)`` under uvicorn (as serve runs it) on a free loopback port until
    the block ends; ``send_buffer``: each connection's kernel send buffer in bytes (small, so a
    test fills it within a few chunks)."""
    tokenizer = thread.call(lambda engine: engine.tokenizer).result(timeout=30)
    app = create_app(thread, tokenizer, options)
    with serving_app(app, thread, limits, send_buffer) as server:
        yield server


@contextmanager
def serving_app(
    app: Starlette,
    thread: EngineThread,
    limits: ConnectionLimits | None = None,
    send_buffer: int | None = None,
) -> Iterator[Served]:
    """Run ``app`` under uvicorn on a free loopback port until the block ends."""
    sock = bind_socket("127.0.0.1", 0)
    if send_buffer is not None:  # accepted sockets inherit it from the listening one
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    server = uvicorn.Server(server_config(app, limits or ConnectionLimits(), "warning"))
    runner = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert runner.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", thread, app)
    finally:
        server.should_exit = True
        runner.join(timeout=30)
        sock.close()


def serving_real_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server over a tiny random model with the real Qwen3 tokenizer and chat template (whose
    tool-call format macbatch parses); for a module-scoped fixture to ``yield from``."""
    from tests.support.structured import QWEN3_VOCAB, save_model_with_tokenizer

    path = save_model_with_tokenizer(
        tmp_path_factory.mktemp("models") / "tiny-qwen3-tok", "qwen3", QWEN3_VOCAB
    )
    thread = start_engine(path)
    with serving(thread) as server:
        yield server
    thread.shutdown()


def engine_generate(
    thread: EngineThread, prompts: list[Any], params: SamplingParams
) -> list[RequestOutput]:
    """The oracle: the engine's own generate() for the same prompts (run while it is idle)."""
    return thread.call(lambda engine: engine.generate(prompts, params)).result(timeout=120)
