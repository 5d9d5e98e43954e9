"""A JSON list of call objects after a marker: Mistral's ``[TOOL_CALLS][{"name": ...,
"arguments": {...}}]`` (v0.3 writes a space after the marker, Nemo none), Nemotron Nano v2's
``<TOOLCALL>[...]</TOOLCALL>`` and Apriel's ``<tool_calls>[...]</tool_calls>``."""

from __future__ import annotations

from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import (
    call_schema,
    json_calls,
    json_prefix,
    json_rule,
    literal,
)
from macbatch.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class JsonList:
    family: str
    opening: str
    closing: str | None  # the marker after the list (None: the list ends the reply)
    gap: str = ""  # what the template writes between the opening marker and the list
    own_channel: bool = False

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.opening + self.gap + "[", *([self.closing] if self.closing else []))

    @property
    def starts(self) -> tuple[str, ...]:
        return (self.opening,)

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        at = text.find(self.opening)
        if at < 0:
            return None
        found = json_prefix(text[at + len(self.opening) :].lstrip())
        calls = json_calls(found[0]) if found is not None else None
        return None if calls is None else (text[:at].strip(), calls)

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        call = call_schema(functions, "arguments")
        array = {"type": "array", "items": call, "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        end = f" {literal(tokenizer, self.closing)}" if self.closing else ""
        gap = f" {literal(tokenizer, self.gap)}" if self.gap else ""
        opening = literal(tokenizer, self.opening)
        return f"start: {opening}{gap} calls{end}\ncalls: {json_rule(array)}\n"
