"""serve with structured output and tools, over a tiny model with Qwen3's real tokenizer and
template: replies validate against their schema (`jsonschema` is the oracle), forced tool calls
carry valid arguments streamed or not, and bad input is a 400 while the server keeps serving."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.support.live_server import Served, serving_real_qwen3
from tests.support.structured import (
    ADD_TOOL,
    WEATHER_TOOL,
    schema_family,
)

ASK = [{"role": "user", "content": "Describe a pet as JSON."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    yield from serving_real_qwen3(tmp_path_factory)


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)


def _chat(client: openai.OpenAI, stream: bool, **fields):
    """(message-like dict, finish_reason) of one greedy choice, streamed or not."""
    body = {"messages": ASK, "max_tokens": 120, "temperature": 0, **fields}
    if not stream:
        choice = client.post("/chat/completions", body=body, cast_to=object)["choices"][0]
        return choice["message"], choice["finish_reason"]
    events = client.post(
        "/chat/completions",
        body=dict(body, stream=True),
        cast_to=object,
        stream=True,
        stream_cls=openai.Stream[object],
    )
    message: dict = {"content": "", "tool_calls": []}
    finish = None
    for event in events:
        choice = event["choices"][0]
        delta = choice["delta"]
        message["content"] += delta.get("content") or ""
        message["tool_calls"] += delta.get("tool_calls") or []
        finish = choice["finish_reason"] or finish
    return message, finish


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema(client: openai.OpenAI, stream: bool) -> None:
    schema = schema_family(4)[3]
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema, "strict": True}}
    message, finish = _chat(client, stream, response_format=fmt)
    assert finish == "stop"
    jsonschema.validate(json.loads(message["content"]), schema)


def test_every_choice_of_n_follows_the_schema(client: openai.OpenAI) -> None:
    schema = schema_family(6)[5]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    # A text completion: sampled chat replies of this random model may open a <think> block
    # (Qwen3's template leaves thinking to the model) and reason until max_tokens.
    body = {"prompt": "A pet:", "max_tokens": 120, "temperature": 1.0, "seed": 5, "n": 3}
    reply = client.post("/completions", body=dict(body, response_format=fmt), cast_to=object)
    assert len(reply["choices"]) == 3
    for choice in reply["choices"]:
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["text"]), schema)


def test_vllm_extras(client: openai.OpenAI) -> None:
    message, _ = _chat(client, False, guided_choice=["cat", "dog"])
    assert message["content"] in ("cat", "dog")
    message, _ = _chat(client, False, guided_regex=r"[0-9]{3}")
    assert re.fullmatch(r"[0-9]{3}", message["content"])
    message, _ = _chat(client, False, structured_outputs={"json_object": True}, max_tokens=200)
    assert isinstance(json.loads(message["content"]), dict)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_tool_calls(client: openai.OpenAI, stream: bool, choice) -> None:
    message, finish = _chat(
        client,
        stream,
        tools=[WEATHER_TOOL, ADD_TOOL],
        tool_choice=choice,
        parallel_tool_calls=False,
    )
    assert finish == "tool_calls", message
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"]
    tool = {"get_weather": WEATHER_TOOL, "add": ADD_TOOL}[call["function"]["name"]]
    if isinstance(choice, dict):
        assert call["function"]["name"] == "add"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, tool["function"]["parameters"])
    assert not message["content"]


def test_tool_history_round_trip(client: openai.OpenAI, served: Served) -> None:
    """A reply's call and the tool's result go back through the template on the next turn."""
    first, finish = _chat(
        client, False, tools=[ADD_TOOL], tool_choice="required", parallel_tool_calls=False
    )
    assert finish == "tool_calls", first
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": first["tool_calls"]},
        {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "42"},
    ]
    body = {"messages": history, "tools": [ADD_TOOL], "max_tokens": 3}
    reply = client.post("/chat/completions", body=body, cast_to=object)
    assert reply["usage"]["prompt_tokens"] > 0
    ids = served.thread.call(lambda e: e.encode_prompt(history, tools=[ADD_TOOL])).result(30)
    assert "<tool_response>\n42\n</tool_response>" in served.thread.tokenizer.decode(ids)
    assert reply["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format",
        ),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"tools": [ADD_TOOL], "tool_choice": {"function": {"name": "x"}}}, "tool_choice"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
                    {"role": "tool", "content": "1"},
                    {"role": "user", "content": "hi"},
                ],
                "tools": [ADD_TOOL],
            },
            "messages",
        ),
    ],
)
def test_bad_input_is_400_and_the_server_keeps_serving(
    client: openai.OpenAI, fields: dict, param: str | None
) -> None:
    body = {"messages": ASK, "max_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/chat/completions", body=body, cast_to=object)
    assert info.value.body["param"] == param
    message, _ = _chat(client, False, guided_choice=["yes", "no"])
    assert message["content"] in ("yes", "no")


def test_reasoning_goes_out_under_both_names() -> None:
    """Messages and stream deltas carry reasoning as reasoning_content and as reasoning."""
    from macbatch.engine import FinishReason, RequestMetrics, RequestOutput
    from macbatch.engine.parsers.text import FixedText
    from macbatch.openai.responses import ChatFormatter

    class Decoder:
        def decode(self, ids: list[int]) -> str:
            return "x"

    def output(reasoning: str, text: str, finished: bool) -> RequestOutput:
        return RequestOutput(
            request_id="r",
            token_ids=[1, 2],
            new_token_ids=[2],
            finished=finished,
            finish_reason=FinishReason.STOP if finished else None,
            metrics=RequestMetrics(arrival_time=0.0),
            step=1,
            text_view=FixedText(text, text, reasoning, reasoning),
        )

    formatter = ChatFormatter("m", Decoder(), None, 1)
    chunks = formatter.chunks(0, output("hmm", "", False))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert {"reasoning_content": "hmm", "reasoning": "hmm"} in deltas
    message = formatter.final_choice(0, output("hmm", "42", True))["message"]
    assert message == {
        "role": "assistant",
        "content": "42",
        "reasoning_content": "hmm",
        "reasoning": "hmm",
    }
