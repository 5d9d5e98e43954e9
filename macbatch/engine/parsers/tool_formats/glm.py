"""GLM 4.5-4.7 calls: ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...
</tool_call>``, GLM 4.5 / 4.6 with a newline before each element, GLM 4.7 without. Values are
typed by their parameter's schema, as the template writes strings bare and the rest as JSON."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import literal, text_arguments, text_calls_grammar
from macbatch.engine.tokenizer import Tokenizer

_CALL = re.compile(r"<tool_call>\s*([^<\s]+)\s*(.*?)</tool_call>", re.DOTALL)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@dataclass(frozen=True)
class Glm:
    family: str = "glm45"
    newlines: bool = True  # GLM 4.5 / 4.6: "\n" before each element
    starts: tuple[str, ...] = ("<tool_call>",)
    own_channel: bool = False

    @property
    def markers(self) -> tuple[str, ...]:
        gap = "\n" if self.newlines else ""
        return ("<tool_call>", f"{gap}<arg_key>", f"</arg_key>{gap}<arg_value>", "</tool_call>")

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        calls: RawCalls = []
        for match in _CALL.finditer(text):
            name = match.group(1)
            calls.append(
                (name, text_arguments(_ARG.findall(match.group(2)), schemas.get(name, {})))
            )
        return (text[: text.index("<tool_call>")].strip(), calls) if calls else None

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        begin, end = literal(tokenizer, "<tool_call>"), literal(tokenizer, "</tool_call>")
        key, key_end, value, value_end = (
            literal(tokenizer, t)
            for t in ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
        )
        gap = '"\\n"' if self.newlines else ""

        def call(name: str, params: str) -> str:
            return f"{begin} {json.dumps(name)} {params} {gap} {end}"

        def parameter(name: str, rule: str, schema: dict) -> str:
            return f"{gap} {key} {json.dumps(name)} {key_end} {gap} {value} {rule} {value_end}"

        return text_calls_grammar(functions, call, parameter, "<", gap if parallel else None)
