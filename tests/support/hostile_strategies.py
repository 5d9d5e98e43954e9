"""Hypothesis strategies for hostile request bodies and job rows: well-formed fields, fields of
the wrong type, lone surrogates, deep nesting, huge numbers, and junk keys, in any mix. (A
helper of the fuzz tests, kept in tests/support/ so that no test imports another test module.)"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Text with everything a client can put in JSON: lone surrogates (Cs) included.
TEXT = st.text(st.characters(categories=["L", "N", "P", "S", "Zs", "Cc", "Cs"]), max_size=12)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.sampled_from([0, 1, 2, -1, 64, 65, 10**9, 0.5, 1e308]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=12,
)


def nested(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


DEEP = st.integers(90, 3_000).map(nested)
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "wizard", "", None])
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": ROLES, "content": st.one_of(TEXT, JSON, st.just([{"type": "text", "text": "a"}]))}
    ),
    JSON,
)
REGEXES = st.sampled_from(["[a-z]{1,3}", "(", "[z-a]", "a|b", "\\b", "x" * 40 + "("])
SCHEMAS = st.one_of(
    st.just({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    st.just({"$ref": "#/$defs/missing"}),
    st.integers(1, 400).map(
        lambda n: {
            "$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
            | {f"d{n}": {"type": "string", "maxLength": 2}},
            "$ref": "#/$defs/d0",
        }
    ),
    JSON,
)
TOOL = st.one_of(
    st.just({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
    st.builds(lambda p: {"type": "function", "function": {"name": "g", "parameters": p}}, SCHEMAS),
    JSON,
)
OPTIONAL_FIELDS = {
    "model": st.one_of(TEXT, JSON),
    "n": st.one_of(st.integers(-2, 70), JSON),
    "temperature": st.one_of(NUMBERS, JSON),
    "top_p": NUMBERS,
    "top_k": NUMBERS,
    "seed": NUMBERS,
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3), JSON),
    "stream": st.one_of(st.booleans(), JSON),
    "stream_options": st.one_of(st.just({"include_usage": True}), JSON),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 30), JSON),
    "top_logprobs": st.one_of(st.integers(-1, 30), JSON),
    "presence_penalty": NUMBERS,
    "frequency_penalty": NUMBERS,
    "response_format": st.one_of(
        st.just({"type": "json_object"}),
        st.builds(lambda s: {"type": "json_schema", "json_schema": {"schema": s}}, SCHEMAS),
        JSON,
    ),
    "guided_regex": st.one_of(REGEXES, JSON),
    "guided_choice": st.one_of(st.lists(TEXT, max_size=3), JSON),
    "guided_json": SCHEMAS,
    "guided_grammar": st.one_of(st.just('start: "a" | "b"'), st.just("start: foo"), TEXT),
    "tools": st.one_of(st.lists(TOOL, max_size=2), JSON),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), JSON),
    "chat_template_kwargs": st.one_of(st.just({"enable_thinking": False}), JSON),
    "reasoning_effort": st.one_of(st.sampled_from(["low", "high"]), JSON),
    "echo": JSON,
    "logit_bias": JSON,
    "deep": DEEP,
}


@st.composite
def bodies(draw: st.DrawFn, chat: bool) -> dict[str, Any]:
    """A request body: a prompt of some shape, some optional fields, maybe a junk key. Token
    counts stay small, so a body that is valid finishes at once on the tiny model."""
    body: dict[str, Any] = {}
    if chat:
        body["messages"] = draw(st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), JSON))
    else:
        body["prompt"] = draw(
            st.one_of(TEXT, st.lists(st.integers(-5, 200_000), max_size=4), st.just([]), JSON)
        )
    names = draw(st.lists(st.sampled_from(sorted(OPTIONAL_FIELDS)), max_size=4, unique=True))
    for name in names:
        body[name] = draw(OPTIONAL_FIELDS[name])
    if draw(st.booleans()):
        body[draw(TEXT)] = draw(JSON)
    body["max_tokens"] = draw(st.one_of(st.integers(1, 3), st.integers(-3, 0), JSON))
    return body


PLAIN_TEXT = st.text(st.characters(categories=["L", "N", "P", "Zs"]), min_size=1, max_size=12)
VALID_FIELDS = {
    "n": st.integers(1, 3),
    "temperature": st.floats(0, 2),
    "seed": st.integers(0, 2**31),
    "stop": st.lists(PLAIN_TEXT, max_size=2),
    "stream": st.booleans(),
    "stream_options": st.just({"include_usage": True}),
    "response_format": st.sampled_from(
        [
            {"type": "json_object"},
            {"type": "text"},
            {"type": "json_schema", "json_schema": {"schema": {"enum": ["x", "y"]}}},
        ]
    ),
    "guided_choice": st.lists(PLAIN_TEXT, min_size=1, max_size=3),
    "guided_regex": st.just("[a-z]{1,3}"),
}


@st.composite
def plausible_bodies(draw: st.DrawFn, chat: bool) -> dict[str, Any]:
    """A body a careful client sends, with a few valid options (some conflict: one constraint
    only), so the fuzzing also runs requests through the engine and streams."""
    text = draw(PLAIN_TEXT)
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    )
    names = draw(st.lists(st.sampled_from(sorted(VALID_FIELDS)), max_size=3, unique=True))
    body.update({name: draw(VALID_FIELDS[name]) for name in names})
    if chat and draw(st.booleans()):
        body["logprobs"], body["top_logprobs"] = True, draw(st.integers(0, 3))
    body["max_tokens"] = draw(st.integers(1, 3))
    return body


@st.composite
def raw_bodies(draw: st.DrawFn, chat: bool) -> bytes:
    """What goes over the wire: a body as JSON (lone surrogates as \\ud800 escapes, as clients
    write them), or bytes that are not a JSON object at all."""
    return draw(
        st.one_of(
            bodies(chat).map(lambda body: json.dumps(body).encode()),
            plausible_bodies(chat).map(lambda body: json.dumps(body).encode()),
            plausible_bodies(chat).map(lambda body: json.dumps(body).encode()),
            st.binary(max_size=40),
            JSON.map(lambda value: json.dumps(value).encode()),
            st.integers(1, 20_000).map(lambda d: b"[" * d + b"]" * d),
        )
    )


@st.composite
def jsonl_lines(draw: st.DrawFn) -> bytes:
    """One line of a job's JSONL input: a plain row, an OpenAI batch request, or junk."""
    row = st.one_of(
        st.fixed_dictionaries({"prompt": st.one_of(TEXT, JSON)}, optional={"id": SCALARS}),
        st.fixed_dictionaries({"messages": st.lists(MESSAGE, max_size=2)}),
        st.fixed_dictionaries(
            {"custom_id": st.one_of(TEXT, SCALARS), "body": st.one_of(bodies(True), JSON)},
            optional={"url": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/x"])},
        ),
        JSON,
    )
    return draw(
        st.one_of(
            row.map(lambda value: json.dumps(value).encode()),
            st.binary(max_size=30).filter(lambda b: b"\n" not in b),
            st.integers(1, 6_000).map(lambda d: b'{"prompt": ' + b"[" * d + b"]" * d + b"}"),
            # numbers JSON text holds but Python will not read or JSON write: past 4,300 digits,
            # NaN, past a float
            st.sampled_from([b"9" * 5_000, b"NaN", b"-Infinity", b"1e400"]).map(
                lambda n: b'{"prompt": "x", "seed": ' + n + b"}"
            ),
        )
    )
