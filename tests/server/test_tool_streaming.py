"""Streamed tool calls for both call formats (Qwen3's Hermes tags, Mistral's [TOOL_CALLS]):
the engine's real outputs, step by step, through the chat formatter; the assembled deltas equal
the non-streamed answer and the arguments validate against the tool (`jsonschema`)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.openai import parse_chat
from macbatch.openai.responses import ChatFormatter
from tests.support.structured import (
    ADD_TOOL,
    MISTRAL_VOCAB,
    QWEN3_VOCAB,
    WEATHER_TOOL,
    real_tokenizer,
)
from tests.support.tiny import build_model


@pytest.mark.parametrize(("name", "vocab"), [("qwen3", QWEN3_VOCAB), ("mistral", MISTRAL_VOCAB)])
def test_streamed_calls_equal_the_whole_answer(name: str, vocab: int) -> None:
    tokenizer = real_tokenizer(name)
    engine = Engine(build_model("qwen3", vocab_size=vocab), tokenizer, EngineConfig(num_blocks=64))
    body = {"tools": [WEATHER_TOOL, ADD_TOOL], "tool_choice": "required"}
    chat = parse_chat(
        dict(body, messages=[{"role": "user", "content": "-"}], parallel_tool_calls=False)
    )
    [(request, choice)] = chat.bind(engine.info.model.tool_format, tokenizer).requests
    structured, tools = choice.structured, request
    # thinking off: a random model that opens <think> never closes it
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Add 2 and 3."}],
        tools=tools.tools,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    params = SamplingParams(max_tokens=80, temperature=0, structured=structured)
    rid = engine.add_request(prompt, params)
    formatter = ChatFormatter("m", tokenizer, None, 1, tool_format=engine.info.model.tool_format)
    deltas = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                final = out
                deltas += [c["choices"][0] for c in formatter.chunks(0, out)]
    whole = formatter.final_choice(0, final)
    assert whole["finish_reason"] == deltas[-1]["finish_reason"] == "tool_calls"
    streamed = [call for d in deltas for call in d["delta"].get("tool_calls", [])]
    assert all(c["id"] for c in streamed)  # ids are fresh per answer; the rest must agree
    assert [_without(c, "id", "index") for c in streamed] == [
        _without(c, "id") for c in whole["message"]["tool_calls"]
    ]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == ""
    [call] = whole["message"]["tool_calls"]
    tool = {t["function"]["name"]: t for t in (WEATHER_TOOL, ADD_TOOL)}[call["function"]["name"]]
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])


def _without(call: dict, *keys: str) -> dict:
    return {k: v for k, v in call.items() if k not in keys}
