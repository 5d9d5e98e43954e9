"""MiniMax M2 calls: ``<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="KEY">VALUE
</parameter>\\n</invoke>\\n</minimax:tool_call>``, values typed by their parameter's schema."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.tokenizer import Tokenizer
from macbatch.engine.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.tool_formats.common import literal, text_arguments, text_calls_grammar

_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
_PARAMETER = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)
_BLOCK = ("<minimax:tool_call>", "</minimax:tool_call>")


@dataclass(frozen=True)
class MiniMax:
    family: str = "minimax_m2"
    markers: tuple[str, ...] = (_BLOCK[0], '<invoke name="', '<parameter name="', _BLOCK[1])
    starts: tuple[str, ...] = (_BLOCK[0],)
    own_channel: bool = False

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        at = text.find(_BLOCK[0])
        if at < 0:
            return None
        calls: RawCalls = []
        for match in _INVOKE.finditer(text, at):
            name = match.group(1)
            pairs = _PARAMETER.findall(match.group(2))
            calls.append((name, text_arguments(pairs, schemas.get(name, {}))))
        return (text[:at].strip(), calls) if calls else None

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        """Parallel calls are more ``<invoke>`` elements in the one block."""
        begin, end = literal(tokenizer, _BLOCK[0]), literal(tokenizer, _BLOCK[1])

        def invoke(name: str, params: str) -> str:
            return f"{json.dumps(_tag('invoke', name) + chr(10))} {params} " + '"</invoke>\\n"'

        def parameter(key: str, value: str) -> str:
            return f"{json.dumps(_tag('parameter', key))} {value} " + '"</parameter>\\n"'

        invokes = text_calls_grammar(functions, invoke, parameter, "<", "" if parallel else None)
        calls = invokes.replace("start: call", "calls: call", 1)
        return calls + f'start: {begin} "\\n" calls {end}\n'


def _tag(element: str, name: str) -> str:
    return f'<{element} name="{name}">'
