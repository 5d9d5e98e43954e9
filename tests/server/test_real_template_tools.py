"""Agent loops through `serve` with the `openai` client, on the real chat templates of Qwen3.5
(XML calls, thinking on by default) and gpt-oss (harmony): three tool round trips with
tool_choice "required", then a named tool, streamed and not, where every call's arguments
validate against the tool's schema (`jsonschema`) and each result goes back through the
template on the next turn. The models are tiny and random (tests/support/real_templates.py)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support.live_server import Served, serving, start_engine
from tests.support.real_templates import save_gpt_oss, save_with_template
from tests.support.structured import ADD_TOOL, WEATHER_TOOL

TOOLS = [
    {"type": "function", "function": {**t["function"], "description": "a tool"}}
    for t in (WEATHER_TOOL, ADD_TOOL)
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# a random model may open a reasoning block and never close it: a budget of 0 closes it at once
NO_REASONING = {"thinking_token_budget": 0}


@pytest.fixture(scope="module", params=["qwen3_5", "gpt_oss"])
def served(request, tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("models") / request.param
    if request.param == "gpt_oss":
        save_gpt_oss(path)
    else:
        save_with_template(path, request.param)
    thread = start_engine(path)
    with serving(thread) as server:
        yield server
    thread.shutdown()


@pytest.fixture(scope="module")
def oai(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0, timeout=120)


def _ask(oai: openai.OpenAI, served: Served, messages: list, choice, stream: bool) -> dict:
    """One assistant turn as a message dict (the stream reassembled)."""
    body = dict(model=served.thread.info.model_name, messages=messages, tools=TOOLS)
    body.update(tool_choice=choice, parallel_tool_calls=False, max_tokens=160, temperature=0)
    if not stream:
        reply = oai.chat.completions.create(**body, extra_body=NO_REASONING)
        assert reply.choices[0].finish_reason == "tool_calls"
        return reply.choices[0].message.model_dump(exclude_none=True)
    calls: dict[int, dict] = {}
    reason, content = None, ""
    for chunk in oai.chat.completions.create(**body, stream=True, extra_body=NO_REASONING):
        choice_ = chunk.choices[0]
        reason = choice_.finish_reason or reason
        content += choice_.delta.content or ""
        for call in choice_.delta.tool_calls or []:
            calls.setdefault(call.index, call.model_dump(exclude_none=True))
    assert reason == "tool_calls" and content == ""
    return {"role": "assistant", "tool_calls": [calls[i] for i in sorted(calls)]}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_three_tool_round_trips(oai: openai.OpenAI, served: Served, stream: bool) -> None:
    messages: list = [{"role": "user", "content": "Weather in Oslo, then add 2 and 3."}]
    named = {"type": "function", "function": {"name": "add"}}
    for turn, choice in enumerate(["required", "required", named]):
        message = _ask(oai, served, messages, choice, stream)
        [call] = message["tool_calls"]
        name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
        assert name == "add" or choice == "required"
        jsonschema.validate(arguments, SCHEMAS[name])
        result = f"result {turn}: 42"
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": result}]
    # the whole history goes through the template again, every result in it
    text = served.thread.call(
        lambda engine: engine.tokenizer.decode(engine.encode_prompt(messages, tools=TOOLS))
    ).result(timeout=60)
    assert all(f"result {turn}: 42" in text for turn in range(3))
    body = dict(model=served.thread.info.model_name, messages=messages, tools=TOOLS)
    reply = oai.chat.completions.create(**body, max_tokens=4, extra_body=NO_REASONING)
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_thinking_by_default_and_the_switch(oai: openai.OpenAI, served: Served) -> None:
    """Qwen3.5's template opens a reasoning block unless told not to: the reply's reasoning
    comes apart from the answer, and ``enable_thinking: false`` leaves none (gpt-oss's
    template has no switch: its analysis channel is the model's choice)."""
    if served.thread.info.model.thinking_default is None:
        pytest.skip("this template has no thinking switch")
    assert served.thread.info.model.thinking_default is True
    body = dict(model=served.thread.info.model_name, max_tokens=8, temperature=0)
    body["messages"] = [{"role": "user", "content": "Hello?"}]
    budget = {"thinking_token_budget": 3}  # the reasoning ends and an answer follows
    thinks = oai.chat.completions.create(**body, extra_body=budget).choices[0].message
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    plain = oai.chat.completions.create(**body, extra_body=off).choices[0].message
    assert thinks.model_extra is not None and "reasoning_content" in thinks.model_extra
    assert plain.model_extra is not None and "reasoning_content" not in plain.model_extra
    assert plain.content
