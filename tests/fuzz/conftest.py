"""The app under fuzzing: the real Starlette app over an EngineThread on the tiny model, driven
in-process by Starlette's TestClient (no sockets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from macbatch.engine import Engine, EngineConfig, EngineThread
from macbatch.server.app import ServerOptions, create_app


@pytest.fixture(scope="package")
def fuzz_app(tiny_model_path: Path) -> Iterator[Starlette]:
    config = EngineConfig(num_blocks=256, max_num_seqs=16)
    thread = EngineThread(lambda: Engine.load(str(tiny_model_path), config)).start()
    thread.wait_ready(timeout=120)
    tokenizer = thread.call(lambda engine: engine.tokenizer).result(timeout=30)
    yield create_app(thread, tokenizer, ServerOptions(max_pending=64))
    thread.shutdown()


@pytest.fixture(scope="package")
def fuzz_client(fuzz_app: Starlette) -> Iterator[TestClient]:
    # 127.0.0.1: the server refuses a Host it does not answer to, as TestClient's "testserver"
    with TestClient(fuzz_app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        yield client
