"""Hermes JSON calls (Qwen 2.5 / Qwen3, Granite 4): ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>``, one block per call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import call_schema, json_rule, literal
from macbatch.engine.tokenizer import Tokenizer

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class Hermes:
    family: str = "hermes"
    markers: tuple[str, ...] = ("<tool_call>", "</tool_call>")
    starts: tuple[str, ...] = ("<tool_call>",)
    own_channel: bool = False

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        blocks = _BLOCK.findall(text)
        if not blocks:
            return None
        calls = []
        for block in blocks:
            try:
                call = json.loads(block)
            except json.JSONDecodeError:
                return None
            if not isinstance(call, dict):
                return None
            calls.append((call.get("name"), call.get("arguments", {})))
        return text[: text.index("<tool_call>")].strip(), calls

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        call = call_schema(functions, "arguments")
        more = ' ("\\n" call)*' if parallel else ""
        start, end = literal(tokenizer, "<tool_call>"), literal(tokenizer, "</tool_call>")
        return f'start: call{more}\ncall: {start} "\\n" obj "\\n" {end}\nobj: {json_rule(call)}\n'
