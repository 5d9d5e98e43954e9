"""gpt-oss harmony calls: the model writes ``<|channel|>commentary to=functions.NAME
<|constrain|>json<|message|>{...}<|call|>``; its template renders a call with the recipient
before the channel, ``<|start|>assistant to=functions.NAME<|channel|>commentary json
<|message|>{...}<|call|>``. The engine has split the analysis channel off before the reply
reaches ``split``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import json_rule, literal, one_of
from macbatch.engine.tokenizer import Tokenizer

_CALL = re.compile(
    # the recipient before the channel (as the template renders calls) or after it (as the
    # model may write them), then any content type, then the arguments
    r"to=functions\.([\w.-]+)(?:[^<]|<\|channel\|>|<\|constrain\|>)*?<\|message\|>"
    r"(.*?)(?:<\|call\|>|$)",
    re.DOTALL,
)
_FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", re.DOTALL)


@dataclass(frozen=True)
class Harmony:
    family: str = "harmony"
    markers: tuple[str, ...] = ("to=functions.", "<|message|>", "<|call|>")
    # after the analysis a new message starts; the recipient may precede the channel
    starts: tuple[str, ...] = ("<|start|>", "<|channel|>", " to=functions.")
    own_channel: bool = True

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        matches = list(_CALL.finditer(text))
        if not matches:
            return None
        calls: RawCalls = []
        for m in matches:
            try:
                calls.append((m.group(1), json.loads(m.group(2))))
            except json.JSONDecodeError:
                return None
        final = _FINAL.search(text)
        return (final.group(1).strip() if final else ""), calls

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        """One call: ``<|call|>`` ends the model's turn (it waits for the result), so a reply
        holds one call whatever ``parallel`` says. After an analysis message the engine writes
        the new message's ``<|start|>assistant`` before this grammar starts."""
        channel, constrain, message, call = (
            literal(tokenizer, marker)
            for marker in ("<|channel|>", "<|constrain|>", "<|message|>", "<|call|>")
        )
        rules = ["start: " + one_of([f"call{i}" for i in range(len(functions))])]
        for i, (name, parameters) in enumerate(functions):
            header = json.dumps(f"commentary to=functions.{name} ")
            rules.append(f'call{i}: {channel} {header} {constrain} "json" {message} args{i} {call}')
            rules.append(f"args{i}: {json_rule(parameters)}")
        return "\n".join(rules) + "\n"
