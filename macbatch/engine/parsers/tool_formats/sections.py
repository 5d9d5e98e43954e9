"""Calls as a name and JSON arguments between special tokens, inside a calls section:

- DeepSeek V3.1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}
  <｜tool▁call▁end｜><｜tool▁calls▁end｜>``
- Kimi K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
  <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`` (the id is the
  function's name and the call's index in the reply)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import (
    BlockSyntax,
    json_prefix,
    json_rule,
    literal,
    one_of,
)
from macbatch.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class SectionCalls(BlockSyntax):
    call: tuple[str, str] = ("", "")  # around one call
    sep: str = ""  # between the name and the arguments
    name_prefix: str = ""  # Kimi's "functions."
    indexed: bool = False  # Kimi's ":0" after the name

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.block[0], self.call[0], self.sep, self.call[1], self.block[1])

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        at = self.opened_at(text)
        if at is None:
            return None
        pattern = re.escape(self.call[0]) + r"\s*(.*?)\s*" + re.escape(self.sep)
        calls: RawCalls = []
        for match in re.finditer(pattern, text[at:], re.DOTALL):
            found = json_prefix(text[at + match.end() :].lstrip())
            if found is None or not isinstance(found[0], dict):
                return None
            calls.append((self._name(match.group(1)), found[0]))
        return (text[:at].strip(), calls) if calls else None

    def written_name(self, name: str, index: int) -> str:
        """Call ``index`` of a reply, to ``name``, as named in the reply (``NamesCalls``)."""
        return self.name_prefix + name + (f":{index}" if self.indexed else "")

    def _name(self, written: str) -> str:
        name = written.removeprefix(self.name_prefix)
        return re.sub(r":\d+$", "", name) if self.indexed else name

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        section = [literal(tokenizer, t) for t in self.block]
        begin, end, sep = (literal(tokenizer, t) for t in (*self.call, self.sep))
        count = range(8 if parallel else 1)  # Kimi numbers the calls of a reply
        rules = [f"start: {section[0]} call0" + "".join(f" (call{k}" for k in count[1:])]
        rules[0] += ")?" * (len(count) - 1) + f" {section[1]}"
        for k in count:
            options = []
            for i, (name, _) in enumerate(functions):
                written = self.written_name(name, k)
                options.append(f"{begin} {json.dumps(written)} {sep} args{i} {end}")
            rules.append(f"call{k}: {one_of(options)}")
        rules += [f"args{i}: {json_rule(p)}" for i, (_, p) in enumerate(functions)]
        return "\n".join(rules) + "\n"
