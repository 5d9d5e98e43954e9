"""LFM2's pythonic calls: ``<|tool_call_start|>[f(city="Lisbon", days=3), g()]
<|tool_call_end|>``, a Python list of calls with keyword arguments. LFM2's templates keep the
call in the assistant's content (they render no ``tool_calls``), so this syntax also writes a
history's calls back as that text (``write``)."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

from macbatch.engine.parsers.tool_calls import Function, RawCalls, Schemas
from macbatch.engine.parsers.tool_formats.common import json_rule, literal, one_of
from macbatch.engine.tokenizer import Tokenizer

START, END = "<|tool_call_start|>", "<|tool_call_end|>"


@dataclass(frozen=True)
class Pythonic:
    family: str = "lfm2"
    markers: tuple[str, ...] = (START, END)
    starts: tuple[str, ...] = (START,)
    own_channel: bool = False

    def split(self, text: str, schemas: Schemas) -> tuple[str, RawCalls] | None:
        at = text.find(START)
        end = text.find(END, at)
        if at < 0 or end < 0:
            return None
        source = text[at + len(START) : end].strip()
        try:
            tree = ast.parse(source, mode="eval").body
        except SyntaxError:
            return None
        nodes = tree.elts if isinstance(tree, ast.List) else [tree]
        calls: RawCalls = []
        for node in nodes:
            if not isinstance(node, ast.Call) or node.args:
                return None
            arguments = {k.arg: _value(k.value, source) for k in node.keywords}
            if None in arguments or any(v is _BAD for v in arguments.values()):
                return None
            calls.append((ast.unparse(node.func), arguments))
        return text[:at].strip(), calls

    def grammar(self, functions: list[Function], parallel: bool, tokenizer: Tokenizer) -> str:
        """Values as JSON (``true`` and ``null`` read back as JSON where Python has no name)."""
        rules = []
        for i, (name, parameters) in enumerate(functions):
            properties = parameters.get("properties") or {}
            required = [k for k in properties if k in set(parameters.get("required") or [])]
            parts = []
            for j, key in enumerate(required):
                rules.append(f"v{i}_{j}: {json_rule(properties[key])}")
                parts.append(f"{json.dumps(('' if j == 0 else ', ') + key + '=')} v{i}_{j}")
            rules.append(f'call{i}: {json.dumps(name + "(")} {" ".join(parts)} ")"')
        more = ' (", " call)*' if parallel else ""
        start, end = literal(tokenizer, START), literal(tokenizer, END)
        rules.append("call: " + one_of([f"call{i}" for i in range(len(functions))]))
        rules.append(f'start: {start} "[" call{more} "]" {end}')
        return "\n".join(rules) + "\n"

    def write(self, calls: RawCalls) -> str:
        """The calls as the model writes them, for a history whose template renders content."""
        written = []
        for name, arguments in calls:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
            keywords = ", ".join(f"{k}={_python(v)}" for k, v in args.items())
            written.append(f"{name}({keywords})")
        return f"{START}[{', '.join(written)}]{END}"


_BAD = object()


def _value(node: ast.expr, source: str) -> Any:
    """A keyword's value: a Python literal, or JSON (``true``, ``null``) where it is not one."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, RecursionError):
        pass
    try:
        return json.loads(ast.get_source_segment(source, node) or "")
    except json.JSONDecodeError:
        return _BAD


def _python(value: Any) -> str:
    """A value as a Python literal (strings in JSON's quoting, which Python reads alike)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_python(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python(k)}: {_python(v)}" for k, v in value.items()) + "}"
    return repr(value)
