"""The server tests' shared fixtures: one engine thread over the tiny test model, and one real
server over it, for the whole package. The helpers they and the tests use (starting a server,
the engine's own greedy output as the oracle) are in tests/support/live_server.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from macbatch.engine import EngineThread
from tests.support.live_server import Served, serving, start_engine


@pytest.fixture(scope="package")
def engine_thread(tiny_model_path: Path) -> Iterator[EngineThread]:
    thread = start_engine(tiny_model_path)
    yield thread
    thread.shutdown()


@pytest.fixture(scope="package")
def served(engine_thread: EngineThread) -> Iterator[Served]:
    with serving(engine_thread) as server:
        yield server
