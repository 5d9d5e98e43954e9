"""API keys, body and queue limits, and error bodies for requests that never reach the engine."""

from __future__ import annotations

import httpx
import openai
import pytest

from macbatch.engine import EngineThread
from macbatch.server.app import ServerOptions
from tests.support.live_server import Served, serving
from tests.support.polling import wait_until

KEY = "sk-local-test"
ENDPOINTS = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/x", None),
    ("GET", "/metrics", None),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/completions", {"prompt": "hi"}),
    ("GET", "/no/such/route", None),
]


@pytest.fixture(scope="module")
def keyed(engine_thread: EngineThread):
    with serving(engine_thread, ServerOptions(api_key=KEY)) as server:
        yield server


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {KEY}", KEY])
def test_missing_or_wrong_key_is_401(
    keyed: Served, method: str, path: str, body: dict | None, header: str | None
) -> None:
    headers = {"Authorization": header} if header else {}
    response = httpx.request(method, keyed.url + path, json=body, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_health_needs_no_key(keyed: Served) -> None:
    response = httpx.get(keyed.url + "/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_right_key_works_everywhere(keyed: Served) -> None:
    client = openai.OpenAI(base_url=keyed.api, api_key=KEY, max_retries=0)
    model = client.models.list().data[0].id
    answer = client.completions.create(model=model, prompt="hi", max_tokens=2, temperature=0)
    assert answer.usage.completion_tokens >= 1
    metrics = httpx.get(keyed.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert metrics.status_code == 200
    assert 'macbatch_http_responses_total{route="/v1/completions",status="200"} 1' in metrics.text


def test_body_over_limit_is_413(engine_thread: EngineThread) -> None:
    with serving(engine_thread, ServerOptions(max_body_bytes=1000)) as server:
        small = httpx.post(server.api + "/completions", json={"prompt": "hi", "max_tokens": 1})
        assert small.status_code == 200
        big = httpx.post(server.api + "/completions", json={"prompt": "x" * 2000})
        assert big.status_code == 413
        assert big.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: the limit holds while reading
            yield b'{"prompt": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        chunked = httpx.post(server.api + "/completions", content=chunks())
        assert chunked.status_code == 413


def test_full_queue_is_429_with_retry_after(engine_thread: EngineThread) -> None:
    with serving(engine_thread, ServerOptions(max_pending=2)) as server:
        body = {"prompt": "hi", "max_tokens": 4000, "temperature": 0, "stream": True}
        with (
            httpx.Client(base_url=server.api, timeout=30) as client,
            client.stream("POST", "/completions", json=body) as first,
        ):
            assert first.status_code == 200
            refused = client.post("/completions", json={**body, "n": 2})
            assert refused.status_code == 429
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["type"] == "rate_limit_error"
            second = client.post("/completions", json={**body, "stream": False, "max_tokens": 2})
            assert second.status_code == 200  # one more still fits
        assert wait_until(lambda: engine_thread.stats().kv_blocks_used == 0)
        again = httpx.post(
            server.api + "/completions", json={**body, "stream": False, "n": 2, "max_tokens": 2}
        )
        assert again.status_code == 200  # the slots came back when the stream closed


def test_a_body_the_server_can_never_admit_is_a_400_not_a_429(engine_thread: EngineThread) -> None:
    """Admission limit 12, idle server: n 16 could never run, so retrying is no use."""
    with serving(engine_thread, ServerOptions(max_pending=12)) as server:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        response = httpx.post(server.api + "/chat/completions", json={**body, "n": 16})
        assert response.status_code == 400, response.text
        assert "Retry-After" not in response.headers
        error = response.json()["error"]
        assert error["param"] == "n" and "(12)" in error["message"]
        fits = httpx.post(server.api + "/chat/completions", json={**body, "n": 12}, timeout=60)
        assert fits.status_code == 200 and len(fits.json()["choices"]) == 12


@pytest.mark.parametrize(
    ("method", "path", "content", "status"),
    [
        ("POST", "/v1/completions", b"{not json", 400),
        ("POST", "/v1/completions", b"[1, 2]", 400),
        ("POST", "/v1/completions", b'{"prompt": 5}', 400),
        ("GET", "/v1/completions", None, 405),
        ("GET", "/v2/anything", None, 404),
    ],
)
def test_error_bodies(
    served: Served, method: str, path: str, content: bytes | None, status: int
) -> None:
    response = httpx.request(method, served.url + path, content=content)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["type"]
