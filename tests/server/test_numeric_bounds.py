"""Numbers past what the engine holds (issue 46). ``top_k: 2**64`` once reached MLX inside the
engine's step (``std::bad_cast``) and took the engine down for every client until a restart; now
each API answers a 400 naming the field, a stream in flight finishes, and /health and a normal
request still answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from macbatch.engine import EngineThread
from macbatch.server.app import ServerOptions, stop_batches
from tests.support.batch_api import CHAT, DONE, batch_lines, jsonl, output_lines, wait_for
from tests.support.live_server import Served, serving

HUGE = 2**64  # 2**63 worked; past 64 bits MLX could not convert it
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(engine_thread: EngineThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    options = ServerOptions(data_dir=tmp_path_factory.mktemp("data"))
    with serving(engine_thread, options) as served:
        yield served
        stop_batches(served.app)


@pytest.fixture
def client(server: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def _still_serves(server: Served, client: openai.OpenAI) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    model = server.thread.info.model_name
    reply = client.chat.completions.create(model=model, messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason in ("length", "stop")


def test_top_k_past_64_bits_is_a_400_on_every_api_and_the_engine_keeps_serving(
    server: Served, client: openai.OpenAI
) -> None:
    model = server.thread.info.model_name
    stream = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=24, temperature=0, stream=True,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    next(chunks)  # the stream is in flight while the bad bodies arrive
    huge = {"top_k": HUGE}
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=model, messages=HELLO, extra_body=huge)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model=model, prompt="hi", extra_body=huge)
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=model, input="hi", extra_body=huge)
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as claude:
        messages.messages.create(model=model, max_tokens=2, messages=HELLO, extra_body=huge)  # type: ignore[arg-type]
    for refused in (chat, completion, responses):
        error = refused.value.response.json()["error"]
        assert error["param"] == "top_k" and "top_k=18446744073709551616" in error["message"]
    assert "top_k" in claude.value.message
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length"
    _still_serves(server, client)


# (route, body fields over a valid body, the field the 400 names)
OUT_OF_RANGE = [
    ("/v1/chat/completions", {"seed": HUGE}, "seed"),
    ("/v1/chat/completions", {"seed": -(2**63) - 1}, "seed"),
    ("/v1/chat/completions", {"seed": 2**63 - 1, "n": 2}, "seed"),  # choice 1: seed + 1
    ("/v1/chat/completions", {"max_tokens": HUGE}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 2**31}, "max_completion_tokens"),
    ("/v1/chat/completions", {"top_k": 2**31}, "top_k"),
    ("/v1/chat/completions", {"stop_token_ids": [HUGE]}, "stop_token_ids"),
    ("/v1/chat/completions", {"thinking_token_budget": HUGE}, "thinking_token_budget"),
    ("/v1/chat/completions", {"repetition_penalty": 1e308}, "repetition_penalty"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"logprobs": HUGE}, "logprobs"),
    ("/v1/completions", {"seed": HUGE}, "seed"),
    ("/v1/responses", {"max_output_tokens": HUGE}, "max_output_tokens"),
    ("/v1/responses", {"seed": HUGE}, "seed"),
    ("/v1/messages", {"max_tokens": HUGE}, "max_tokens"),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": HUGE}}, "budget_tokens"),
    ("/v1/embeddings", {"dimensions": HUGE}, "dimensions"),
]
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": HELLO, "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"messages": HELLO, "max_tokens": 2},
    "/v1/embeddings": {"input": "hi"},
}


@pytest.mark.parametrize(("route", "fields", "param"), OUT_OF_RANGE)
def test_every_number_out_of_range_is_a_400_naming_it(
    server: Served, client: openai.OpenAI, route: str, fields: dict, param: str
) -> None:
    response = httpx.post(server.url + route, json={**VALID[route], **fields}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if route == "/v1/messages":  # Anthropic's shape: no param; the message names the field
        assert param in error["message"], error
    else:
        assert error["param"] == param, error
    _still_serves(server, client)


def test_a_batch_with_one_row_out_of_range_runs_every_other_row(
    server: Served, client: openai.OpenAI
) -> None:
    rows = batch_lines(5, max_tokens=2)
    rows[2]["body"].update(top_k=HUGE, temperature=1.0)  # sampled: top_k reaches the sampler
    data = client.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch").id
    batch = client.batches.create(input_file_id=data, endpoint=CHAT, completion_window="24h")
    batch = wait_for(client, batch.id, lambda b: b.status in DONE)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 4, "failed": 1}
    [error] = output_lines(client, batch.error_file_id)
    assert error["custom_id"] == "r2" and "top_k" in error["error"]["message"]
    done = {line["custom_id"] for line in output_lines(client, batch.output_file_id)}
    assert done == {"r0", "r1", "r3", "r4"}
    _still_serves(server, client)


@pytest.mark.parametrize(
    ("route", "raw", "said"),
    [
        ("/v1/chat/completions", b'"seed": ' + b"9" * 5_000, "more than 4300 digits"),
        ("/v1/chat/completions", b'"temperature": 1e400', "past the range of a float"),
        ("/v1/responses", b'"metadata": {"a": NaN}', "NaN, which is not a JSON number"),
        ("/v1/messages", b'"top_p": -Infinity', "-Infinity, which is not a JSON number"),
    ],
    ids=["5000-digits", "1e400", "NaN", "-Infinity"],
)
def test_numbers_json_cannot_hold_are_a_400(
    server: Served, client: openai.OpenAI, route: str, raw: bytes, said: str
) -> None:
    """Python reads them (NaN once reached a Responses echo and failed as a 500); JSON has no
    way to write them back, so they are refused where the body is read."""
    body = json.dumps(VALID[route])[:-1].encode() + b", " + raw + b"}"
    response = httpx.post(server.url + route, content=body, timeout=60)
    assert response.status_code == 400, response.text
    assert said in response.json()["error"]["message"]
    _still_serves(server, client)
