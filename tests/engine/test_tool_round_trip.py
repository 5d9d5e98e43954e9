"""Llama 3.x JSON and gpt-oss harmony tool calls: a call rendered by a template in the family's
shape parses back, and no part of it streams as content. The templates are stand-ins written here
(the real ones are not vendored), rendering calls as the real ones do: Llama 3.1's assistant turn
is the bare ``{"name": ..., "parameters": ...}`` object; gpt-oss puts the recipient in the header,
``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>``."""

from __future__ import annotations

import json

import pytest

from macbatch.engine.reasoning import Phase, ReasoningFormat, ReasoningTracker
from macbatch.engine.tool_calls import detect_tool_format, template_messages
from tests.support.standin import HARMONY_TOOLS, standin_tokenizer
from tests.support.structured import ADD_TOOL, WEATHER_TOOL

LLAMA3 = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|eot_id|>{% endif %}"
    "{% for m in messages %}"
    "{% if m.tool_calls %}{% set call = m.tool_calls[0].function %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    '{{ \'{"name": "\' + call.name + \'", "parameters": \' + call.arguments | tojson + "}" }}'
    "<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
FAMILIES = {
    "llama3_json": (
        LLAMA3,
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        ["<|eot_id|>"],
    ),
    "harmony": (
        HARMONY_TOOLS,
        ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>"],
        ["<|call|>"],
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_rendered_call_parses_back(family):
    template, special, eos = FAMILIES[family]
    tokenizer = standin_tokenizer(special, ["assistant", "user"], template, eos)
    fmt = detect_tool_format(tokenizer)
    assert fmt is not None and fmt.family == family
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}
    history = [
        *question,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "abc123456", "type": "function", "function": call}],
        },
    ]
    tools = [WEATHER_TOOL, ADD_TOOL]
    before = tokenizer.apply_chat_template(
        question, tools=tools, add_generation_prompt=True, tokenize=False
    )
    after = tokenizer.apply_chat_template(
        template_messages(history), tools=tools, add_generation_prompt=False, tokenize=False
    )
    assert after.startswith(before)
    reply = after[len(before) :].removesuffix(eos[0])  # the EOS token ends the reply, unseen
    reasoning = ReasoningFormat.of(tokenizer)  # harmony: the engine splits channels first
    if reasoning is not None:
        ids = tokenizer.encode(reply, add_special_tokens=False)
        tracker = ReasoningTracker(reasoning, Phase.MAYBE)
        for n in range(1, len(ids) + 1):
            tracker.advance(ids[:n])
        assert tracker.split(reply)[0] is None
        reply = tracker.split(reply)[1]
    # streaming, no part of the call is ever shown as words
    assert all(fmt.content_end(reply[:n]) == 0 for n in range(1, len(reply) + 1))
    content, calls = fmt.parse(reply)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"})
    ]
