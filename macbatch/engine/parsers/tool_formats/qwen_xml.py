"""XML-style calls with one element per parameter, values as plain text: Qwen3-Coder, Qwen3.5 /
Qwen3.6 and Nemotron 3 write

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

and Seed-OSS the same inside ``<seed:tool_call>`` with values not on lines of their own. A value
is typed by its parameter's schema (``common.typed_value``): the text says ``3`` either way."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import (
    BlockSyntax,
    literal,
    text_arguments,
    text_calls_grammar,
)
from macbatch.engine.tokenizer import Tokenizer

_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


@dataclass(frozen=True)
class QwenXml(BlockSyntax):
    family: str = "qwen3_xml"
    block: tuple[str, str] = ("<tool_call>", "</tool_call>")
    value_lines: bool = True  # each value on its own line(s), between newlines

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.block[0], "<function=", "<parameter=", self.block[1])

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        at = self.opened_at(text)
        if at is None:
            return None
        calls: RawCalls = []
        for match in _FUNCTION.finditer(text, at):
            name = match.group(1)
            pairs = [(k, _unline(v)) for k, v in _PARAMETER.findall(match.group(2))]
            calls.append((name, text_arguments(pairs, schemas.get(name, {}))))
        return (text[:at].strip(), calls) if calls else None

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        begin, end = literal(tokenizer, self.block[0]), literal(tokenizer, self.block[1])
        nl = '"\\n"' if self.value_lines else ""

        def call(name: str, params: str) -> str:
            head = json.dumps(f"\n<function={name}>\n")
            return f'{begin} {head} {params} "</function>\\n" {end}'

        def parameter(key: str, value: str, schema: dict) -> str:
            return f'{json.dumps(f"<parameter={key}>")} {nl} {value} {nl} "</parameter>\\n"'

        stop = "<\\n" if self.value_lines else "<"
        return text_calls_grammar(functions, call, parameter, stop, '"\\n"' if parallel else None)


def _unline(value: str) -> str:
    """A value without the one newline each side that the layout puts around it."""
    return value.removeprefix("\n").removesuffix("\n")
