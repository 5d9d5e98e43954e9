"""Gemma 4 calls: ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>``, its own object notation:
keys bare, strings between ``<|"|>`` marks, numbers and booleans as in JSON, objects and lists
nested in ``{}`` and ``[]`` (the template writes keys sorted). Read by turning the notation into
JSON; forced by a grammar written from the parameters' schema (required keys only: a valid
call needs no optional ones)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import json_rule, literal, one_of, text_value_rule
from macbatch.engine.tokenizer import Tokenizer

QUOTE = '<|"|>'
_CALL = re.compile(r"<\|tool_call>call:([\w.-]+)(\{.*?\})<tool_call\|>", re.DOTALL)
_PIECE = re.compile(r'<\|"\|>(.*?)<\|"\|>|([{}\[\],:])|([^{}\[\],:<]+)', re.DOTALL)
_SCALARS = ("integer", "number", "boolean", "null")


@dataclass(frozen=True)
class Gemma4:
    family: str = "gemma4"
    markers: tuple[str, ...] = ("<|tool_call>call:", "<tool_call|>")
    starts: tuple[str, ...] = ("<|tool_call>",)
    own_channel: bool = False

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        calls: RawCalls = []
        for match in _CALL.finditer(text):
            arguments = as_json(match.group(2))
            if not isinstance(arguments, dict):
                return None
            calls.append((match.group(1), arguments))
        return (text[: text.index("<|tool_call>")].strip(), calls) if calls else None

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        rules = _Rules(tokenizer)
        calls = []
        for name, parameters in functions:
            body = rules.of(parameters, top=True)
            calls.append(
                f"{literal(tokenizer, '<|tool_call>')} {json.dumps('call:' + name)} {body}"
            )
        end = literal(tokenizer, "<tool_call|>")
        rules.add("call", f"({one_of(calls)}) {end}")
        rules.add("start", "call+" if parallel else "call")
        return rules.text()


def as_json(notation: str) -> Any:
    """Gemma 4's notation as a value (None if it is not well formed)."""
    pieces, matches = [], list(_PIECE.finditer(notation))
    for i, m in enumerate(matches):
        quoted, mark, bare = m.groups()
        if quoted is not None:
            pieces.append(json.dumps(quoted))
        elif mark is not None:
            pieces.append(mark)
        elif i + 1 < len(matches) and matches[i + 1].group(2) == ":":
            pieces.append(json.dumps(bare.strip()))  # a key
        else:
            pieces.append({"None": "null", "True": "true", "False": "false"}.get(bare, bare))
    try:
        return json.loads("".join(pieces))
    except json.JSONDecodeError:
        return None


class _Rules:
    """Lark rules for values in Gemma 4's notation, one per schema met."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.quote = literal(tokenizer, QUOTE)
        self.rules: list[str] = []
        self.named = 0

    def add(self, name: str, body: str) -> str:
        self.rules.append(f"{name}: {body}")
        return name

    def text(self) -> str:
        return "\n".join(self.rules) + "\n"

    def of(self, schema: dict[str, Any], top: bool = False) -> str:
        """A rule name for values valid against ``schema``; ``ValueError`` for a schema the
        notation's grammar does not cover (a 400 for the request that forces it)."""
        name, self.named = f"v{self.named}", self.named + 1
        kind = schema.get("type")
        if "enum" in schema or "const" in schema or kind == "string":
            values = schema.get("enum", [schema["const"]] if "const" in schema else None)
            if values is not None and not all(isinstance(v, str) for v in values):
                return self.add(name, json_rule(schema))
            return self.add(name, f"{self.quote} ({text_value_rule(schema, '<')}) {self.quote}")
        if kind in _SCALARS:
            return self.add(name, json_rule(schema))
        if kind == "object" or top:
            return self._object(name, schema)
        if kind == "array" and isinstance(schema.get("items"), dict):
            item = self.of(schema["items"])
            low, high = schema.get("minItems", 0), schema.get("maxItems")
            more = (
                f'("," {item})'
                + "{"
                + f"{max(low - 1, 0)},{'' if high is None else high - 1}"
                + "}"
            )
            items = f"{item} {more}" if low else f"({item} {more})?"
            return self.add(name, f'"[" {items} "]"')
        raise ValueError(f"a forced Gemma 4 call cannot write values of this schema: {schema}")

    def _object(self, name: str, schema: dict[str, Any]) -> str:
        properties = schema.get("properties") or {}
        required = [k for k in sorted(properties) if k in set(schema.get("required") or [])]
        parts = [f"{json.dumps(key + ':')} {self.of(properties[key])}" for key in required]
        body = ' "," '.join(parts)
        return self.add(name, f'"{{" {body} "}}"')
