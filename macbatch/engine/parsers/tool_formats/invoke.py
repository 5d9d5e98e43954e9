"""Calls as ``<invoke>`` elements with one ``<parameter>`` per argument, values as text:

- MiniMax M2: ``<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE
  </parameter>\\n</invoke>\\n</minimax:tool_call>``
- DeepSeek V3.2 (DSML): the same inside ``<｜DSML｜function_calls>``, every tag prefixed by
  ``｜DSML｜``, and each parameter saying whether its value is a string
  (``string="true"``) or JSON (``string="false"``).

Values are typed by that attribute where there is one, else by the parameter's schema."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import (
    STRING,
    BlockSyntax,
    is_string,
    literal,
    text_calls_grammar,
    typed_value,
)
from macbatch.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class InvokeCalls(BlockSyntax):
    tag: str = ""  # before each element's name: DeepSeek's "｜DSML｜"
    string_flag: bool = False  # each parameter says string="true" or "false"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.block[0], f'<{self.tag}invoke name="', f'<{self.tag}parameter name="')

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        at = self.opened_at(text)
        if at is None:
            return None
        tag = re.escape(self.tag)
        invoke = re.compile(rf'<{tag}invoke name="([^"]+)">(.*?)</{tag}invoke>', re.DOTALL)
        parameter = re.compile(
            rf'<{tag}parameter name="([^"]+)"(?: string="(true|false)")?>(.*?)</{tag}parameter>',
            re.DOTALL,
        )
        calls: RawCalls = []
        for match in invoke.finditer(text, at):
            name = match.group(1)
            properties = schemas.get(name, {}).get("properties") or {}
            arguments = {}
            for key, flag, value in parameter.findall(match.group(2)):
                schema = {"true": STRING, "false": {}}.get(flag, properties.get(key))
                arguments[key] = typed_value(value, schema)
            calls.append((name, arguments))
        return (text[:at].strip(), calls) if calls else None

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        """Parallel calls are more ``<invoke>`` elements in the one block."""
        begin, end = literal(tokenizer, self.block[0]), literal(tokenizer, self.block[1])
        close_invoke = json.dumps(f"</{self.tag}invoke>\n")
        close_parameter = json.dumps(f"</{self.tag}parameter>\n")

        def invoke(name: str, params: str) -> str:
            return f"{json.dumps(self._open('invoke', name) + chr(10))} {params} {close_invoke}"

        def parameter(key: str, value: str, schema: dict) -> str:
            flag = f' string="{str(is_string(schema)).lower()}"' if self.string_flag else ""
            return f"{json.dumps(self._open('parameter', key, flag))} {value} {close_parameter}"

        invokes = text_calls_grammar(functions, invoke, parameter, "<", "" if parallel else None)
        calls = invokes.replace("start: call", "calls: call", 1)
        return calls + f'start: {begin} "\\n" calls {end}\n'

    def _open(self, element: str, name: str, flag: str = "") -> str:
        return f'<{self.tag}{element} name="{name}"{flag}>'
