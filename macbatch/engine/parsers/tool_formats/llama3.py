"""Llama 3.1-3.3 JSON calls: the whole reply is ``{"name": ..., "parameters": {...}}`` (after
``<|python_tag|>`` when the model uses it)."""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import call_schema, json_prefix, json_rule
from macbatch.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class Llama3Json:
    family: str = "llama3_json"
    markers: tuple[str, ...] = ('{"name": ', '"parameters": ')
    starts: tuple[str, ...] = ()
    own_channel: bool = False

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        body = text.removeprefix("<|python_tag|>").strip()
        found = json_prefix(body) if body.startswith("{") else None
        if found is None or found[1] != len(body) or not isinstance(found[0], dict):
            return None
        call = found[0]
        if "name" not in call:
            return None
        return "", [(call["name"], call.get("parameters", call.get("arguments", {})))]

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        return f"start: obj\nobj: {json_rule(call_schema(functions, 'parameters'))}\n"
