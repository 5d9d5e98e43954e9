"""The bounds on what reaches llguidance (issue 32): past them a request is refused naming the
field and the bound; at them, and for realistic large schemas, it compiles (with a real
tokenizer) well within a second, on the engine's compile thread."""

from __future__ import annotations

import json
import time

import pytest

from macbatch.engine.structured_output.constraints import ConstraintCompiler, StructuredOutput
from macbatch.openai import InvalidRequest, parse_chat
from macbatch.openai.options import (
    MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_RULES,
    MAX_SCHEMA_DEFINITIONS,
    MAX_SCHEMA_DEPTH,
    check_schema_size,
)
from tests.support.hostile import openapi_sized_schema, ref_chain_schema, rule_chain_grammar
from tests.support.structured import QWEN3_VOCAB, real_tokenizer

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
LINKS_AT_BOUND = MAX_SCHEMA_DEPTH // 3 - 1  # each link: the object, 'properties', the property


@pytest.fixture(scope="module")
def compiler() -> ConstraintCompiler:
    tokenizer = real_tokenizer("qwen3")
    compiler = ConstraintCompiler(tokenizer._tokenizer, QWEN3_VOCAB, [151645])
    compiler.prepare()
    return compiler


def _refusal(body: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat({**CHAT, **body})
    return caught.value


def test_a_ref_chain_past_the_bound_is_refused_naming_it() -> None:
    error = _refusal({"guided_json": ref_chain_schema(1000)})
    assert error.param == "guided_json"
    assert f"nests more than {MAX_SCHEMA_DEPTH} levels deep" in str(error)
    error = _refusal({"guided_json": ref_chain_schema(LINKS_AT_BOUND + 2)})
    assert error.param == "guided_json"
    as_text = _refusal({"structured_outputs": {"json": json.dumps(ref_chain_schema(1000))}})
    assert as_text.param == "structured_outputs"  # a schema sent as JSON text is bounded too


def test_tool_parameters_are_bounded_too() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": ref_chain_schema(1000)}}
    error = _refusal({"tools": [tool]})
    assert error.param == "tools[0].function.parameters"


def test_definitions_and_grammars_past_their_bounds_are_refused() -> None:
    many = {"$defs": {f"d{i}": {"type": "string"} for i in range(MAX_SCHEMA_DEFINITIONS + 1)}}
    with pytest.raises(InvalidRequest, match=f"at most {MAX_SCHEMA_DEFINITIONS:,}"):
        check_schema_size(many, "guided_json")
    error = _refusal({"guided_grammar": rule_chain_grammar(MAX_GRAMMAR_RULES + 1)})
    assert error.param == "guided_grammar" and f"at most {MAX_GRAMMAR_RULES:,}" in str(error)
    big = 'start: "' + "x" * MAX_GRAMMAR_BYTES + '"'
    assert f"at most {MAX_GRAMMAR_BYTES:,}" in str(_refusal({"guided_grammar": big}))


def test_a_recursive_schema_is_not_deep() -> None:
    tree = {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
    }
    check_schema_size(tree, "guided_json")


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(lambda: {"json_schema": ref_chain_schema(LINKS_AT_BOUND)}, id="ref-chain"),
        pytest.param(lambda: {"grammar": rule_chain_grammar(MAX_GRAMMAR_RULES)}, id="rule-chain"),
        pytest.param(lambda: {"json_schema": openapi_sized_schema()}, id="openapi-sized"),
    ],
)
def test_at_the_bounds_and_openapi_sized_schemas_compile(
    compiler: ConstraintCompiler, spec
) -> None:
    fields = spec()
    body = (
        {"guided_json": fields["json_schema"]}
        if "json_schema" in fields
        else {"guided_grammar": fields["grammar"]}
    )
    generation = parse_chat({**CHAT, **body})  # within the bounds
    assert generation.params.structured is not None
    started = time.perf_counter()
    matcher = compiler.compile(StructuredOutput(**fields))
    assert not matcher.is_error()
    assert time.perf_counter() - started < 5.0  # measured: 0.06 s for the OpenAPI-sized one
