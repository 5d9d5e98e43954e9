"""`macbatch ps` against a real serve (issue 65, item 14): `/macbatch/ps` lists each loaded
model with its memory, the requests it holds and has answered and its idle time, and the
command prints them (or the JSON) from `--url`, or says no serve answered. serve says its disk
cache's cap at start (item 10), and takes a preset as a model name, at start and in requests."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from tests.support.serve_process import start_server


@pytest.fixture(scope="module")
def served(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``macbatch serve -m tiny`` itself, a child process, ``tiny`` a preset naming the tiny
    model (item 16: serve takes a preset as a model name); its stderr checked once it stops."""
    cache, home = tmp_path_factory.mktemp("ps-cache"), tmp_path_factory.mktemp("ps-home")
    (home / "presets.yaml").write_text(f"tiny:\n  model: {tiny_model_path}\n")
    env = {"MACBATCH_HOME": str(home)}
    process, url = start_server(Path("tiny"), "--cache-dir", str(cache), env=env)
    yield url
    process.terminate()
    _, said = process.communicate(timeout=60)
    assert f"macbatch serve: disk KV cache: up to 0.25 GiB in {cache}" in said  # the start line


def _rows(url: str) -> list[dict]:
    response = httpx.get(url + "/macbatch/ps")
    assert response.status_code == 200
    return response.json()["data"]


def test_ps_lists_the_loaded_model_and_its_requests(served: str, tiny_model_path: Path) -> None:
    (before,) = _rows(served)
    name = str(tiny_model_path)
    assert before["model"] == name and before["requests"] == 0
    weights = sum(p.stat().st_size for p in tiny_model_path.glob("*.safetensors"))
    assert before["active_requests"] == 0 and before["weights_bytes"] == weights
    assert before["idle_s"] >= 0
    assert before["unloads_in_s"] is None  # the first model runs the Batch API: never unloads
    # a client may name it by the preset too
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert httpx.post(served + "/v1/chat/completions", json=body).status_code == 200
    (after,) = _rows(served)
    assert after["requests"] == 1 and after["active_requests"] == 0
    assert after["kv_cache_bytes"] > 0

    runner = CliRunner()
    shown = runner.invoke(app, ["ps", "--url", served, "--json"])
    assert shown.exit_code == 0, shown.output
    assert [(r["model"], r["requests"]) for r in json.loads(shown.stdout)] == [(name, 1)]
    header, row = runner.invoke(app, ["ps", "--url", served]).stdout.splitlines()
    assert header.split() == [
        "MODEL",
        "MEMORY",
        "KV",
        "ACTIVE",
        "REQUESTS",
        "IDLE",
        "UNLOADS",
        "IN",
    ]
    assert re.fullmatch(
        rf"{re.escape(name)}\s+[\d.,]+ MiB\s+[\d.,]+ MiB\s+0\s+1\s+\d+ s\s+never", row
    )


def test_ps_says_when_no_serve_answers() -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = CliRunner().invoke(app, ["ps", "--url", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 1 and "no serve answered" in result.stderr
