"""The first constrained request makes llguidance build its tokenizer index (1-3 s for a real
vocabulary): serve does that on a worker thread, so its event loop keeps answering meanwhile."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import macbatch.engine.structured_output.constraints as constraints
from tests.support.live_server import serving, start_engine
from tests.support.tiny import save_model


def test_health_answers_while_the_first_constrained_request_builds_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = constraints._ll_tokenizer
    building, health_answered = threading.Event(), threading.Event()

    def slow_build(*args):  # holds the build open until /health has answered (or 20 s pass)
        building.set()
        health_answered.wait(timeout=20)
        return build(*args)

    monkeypatch.setattr(constraints, "_ll_tokenizer", slow_build)
    thread = start_engine(save_model(tmp_path / "tiny"))
    body = {
        "messages": [{"role": "user", "content": "JSON please"}],
        "max_tokens": 8,
        "response_format": {"type": "json_object"},
    }
    try:
        with serving(thread) as served, ThreadPoolExecutor(1) as pool:
            pending = pool.submit(
                httpx.post, served.api + "/chat/completions", json=body, timeout=60
            )
            try:
                assert building.wait(timeout=30)
                health = httpx.get(served.url + "/health", timeout=5)  # times out if blocked
                assert health.status_code == 200
            finally:
                health_answered.set()
            reply = pending.result(timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        thread.shutdown()
