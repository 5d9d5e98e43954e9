"""Forced tool calls on gpt-oss harmony: `tool_choice` "required" or a named function makes the
reply one call in the commentary channel (`<|channel|>commentary to=functions.NAME <|constrain|>json
<|message|>{...}<|call|>`), after an analysis message or at once. The engine's real outputs go
through the chat formatter, streamed and whole; the arguments validate against the tool
(`jsonschema` is the oracle) and the call goes back through the template and parses again.

The template is gpt-oss's real one (tests/support/templates), on the harmony stand-in tokenizer
(tests/support/standin.py: gpt-oss's special tokens), the model a scripted gpt_oss
(tests/support/scripted.py): it says the script where the mask allows, so which path the reply
takes (analysis first, or straight to a channel) is known; sampled at temperature 1, every
constrained step picks among the tokens the grammar allows."""

from __future__ import annotations

import json

import jsonschema
import pytest

from macbatch.engine import Engine, EngineConfig, FinishReason, PromptInput, SamplingParams
from macbatch.engine.parsers.tool_calls import ToolFormat, template_messages
from macbatch.engine.parsers.tool_formats.harmony import Harmony
from macbatch.openai import parse_chat
from macbatch.openai.responses import ChatFormatter
from tests.support.real_templates import read_template
from tests.support.scripted import scripted_model
from tests.support.standin import harmony_tokenizer
from tests.support.structured import ADD_TOOL, WEATHER_TOOL
from tests.support.tiny import VOCAB_SIZE

# gpt-oss's template needs a description for every tool
TOOLS = [
    {"type": "function", "function": {**t["function"], "description": "a tool"}}
    for t in (WEATHER_TOOL, ADD_TOOL)
]
ASK = [{"role": "user", "content": "Add 2 and 3."}]
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "add"}}}


@pytest.fixture(scope="module")
def tokenizer():
    return harmony_tokenizer(read_template("gpt_oss"))


def _ids(tokenizer, *pieces: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(piece) for piece in pieces]


def _script(tokenizer, path: str) -> list[int]:
    """What the model says after the generation prompt's last token: an analysis message, then
    (the script cycling) a new message that opens the analysis channel again; or at once a
    commentary channel. Either way the grammar decides what follows the channel marker."""
    [prompt_end] = _ids(tokenizer, "assistant")
    if path == "at_once":
        return [prompt_end, *_ids(tokenizer, "<|channel|>", "commentary", "<|return|>")]
    thought = tokenizer.encode(" quick brown", add_special_tokens=False)
    opening = _ids(tokenizer, "<|channel|>", "analysis", "<|message|>")
    return [prompt_end, *opening, *thought, *_ids(tokenizer, "<|end|>", "<|start|>"), prompt_end]


@pytest.fixture(scope="module", params=["analysis_first", "at_once"])
def path(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(path, tokenizer):
    model = scripted_model("gpt_oss", VOCAB_SIZE, _script(tokenizer, path))
    return Engine(model, tokenizer, EngineConfig(num_blocks=128, block_size=16))


def _answer(engine: Engine, structured, seed: int):
    """The formatter's whole choice and its streamed deltas for one forced-call request."""
    params = SamplingParams(max_tokens=160, temperature=1.0, seed=seed, structured=structured)
    rid = engine.add_request(PromptInput(ASK, tools=TOOLS), params)
    formatter = ChatFormatter(
        "m", engine.tokenizer, None, 1, tool_format=engine.info.model.tool_format
    )
    deltas, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                final = out
                deltas += [c["choices"][0] for c in formatter.chunks(0, out)]
    assert final is not None
    return final, formatter.final_choice(0, final), deltas


@pytest.mark.parametrize("choice", CHOICES)
def test_forced_calls_are_valid_streamed_and_whole(engine, path, tokenizer, choice):
    assert engine.info.model.tool_format.family == "harmony"
    body = {"tools": TOOLS, "tool_choice": CHOICES[choice]}
    chat = parse_chat(dict(body, messages=[{"role": "user", "content": "-"}]))
    structured = chat.bind(engine.info.model.tool_format, tokenizer).requests[0][1].structured
    for seed in range(2):
        final, whole, deltas = _answer(engine, structured, seed)
        # a stop is on <|call|>, the grammar's last token
        assert final.finish_reason is FinishReason.STOP, final.text
        if path == "analysis_first":  # unmasked reasoning, then a new message
            assert final.reasoning == tokenizer.decode(_script(tokenizer, path)[4:-3])
            assert final.text.startswith("<|start|>assistant<|channel|>commentary to=functions.")
        else:
            assert final.reasoning is None
            assert final.text.startswith("<|channel|>commentary to=functions.")
        assert whole["finish_reason"] == deltas[-1]["finish_reason"] == "tool_calls"
        [call] = whole["message"]["tool_calls"]
        name = call["function"]["name"]
        assert name == "add" or (choice == "required" and name == "get_weather")
        arguments = json.loads(call["function"]["arguments"])
        tool = {t["function"]["name"]: t for t in TOOLS}[name]
        jsonschema.validate(arguments, tool["function"]["parameters"])
        streamed = [c for d in deltas for c in d["delta"].get("tool_calls", [])]
        assert [c["function"] for c in streamed] == [call["function"]]
        assert "".join(d["delta"].get("content") or "" for d in deltas) == ""
        assert _rendered_back(tokenizer, call) == (name, arguments)


def _rendered_back(tokenizer, call: dict) -> tuple[str, dict]:
    """The call as the template renders it in the next turn's history, parsed again."""
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    before = tokenizer.apply_chat_template(
        ASK, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    after = tokenizer.apply_chat_template(
        template_messages(history), tools=TOOLS, add_generation_prompt=False, tokenize=False
    )
    assert after.startswith(before)
    [again] = ToolFormat(Harmony()).parse(after[len(before) :])[1]
    return again.name, json.loads(again.arguments)
