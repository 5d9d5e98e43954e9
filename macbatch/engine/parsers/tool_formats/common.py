"""Pieces the call syntaxes share: JSON call objects and their schemas, grammar terminals for
a tokenizer's added tokens, and argument values written as text (XML-style syntaxes) read
back and forced by their parameter's schema."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from macbatch.engine.parsers.json_layout import JSON_LAYOUT
from macbatch.engine.parsers.tool_calls import Function, RawCalls
from macbatch.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class BlockSyntax:
    """A syntax whose calls sit in one block that opens with ``block[0]``, the text streaming
    holds back, and ends with ``block[1]``."""

    family: str
    block: tuple[str, str]
    own_channel: bool = False

    @property
    def starts(self) -> tuple[str, ...]:
        return (self.block[0],)

    def opened_at(self, text: str) -> int | None:
        """Where the block opens in ``text`` (None: it does not)."""
        at = text.find(self.block[0])
        return None if at < 0 else at


def call_schema(functions: list[Function], args_key: str) -> dict[str, Any]:
    """The schema of a JSON call object ``{"name": ..., args_key: {...}}`` to one function."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, args_key: parameters},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for name, parameters in functions
    ]
    return {"anyOf": options} if len(options) > 1 else options[0]


def json_rule(schema: dict[str, Any]) -> str:
    """A Lark rule body for JSON valid against ``schema``, laid out as the engine's JSON is."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def literal(tokenizer: Tokenizer, text: str) -> str:
    """A Lark terminal for ``text``: the token itself where the vocabulary has it as one added
    token (grammars see added tokens as tokens, not as their text), else the quoted text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and ids[0] in getattr(tokenizer, "added_tokens_decoder", {}):
        return f"<[{ids[0]}]>"
    return json.dumps(text)


def json_prefix(text: str) -> tuple[Any, int] | None:
    """The JSON value ``text`` starts with and where it ends, or None."""
    try:
        return json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None


def json_calls(objects: Any, args_key: str = "arguments") -> RawCalls | None:
    """[(name, arguments)] of a list of JSON call objects, or None if one is not an object."""
    if not isinstance(objects, list) or not objects:
        return None
    if not all(isinstance(c, dict) for c in objects):
        return None
    return [(c.get("name"), c.get(args_key, {})) for c in objects]


def one_of(rules: list[str]) -> str:
    return " | ".join(rules)


def typed_value(text: str, schema: Any) -> Any:
    """A parameter's value written as text, read as its schema's type: JSON for anything that
    is not surely a string (numbers, booleans, objects), else a Python literal (Seed-OSS's
    template writes a mapping as Python prints it), else the text itself."""
    if not isinstance(schema, dict) or is_string(schema):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


STRING = {"type": "string"}


def is_string(schema: dict[str, Any]) -> bool:
    """Whether values of ``schema`` are surely strings (a string type, or string enum)."""
    kind = schema.get("type")
    if kind == "string":
        return True
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return kind is None and isinstance(values, list) and all(isinstance(v, str) for v in values)


def text_value_rule(schema: dict[str, Any], stop: str) -> str:
    """A Lark rule body for a parameter's value written as text: a string's characters (none of
    ``stop``, a regex character class's inside, e.g. ``<\\n``, within its length bounds), a
    string enum's words, else JSON valid against the schema."""
    if not is_string(schema):
        return json_rule(schema)
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list):
        return one_of([json.dumps(v) for v in values])
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    return f"/[^{stop}]{{{low},{'' if high is None else high}}}/"


def text_arguments(pairs: list[tuple[str, str]], parameters: dict[str, Any]) -> dict[str, Any]:
    """Arguments from (name, value text) pairs, each typed by its parameter's schema."""
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    properties = properties if isinstance(properties, dict) else {}
    return {key: typed_value(value, properties.get(key)) for key, value in pairs}


def ordered_parameters(parameters: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, schema, required) of each declared parameter, in the schema's order."""
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    return [(k, v if isinstance(v, dict) else {}, k in required) for k, v in properties.items()]


def text_calls_grammar(
    functions: list[Function],
    call: Callable[[str, str], str],
    parameter: Callable[[str, str, dict[str, Any]], str],
    stop: str,
    separator: str | None,
) -> str:
    """A Lark grammar for calls whose arguments are written as text, one parameter after the
    other (Qwen3.5's XML, GLM's ``<arg_key>``, MiniMax's ``<invoke>`` ...).

    ``call(name, params)`` writes a call around its parameters' rule, ``parameter(key, value,
    schema)`` one parameter around its value's rule (both as Lark sequences); required
    parameters come in the schema's order, optional ones may be left out; ``separator`` (a Lark
    terminal) joins more calls when the reply may hold several (None: one call)."""
    more = f" ({separator} call)*" if separator is not None else ""
    rules = [f"start: call{more}", "call: " + one_of([f"call{i}" for i in range(len(functions))])]
    for i, (name, parameters) in enumerate(functions):
        parts = []
        for j, (key, schema, required) in enumerate(ordered_parameters(parameters)):
            rules.append(f"value{i}_{j}: {text_value_rule(schema, stop)}")
            part = parameter(key, f"value{i}_{j}", schema)
            parts.append(part if required else f"({part})?")
        if parts:
            rules.append(f"params{i}: {' '.join(parts)}")
        rules.append(f"call{i}: {call(name, f'params{i}' if parts else '')}")
    return "\n".join(rules) + "\n"
