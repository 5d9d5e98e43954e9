"""Slow clients past the descriptor limit (issue 61, item 12): a server whose process may hold
256 descriptors, and more connections than it takes that never finish their headers (the header
timeout set far off, so none ends on its own): a new client is still answered, because the
oldest idle connection is shed for it; a --max-connections past the limit is held below it,
keeping a reserve of descriptors for the model and files."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.support.serve_process import start_server

NOFILE = 256
PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # headers never end


def slow_clients(url: str, count: int, stack: ExitStack) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    opened = []
    for _ in range(count):
        client = stack.enter_context(socket.create_connection((host, int(port))))
        client.sendall(PARTIAL)
        opened.append(client)
    return opened


@pytest.fixture(params=[[], ["--max-connections", "5000"]], ids=["default", "past-the-limit"])
def server(request: pytest.FixtureRequest, tiny_model_path: Path, tmp_path: Path) -> Iterator[str]:
    process, url = start_server(
        tiny_model_path,
        "--header-timeout",
        "3600",
        *request.param,
        env={"MACBATCH_HOME": str(tmp_path / "home")},
        nofile=NOFILE,
    )
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
        process.stderr.close()


def test_a_new_client_is_answered_past_the_limit(server: str) -> None:
    with ExitStack() as stack:
        slow_clients(server, NOFILE + 16, stack)
        for _ in range(3):  # each new one sheds an old idle one, again and again
            assert httpx.get(server + "/health", timeout=60).status_code == 200
