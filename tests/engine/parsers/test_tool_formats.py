"""Every tool-call family macbatch parses, on the family's REAL chat template (vendored in
tests/support/templates): detection by rendering finds the family; a call rendered by the
template parses back to the same name and arguments; a history with a call and its result
renders; and a call forced by the family's grammar (tool_choice "required" and named), written
by a tiny random model, parses and its arguments validate against the tool's schema
(``jsonschema`` is the oracle)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from macbatch.engine import (
    Engine,
    EngineConfig,
    FinishReason,
    PromptInput,
    SamplingParams,
    StructuredOutput,
)
from macbatch.engine.parsers.tool_calls import chosen_tools, template_messages
from macbatch.engine.parsers.tool_formats.detect import detect_tool_format
from tests.support.real_templates import FAMILIES, template_on, tokenizer_for
from tests.support.structured import (
    ADD_TOOL,
    QWEN3_VOCAB,
    WEATHER_TOOL,
    function_tool,
)
from tests.support.tiny import build_model

# nested arguments, bounded so that a random model's forced call ends within max_tokens
SEARCH_TOOL = function_tool(
    "search",
    {
        "query": {"type": "string", "maxLength": 12},
        "filter": {
            "type": "object",
            "properties": {
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 6},
                    "maxItems": 2,
                },
                "exact": {"type": "boolean"},
            },
            "required": ["tags", "exact"],
            "additionalProperties": False,
        },
    },
)
# gpt-oss's template needs a description for every tool
TOOLS = [
    {"type": "function", "function": {**t["function"], "description": "a tool"}}
    for t in (WEATHER_TOOL, ADD_TOOL, SEARCH_TOOL)
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = {"role": "user", "content": "What is the weather in São Paulo, and 2 + 40?"}
CALLS = [
    ("get_weather", {"city": "São Paulo", "unit": "c"}),
    ("add", {"a": 2, "b": 40}),
    ("search", {"filter": {"exact": True, "tags": ["x y", "z: 1"]}, "query": "a, b {c}"}),
]
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "add"}}}


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3", vocab_size=QWEN3_VOCAB)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request, model):
    """An engine over the tiny model with the real Qwen3 tokenizer wearing the family's
    template (one tokenizer object for all but LFM2, so llguidance indexes its vocabulary
    once)."""
    with template_on(tokenizer_for(request.param), request.param) as tokenizer:
        yield Engine(model, tokenizer, EngineConfig(num_blocks=128, block_size=16))


def _message(*calls: tuple[str, dict]) -> dict:
    written = [
        {"id": f"abc12345{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)
    ]
    for call in written:
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    return {"role": "assistant", "content": "", "tool_calls": written}


def _render(engine: Engine, messages: list[dict], prompt: bool) -> list[int]:
    return engine.tokenizer.apply_chat_template(
        template_messages(messages, engine.info.model.tool_format),
        tools=TOOLS,
        add_generation_prompt=prompt,
    )


def _reply(engine: Engine, *calls: tuple[str, dict]) -> str:
    """What the template writes for the assistant's calls: the tokens after those it shares
    with the generation prompt, without what it writes after every assistant turn."""
    prompt = _render(engine, [QUESTION], True)
    called = _render(engine, [QUESTION, _message(*calls)], False)
    shared = next((i for i, (a, b) in enumerate(zip(prompt, called)) if a != b), len(prompt))
    words = engine.tokenizer.decode(
        _render(engine, [QUESTION, {"role": "assistant", "content": "Fine."}], False)
    )
    turn_end = words[words.rindex("Fine.") + len("Fine.") :]
    reply = engine.tokenizer.decode(called[shared:])
    return reply.removesuffix(turn_end).rstrip() if turn_end.strip() else reply


def test_detection_finds_the_family(engine, request):
    name = request.node.callspec.params["engine"]
    fmt = engine.info.model.tool_format
    assert fmt is not None and fmt.family == FAMILIES[name]
    # DeepSeek V3.1's template concatenates the arguments ("can only concatenate str (not
    # dict)" with a mapping); LFM2's renders no calls, so they go into the content
    assert fmt.text_arguments == (name == "deepseek_v3_1")
    assert fmt.calls_in_content == name.startswith("lfm2")
    # Kimi K2 Thinking's template writes a call's id where Instruct's writes functions.NAME:0
    assert fmt.ids_as_names == (name == "kimi_k2_thinking")
    assert detect_tool_format(engine.tokenizer) == engine.info.model.tool_format


@pytest.mark.parametrize(("name", "arguments"), CALLS, ids=["strings", "integers", "nested"])
def test_a_call_rendered_by_the_template_parses_back(engine, name, arguments):
    fmt = engine.info.model.tool_format.for_tools(TOOLS)
    reply = _reply(engine, (name, arguments))
    _, calls = fmt.parse(reply)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(name, arguments)], reply
    # streamed, no part of the call is ever shown as words
    at = fmt.content_end(reply)
    assert fmt.parse(reply[at:])[1], reply
    assert all(fmt.content_end(reply[:n]) <= at for n in range(len(reply) + 1))


def test_two_calls_in_one_turn_parse_back(engine):
    """Parallel calls as the template writes them (a template that takes one call per turn
    refuses two, Llama 3's, or keeps the first, gpt-oss's: harmony ends a turn at a call)."""
    fmt = engine.info.model.tool_format.for_tools(TOOLS)
    try:
        reply = _reply(engine, *CALLS[:2])
    except Exception as exc:  # the template's own raise_exception
        assert fmt.family == "llama3_json", exc
        return
    _, calls = fmt.parse(reply)
    written = CALLS[:1] if fmt.family == "harmony" else CALLS[:2]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == written, reply


def test_a_history_with_a_call_and_its_result_renders(engine):
    result = {"role": "tool", "tool_call_id": "abc123450", "content": "sunny 21"}
    history = [QUESTION, _message(CALLS[0]), result]
    text = engine.tokenizer.decode(engine.encode_prompt(history, tools=TOOLS))
    assert "sunny 21" in text and "São Paulo" in text


@pytest.mark.parametrize("choice", CHOICES)
def test_a_forced_call_parses_and_validates(engine, choice):
    fmt = engine.info.model.tool_format.for_tools(TOOLS)
    allowed = chosen_tools(TOOLS, CHOICES[choice])
    grammar = StructuredOutput(grammar=fmt.grammar(allowed, False, engine.tokenizer))
    params = [
        SamplingParams(
            max_tokens=160,
            temperature=1.0,
            seed=seed,
            structured=StructuredOutput(grammar=grammar.grammar, own_channel=fmt.own_channel),
            thinking_token_budget=0,  # a random model that opens a reasoning block at once
        )
        for seed in range(2)
    ]
    thinking_off = {"enable_thinking": False}
    prompt = PromptInput([QUESTION], thinking_off, TOOLS)
    ids = [engine.add_request(prompt, p) for p in params]
    finals = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    for rid in ids:
        out = finals[rid]
        assert out.finish_reason is FinishReason.STOP, out.text
        _, calls = fmt.parse(out.text)
        assert len(calls) == 1, out.text
        assert calls[0].name in {t["function"]["name"] for t in allowed}
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
