"""When the engine thread dies the server says so: /health turns 503, streams in flight end with
an error event, and new requests get 503 at once instead of hanging."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from macbatch.engine import Engine
from tests.support.live_server import serving, start_engine
from tests.support.polling import wait_until


def test_engine_death_is_reported_not_hung(tiny_model_path: Path) -> None:
    crash = threading.Event()

    def crashing(engine: Engine) -> Engine:
        step = engine.step

        def maybe_crash():
            if crash.is_set():
                raise RuntimeError("simulated Metal failure")
            return step()

        engine.step = maybe_crash
        return engine

    thread = start_engine(tiny_model_path, crashing)
    try:
        with serving(thread) as server, httpx.Client(base_url=server.url, timeout=10) as client:
            assert client.get("/health").json()["status"] == "ok"
            body = {"prompt": "how are you today?", "max_tokens": 3000, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                crash.set()
                rest = [line for line in lines if line.startswith("data:")]
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2].removeprefix("data: "))["error"]
            assert error["code"] == "engine_unavailable"
            assert "simulated Metal failure" in error["message"]

            assert wait_until(lambda: not thread.alive)
            health = client.get("/health")
            assert health.status_code == 503
            assert health.json()["status"] == "unhealthy"
            assert "simulated Metal failure" in health.json()["error"]
            for path, fields in (
                ("/v1/completions", {"prompt": "hi"}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ):
                started = time.monotonic()
                response = client.post(path, json={**fields, "max_tokens": 4})
                assert response.status_code == 503
                assert response.json()["error"]["type"] == "service_unavailable"
                # at once, not after a timeout (generous: a loaded 2-core machine is slow)
                assert time.monotonic() - started < 10
            metrics = client.get("/metrics").text
            assert "macbatch_engine_up 0" in metrics
    finally:
        thread.shutdown()
