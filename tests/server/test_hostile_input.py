"""Hostile and careless request bodies (issue 32): none takes the server down, wedges it, leaks an
admission slot or stalls other clients; every answer is counted in /metrics."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from macbatch.engine import EngineThread
from macbatch.openai.bodies import MAX_NESTING
from macbatch.openai.options import MAX_GRAMMAR_RULES, MAX_SCHEMA_DEPTH
from macbatch.server.app import ServerOptions
from tests.support.hostile import ref_chain_schema, rule_chain_grammar
from tests.support.live_server import Served, serving
from tests.support.metrics_scrape import scrape
from tests.support.polling import wait_until

SURROGATE_BODY = b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}], "max_tokens": 2}'


def test_lone_surrogates_are_400s_and_leak_no_slot(engine_thread: EngineThread) -> None:
    """serve --max-num-seqs 2 --max-queue 1: three such requests, then a normal one."""
    with serving(engine_thread, ServerOptions(max_pending=3)) as server:
        for _ in range(3):
            response = httpx.post(server.api + "/chat/completions", content=SURROGATE_BODY)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "messages[0].content"
            assert "lone UTF-16 surrogate" in error["message"]
        normal = httpx.post(
            server.api + "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert normal.status_code == 200, normal.text
        samples = scrape(server)
        assert samples["macbatch_requests_pending"] == 0
        assert (
            samples['macbatch_http_responses_total{route="/v1/chat/completions",status="400"}'] == 3
        )


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 5_000, 100_000])
def test_deeply_nested_bodies_are_400s_and_counted(served: Served, depth: int) -> None:
    before = scrape(served).get(
        'macbatch_http_responses_total{route="/v1/completions",status="400"}', 0
    )
    body = '{"prompt": "hi", "user": ' + "[" * depth + "]" * depth + "}"
    response = httpx.post(served.api + "/completions", content=body)
    assert response.status_code == 400, response.text
    assert f"more than {MAX_NESTING}" in response.json()["error"]["message"]
    after = scrape(served)['macbatch_http_responses_total{route="/v1/completions",status="400"}']
    assert after == before + 1
    assert httpx.get(served.url + "/health").status_code == 200


def test_internal_errors_are_counted(engine_thread: EngineThread, monkeypatch) -> None:
    import macbatch.server.app as app_module

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(app_module, "parse_body", broken)
    with serving(engine_thread) as server:
        response = httpx.post(server.api + "/completions", json={"prompt": "hi"})
        assert response.status_code == 500
        assert response.json()["error"]["message"] == "internal error: RuntimeError: a bug"
        samples = scrape(server)
        assert samples['macbatch_http_responses_total{route="/v1/completions",status="500"}'] == 1
        assert samples["macbatch_requests_pending"] == 0


def test_a_huge_prompt_does_not_stall_other_streams(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3.9 MB prompt (under the 4 MB body limit) is templated and tokenized off the event
    loop. Its tokenizing is held until a stream running meanwhile has sent three more chunks and
    /health has answered: on the event loop it would hold both up and the wait would run out.
    Bound by the order of work, not by time, so a loaded machine cannot fail it."""
    arrivals: list[float] = []
    stream_body = {
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 100_000,  # capped to the room left; ignore_eos keeps it going
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    stop = threading.Event()

    def stream() -> None:
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", served.api + "/chat/completions", json=stream_body) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.monotonic())
                if stop.is_set():
                    break

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert wait_until(lambda: len(arrivals) >= 5, timeout=60)
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 70_000
    big = json.dumps({"messages": [{"role": "user", "content": words[:3_900_000]}]})
    assert 3_800_000 < len(big) < 4 * 1024 * 1024
    prepare = served.thread.prepare
    served_meanwhile: list[bool] = []

    def held_prepare(*args, **kwargs):
        if len(str(args[0])) > 1_000_000:  # the huge prompt, not the stream's
            seen = len(arrivals)
            health = httpx.get(served.url + "/health", timeout=60)
            more = wait_until(lambda: len(arrivals) >= seen + 3, timeout=60)
            served_meanwhile.append(health.status_code == 200 and more)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(served.thread, "prepare", held_prepare)
    response = httpx.post(served.api + "/chat/completions", content=big, timeout=180)
    stop.set()
    streamer.join()
    assert response.status_code == 400  # far past the context: refused after tokenizing
    assert "tokens" in response.json()["error"]["message"]
    assert served_meanwhile == [True]
    assert scrape(served)["macbatch_requests_pending"] == 0


def test_schemas_and_grammars_that_crashed_llguidance_are_400s(served: Served) -> None:
    """A $ref chain 1,000 definitions deep and a grammar of 3,000 chained rules killed the
    process (SIGSEGV in llguidance); now each is a 400 saying the bound, and the server
    serves the next request."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "deep", "schema": ref_chain_schema(1000)},
    }
    deep = httpx.post(served.api + "/chat/completions", json={**chat, "response_format": schema})
    assert deep.status_code == 400, deep.text
    error = deep.json()["error"]
    assert error["param"] == "response_format"
    assert f"nests more than {MAX_SCHEMA_DEPTH} levels deep" in error["message"]
    rules = httpx.post(
        served.api + "/completions",
        json={"prompt": "hi", "max_tokens": 4, "guided_grammar": rule_chain_grammar(3000)},
    )
    assert rules.status_code == 400, rules.text
    assert rules.json()["error"]["param"] == "guided_grammar"
    assert f"at most {MAX_GRAMMAR_RULES:,}" in rules.json()["error"]["message"]
    normal = httpx.post(served.api + "/chat/completions", json=chat)
    assert normal.status_code == 200
    assert scrape(served)["macbatch_requests_pending"] == 0


def test_a_bad_regex_is_said_in_a_line_not_a_dump(served: Served) -> None:
    regex = "[a-z]+ " * 15_000 + "("  # 105 KB, one group left open
    response = httpx.post(
        served.api + "/completions", json={"prompt": "hi", "max_tokens": 4, "guided_regex": regex}
    )
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "unclosed group" in message and len(message) < 600, len(message)


def test_messages_sent_to_completions_are_named(served: Served) -> None:
    response = httpx.post(
        served.api + "/completions", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages"
    assert "/v1/completions takes 'prompt', not 'messages'" in error["message"]
