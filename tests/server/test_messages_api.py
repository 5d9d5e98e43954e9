"""/v1/messages through the official anthropic client against a real server: text equals the
engine's own greedy generation, the stream reassembles into the whole message, stop sequences
and count_tokens agree with the engine, and errors come in Anthropic's shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from macbatch.engine import EngineThread, SamplingParams
from macbatch.server.app import ServerOptions
from tests.support.live_server import Served, engine_generate, serving

SYSTEM = "Be brief."
ASK = [{"role": "user", "content": "hello world"}]
CHAT = [{"role": "system", "content": SYSTEM}, *ASK]
# this anthropic client has no sampling arguments any more; the API still takes them
GREEDY = {"temperature": 0}


@pytest.fixture
def client(served: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=60)


def test_message_matches_engine(client: anthropic.Anthropic, served: Served) -> None:
    [expected] = engine_generate(
        served.thread, [CHAT], SamplingParams(max_tokens=12, temperature=0)
    )
    message = client.messages.create(
        model=served.thread.info.model_name, system=SYSTEM, messages=ASK, max_tokens=12,
        extra_body=GREEDY,
    )  # fmt: skip
    assert message.type == "message" and message.role == "assistant"
    [block] = message.content
    assert block.type == "text" and block.text == expected.text
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    usage = message.usage  # Anthropic counts prefix-cache reads apart from input_tokens
    assert usage.input_tokens + usage.cache_read_input_tokens == expected.metrics.prompt_tokens
    assert message.usage.output_tokens == len(expected.token_ids)


def test_stream_reassembles_into_the_message(client: anthropic.Anthropic) -> None:
    body = dict(system=[{"type": "text", "text": SYSTEM}], messages=ASK, max_tokens=12)
    body.update(extra_body=GREEDY)
    whole = client.messages.create(model=_model(client), **body)
    with client.messages.stream(model=_model(client), **body) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens
    prompt = [whole.usage, final.usage]
    assert len({u.input_tokens + u.cache_read_input_tokens for u in prompt}) == 1


def test_stop_sequence(client: anthropic.Anthropic, served: Served) -> None:
    [free] = engine_generate(served.thread, [CHAT], SamplingParams(max_tokens=24, temperature=0))
    stop = free.text[len(free.text) // 2 :][:3]
    assert stop, free.text
    oracle = SamplingParams(max_tokens=24, temperature=0, stop=(stop,))
    [expected] = engine_generate(served.thread, [CHAT], oracle)
    message = client.messages.create(
        model=_model(client), system=SYSTEM, messages=ASK, max_tokens=24, extra_body=GREEDY,
        stop_sequences=[stop],
    )  # fmt: skip
    assert message.content[0].text == expected.text
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop


def test_count_tokens(client: anthropic.Anthropic, served: Served) -> None:
    count = client.messages.count_tokens(model=_model(client), system=SYSTEM, messages=ASK)
    assert count.input_tokens == len(served.thread.encode_prompt(CHAT))


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": None},
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"tool_choice": {"type": "any"}},
        {"thinking": {"type": "sometimes"}},
        {"stop_sequences": "END"},
    ],
)
def test_bad_input_is_a_400_in_anthropic_shape(client: anthropic.Anthropic, fields: dict) -> None:
    body = {"messages": ASK, "max_tokens": 2, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.post("/v1/messages", body=body, cast_to=object)
    assert info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.body["error"]["message"]
    assert client.messages.create(model=_model(client), messages=ASK, max_tokens=1).content


def test_unknown_model_and_route_in_anthropic_shape(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="claude-nothing", messages=ASK, max_tokens=1)
    assert info.value.body["error"]["type"] == "not_found_error"


def test_x_api_key(engine_thread: EngineThread) -> None:
    with serving(engine_thread, ServerOptions(api_key="sesame")) as server:
        keyed = anthropic.Anthropic(base_url=server.url, api_key="sesame", max_retries=0)
        assert keyed.messages.create(model=_model(keyed), messages=ASK, max_tokens=1).content
        wrong = anthropic.Anthropic(base_url=server.url, api_key="nope", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as info:
            wrong.messages.create(model="m", messages=ASK, max_tokens=1)
        assert info.value.body["error"]["type"] == "authentication_error"
        # the OpenAI routes take the Anthropic header too, and keep their own error shape
        headers = {"x-api-key": "sesame"}
        assert httpx.get(server.api + "/models", headers=headers).status_code == 200
        refused = httpx.get(server.api + "/models", headers={"x-api-key": "nope"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def _model(client: anthropic.Anthropic) -> str:
    """The served model's id, from the server's OpenAI-shaped /v1/models."""
    url = str(client.base_url).rstrip("/") + "/v1/models"
    return httpx.get(url, headers={"x-api-key": client.api_key}).json()["data"][0]["id"]
