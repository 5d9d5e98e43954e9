"""Tool calls through the models' own templates (Qwen3's Hermes format, Mistral's [TOOL_CALLS]):
rendered calls parse back, forced calls are valid calls with arguments valid against the tool's
`parameters` (the `jsonschema` library is the oracle), malformed tools and history are refused."""

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
from macbatch.engine.parsers.reasoning import Phase, ReasoningTracker
from macbatch.engine.parsers.tool_calls import ToolFormat, chosen_tools, template_messages
from macbatch.engine.parsers.tool_formats import SYNTAXES
from macbatch.engine.parsers.tool_formats.detect import detect_tool_format
from tests.support.structured import (
    ADD_TOOL,
    MISTRAL_VOCAB,
    QWEN3_VOCAB,
    WEATHER_TOOL,
    real_tokenizer,
)
from tests.support.tiny import build_model

TOOLS = [WEATHER_TOOL, ADD_TOOL]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
FAMILIES = [("qwen3", QWEN3_VOCAB, "hermes"), ("mistral", MISTRAL_VOCAB, "mistral")]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def engine(request):
    name, vocab, _ = request.param
    model = build_model("qwen3", vocab_size=vocab)
    return Engine(model, real_tokenizer(name), EngineConfig(num_blocks=128, block_size=16))


def _history(arguments) -> list[dict]:
    call = {"id": "abc123456", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": arguments}
    return [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}]


def test_each_family_is_detected_and_round_trips_a_rendered_call(engine):
    """Render a call with the template, decode what the assistant turn added, parse it back."""
    tokenizer = engine.tokenizer
    family = {"qwen3": "hermes", "mistral": "mistral"}
    fmt = engine.info.model.tool_format
    assert fmt == detect_tool_format(tokenizer)
    assert fmt.family in family.values()
    before = tokenizer.apply_chat_template(QUESTION, tools=TOOLS, add_generation_prompt=True)
    history = template_messages(_history('{"city": "Paris", "unit": "c"}'))
    after = tokenizer.apply_chat_template(history, tools=TOOLS, add_generation_prompt=False)
    assert after[: len(before)] == before
    added = [t for t in after[len(before) :] if t not in tokenizer.eos_token_ids]
    text = tokenizer.decode(added)
    if (
        engine.info.model.reasoning_format is not None
    ):  # Qwen3 renders an empty <think></think> first
        text = ReasoningTracker(engine.info.model.reasoning_format, Phase.MAYBE).split(text)[1]
    content, calls = fmt.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"})
    ]
    assert content == ""


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_required_and_named_choices_always_give_valid_calls(engine, choice):
    fmt = engine.info.model.tool_format
    allowed = chosen_tools(TOOLS, choice)
    grammar = fmt.grammar(allowed, False, engine.tokenizer)
    params = [
        SamplingParams(
            max_tokens=80, temperature=1.0, seed=s, structured=StructuredOutput(grammar=grammar)
        )
        for s in range(4)
    ]
    # Thinking off (a random model that opens <think> never closes it): the grammar applies from
    # the first token. The prompt is the template's own rendering, tools included.
    prompt = engine.tokenizer.apply_chat_template(
        QUESTION, tools=TOOLS, add_generation_prompt=True, enable_thinking=False
    )
    ids = [engine.add_request(prompt, p) for p in params]
    finals = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in allowed}
    for rid in ids:
        out = finals[rid]
        assert out.finish_reason is FinishReason.STOP, out.text
        _, calls = fmt.parse(out.text)
        assert len(calls) == 1, out.text
        assert calls[0].name in schemas
        jsonschema.validate(json.loads(calls[0].arguments), schemas[calls[0].name])


def test_unknown_tool_and_malformed_history_are_refused(engine):
    with pytest.raises(ValueError, match="not among the tools"):
        chosen_tools(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="not valid JSON"):
        engine.add_request(
            PromptInput(_history("{city"), tools=TOOLS), SamplingParams(max_tokens=2)
        )
    with pytest.raises(ValueError, match="string 'name'"):
        engine.add_request(
            PromptInput(QUESTION, tools=[{"function": {}}]), SamplingParams(max_tokens=2)
        )
    with pytest.raises(ValueError, match="tools need a chat prompt"):
        engine.add_request(PromptInput("hello", tools=TOOLS), SamplingParams(max_tokens=2))
    assert not engine.has_unfinished()


def test_tool_results_reach_the_template(engine):
    """A tool result in the history is in the prompt (it used to be dropped)."""
    history = [
        *_history({"city": "Paris", "unit": "c"}),
        {"role": "tool", "tool_call_id": "abc123456", "name": "get_weather", "content": "sunny 21"},
    ]
    ids = engine.encode_prompt(history, tools=TOOLS)
    assert "sunny 21" in engine.tokenizer.decode(ids)


@pytest.mark.parametrize(
    ("family", "text", "want"),
    [
        (
            "llama3_json",
            '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}',
            ("", [("add", {"a": 1, "b": 2})]),
        ),
        (
            "harmony",
            "<|channel|>analysis<|message|>need weather<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'
            "<|call|>",
            ("", [("get_weather", {"city": "Oslo"})]),
        ),
        ("llama3_json", "Just words.", ("Just words.", [])),
    ],
)
def test_llama3_and_harmony_parsers(family, text, want):
    """The forms the models write that their templates do not (``<|python_tag|>``, the
    recipient after the channel)."""
    fmt = ToolFormat(SYNTAXES[family])
    content, calls = fmt.parse(text)
    assert (content, [(c.name, json.loads(c.arguments)) for c in calls]) == want
