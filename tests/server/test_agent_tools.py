"""Tool calls through /v1/responses and /v1/messages, over a tiny model with Qwen3's real tokenizer
and chat template: forced calls come back as function_call / tool_use items whose arguments
validate against the tool's schema (`jsonschema`), streamed and whole, and the tool's result
goes back through the template on the next turn."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from tests.support.live_server import Served, serving_real_qwen3
from tests.support.structured import ADD_TOOL, WEATHER_TOOL

ASK = "Describe a pet as JSON."
TOOLS = {t["function"]["name"]: t["function"] for t in (WEATHER_TOOL, ADD_TOOL)}
FLAT = [{"type": "function", **f} for f in TOOLS.values()]  # Responses' tool shape
ANTHROPIC = [{"name": f["name"], "input_schema": f["parameters"]} for f in TOOLS.values()]
NO_THINKING = {"type": "disabled"}  # a random model that opens <think> never closes it


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    yield from serving_real_qwen3(tmp_path_factory)


@pytest.fixture(scope="module")
def oai(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(served: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=120)


def _model(served: Served) -> str:
    return served.thread.info.model_name


def _valid(name: str, arguments: dict) -> None:
    jsonschema.validate(arguments, TOOLS[name]["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "add"}])
def test_responses_forced_call(oai: openai.OpenAI, served: Served, choice) -> None:
    body = dict(model=_model(served), input=ASK, tools=FLAT, tool_choice=choice)
    body.update(parallel_tool_calls=False, max_output_tokens=120, temperature=0)
    whole = oai.responses.create(**body)
    calls = [item for item in whole.output if item.type == "function_call"]
    assert [item.type for item in whole.output] == ["function_call"], whole.output
    [call] = calls
    assert call.call_id and call.id and call.status == "completed"
    if isinstance(choice, dict):
        assert call.name == "add"
    _valid(call.name, json.loads(call.arguments))
    events = list(oai.responses.create(**body, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    final = events[-1].response
    assert events[-1].type == "response.completed"
    streamed = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    [item] = final.output
    assert item.type == "function_call" and streamed == item.arguments
    assert (item.name, item.arguments) == (call.name, call.arguments)  # greedy: the same call


def test_responses_round_trip(oai: openai.OpenAI, served: Served) -> None:
    """The call and its output go back as input items, or after previous_response_id."""
    tools = [FLAT[1]]
    body = dict(model=_model(served), tools=tools, max_output_tokens=120, temperature=0)
    first = oai.responses.create(
        **body, input=ASK, tool_choice="required", parallel_tool_calls=False
    )
    [call] = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
    items = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        result,
    ]  # fmt: skip
    again = dict(body, max_output_tokens=3)
    whole = oai.responses.create(**again, input=items)
    chained = oai.responses.create(**again, input=[result], previous_response_id=first.id)
    history = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "42"},
    ]  # fmt: skip
    ids = served.thread.encode_prompt(history, tools=[ADD_TOOL])
    assert "<tool_response>\n42\n</tool_response>" in served.thread.tokenizer.decode(ids)
    assert whole.usage.input_tokens == chained.usage.input_tokens == len(ids)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "add"}])
def test_messages_forced_call(
    claude: anthropic.Anthropic, served: Served, choice: dict, stream: bool
) -> None:
    body = dict(model=_model(served), messages=[{"role": "user", "content": ASK}])
    body.update(tools=ANTHROPIC, max_tokens=120, thinking=NO_THINKING)
    body.update(tool_choice=dict(choice, disable_parallel_tool_use=True))
    if stream:
        with claude.messages.stream(**body, extra_body={"temperature": 0}) as events:
            kinds = [e.type for e in events]
            message = events.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert "content_block_delta" in kinds
    else:
        message = claude.messages.create(**body, extra_body={"temperature": 0})
    assert message.stop_reason == "tool_use"
    [use] = message.content
    assert use.type == "tool_use" and use.id
    if choice["type"] == "tool":
        assert use.name == "add"
    _valid(use.name, use.input)


def test_messages_round_trip(claude: anthropic.Anthropic, served: Served) -> None:
    body = dict(model=_model(served), tools=ANTHROPIC[1:], thinking=NO_THINKING)
    ask = {"role": "user", "content": ASK}
    first = claude.messages.create(
        **body, messages=[ask], max_tokens=120,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
    )  # fmt: skip
    [use] = first.content
    turn = [
        ask,
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": "42"}]},
    ]  # fmt: skip
    reply = claude.messages.create(**body, messages=turn, max_tokens=2)
    history = [
        ask,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": use.id, "type": "function",
             "function": {"name": use.name, "arguments": use.input}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "42"},
    ]  # fmt: skip
    kwargs = {"enable_thinking": False}
    ids = served.thread.encode_prompt(history, kwargs, tools=[ADD_TOOL])
    assert "<tool_response>\n42\n</tool_response>" in served.thread.tokenizer.decode(ids)
    usage = reply.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == len(ids)
    count = claude.messages.count_tokens(**body, messages=turn)
    assert count.input_tokens == len(ids)
