"""``macbatch serve`` as a child process on a free loopback port (for tests that signal or kill
it), returned once /health answers 200."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_SERVE = (
    "import typer; from macbatch.server.command import serve_command; typer.run(serve_command)"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(
    model: Path, *args: str, env: dict[str, str] | None = None, nofile: int | None = None
) -> tuple[subprocess.Popen, str]:
    """The process and its base URL; ``env`` adds to this process's environment; ``nofile``:
    its file descriptor limit (soft and hard), so a test reaches it with few sockets."""
    port = free_port()
    limited = (  # after mlx-lm's import, which sets its own limit (2048, 4096)
        "import resource, mlx_lm.utils; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
        if nofile is not None
        else ""
    )

    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            limited + RUN_SERVE,
            "--model",
            str(model),
            "--port",
            str(port),
            *args,
            "--log-level",
            "warning",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    pytest.fail("macbatch serve did not become healthy")
