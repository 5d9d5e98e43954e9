"""Mistral's newer calls (Magistral, Devstral, Mistral Small 3.2, Ministral 3):
``[TOOL_CALLS]NAME[ARGS]{...}`` per call, Small 3.2's template with ``[CALL_ID]ID`` before
``[ARGS]``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import json_prefix, json_rule, literal, one_of
from macbatch.engine.tokenizer import Tokenizer

_CALL = re.compile(r"\[TOOL_CALLS\]\s*([\w.-]+)\s*(?:\[CALL_ID\][^\[]*)?\[ARGS\]")


@dataclass(frozen=True)
class MistralArgs:
    family: str = "mistral_args"
    markers: tuple[str, ...] = ("[TOOL_CALLS]", "[ARGS]")
    starts: tuple[str, ...] = ("[TOOL_CALLS]",)
    own_channel: bool = False

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        calls: RawCalls = []
        for match in _CALL.finditer(text):
            found = json_prefix(text[match.end() :].lstrip())
            if found is None or not isinstance(found[0], dict):
                return None
            calls.append((match.group(1), found[0]))
        return (text[: text.index("[TOOL_CALLS]")].strip(), calls) if calls else None

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        marker, args = literal(tokenizer, "[TOOL_CALLS]"), literal(tokenizer, "[ARGS]")
        rules = [
            "start: call" + (" call*" if parallel else ""),
            "call: " + one_of([f"call{i}" for i in range(len(functions))]),
        ]
        for i, (name, parameters) in enumerate(functions):
            rules.append(f"call{i}: {marker} {json.dumps(name)} {args} args{i}")
            rules.append(f"args{i}: {json_rule(parameters)}")
        return "\n".join(rules) + "\n"
