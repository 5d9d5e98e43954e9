"""Which syntax a model's chat template writes tool calls in, found by rendering: a probe
conversation holding one known call goes through the template, and the first registered syntax
whose markers are all in the rendered call, and which reads the same call back from it, wins.
A template that only concatenates arguments (DeepSeek V3.1's) refuses a mapping or renders it
wrong; it is tried again with the arguments as JSON text, then with the call written into the
content (LFM2's templates render no calls), and that shape is what the history gets from then
on. Searching the template's source for markers missed templates that write a
marker in pieces (gpt-oss's ``to=`` and ``functions.``) and confused families that share one."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from macbatch.engine.parsers.tool_calls import (
    CallSyntax,
    NamesCalls,
    ToolFormat,
    WritesCalls,
    template_messages,
)
from macbatch.engine.parsers.tool_formats import SYNTAXES
from macbatch.engine.tokenizer import Tokenizer

PROBE_NAME = "get_weather"
PROBE_ARGUMENTS = {"city": "Lisbon", "days": 3}
PROBE_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
_TOOLS = [
    {
        "type": "function",
        "function": {"name": PROBE_NAME, "description": "Weather", "parameters": PROBE_PARAMETERS},
    }
]
_ASK = {"role": "user", "content": "What is the weather in Lisbon?"}
_WORDS = "It is sunny."


def detect_tool_format(tokenizer: Tokenizer) -> ToolFormat | None:
    """The tool-call format of a tokenizer's chat template, or None if no syntax reads it.
    Markers are matched as written first, then up to whitespace (a template's own spacing:
    llama.cpp's GLM 4.5 writes a newline inside a call where GLM's has none); what decides is
    that the syntax reads the probe call back."""
    for fmt in _shapes():
        reply = rendered_call(tokenizer, fmt)
        if reply is None:
            continue
        candidates = [fmt.syntax] if fmt.calls_in_content else list(SYNTAXES.values())
        for exact in (True, False):
            for syntax in candidates:
                if _has_markers(syntax, reply, exact):
                    found = _reading(tokenizer, replace(fmt, syntax=syntax), reply)
                    if found is not None:
                        return found
    return None


def _has_markers(syntax: CallSyntax, reply: str, exact: bool) -> bool:
    if exact:
        return all(m in reply for m in syntax.markers)
    bare = _unspaced(reply)
    return all(_unspaced(m) in bare for m in syntax.markers)


def _unspaced(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _reading(tokenizer: Tokenizer, fmt: ToolFormat, reply: str) -> ToolFormat | None:
    """``fmt`` if its syntax reads the probe call back from ``reply``; else, for a syntax that
    names calls its own way, the format whose history ids are those names, if the template
    writes the id where the name goes (Kimi K2 Thinking's: Instruct's writes the name)."""
    if _reads_probe(fmt.syntax, reply):
        return fmt
    if not isinstance(fmt.syntax, NamesCalls):
        return None
    named = replace(fmt, ids_as_names=True)
    again = rendered_call(tokenizer, named)
    return named if again is not None and _reads_probe(fmt.syntax, again) else None


def _shapes() -> list[ToolFormat]:
    """The history shapes to try, each as a format whose syntax detection then replaces: calls
    as mappings, as JSON text, and written into the content by each syntax that can write them
    (a template that renders no calls, LFM2's, shows its syntax only this way: the probe
    renders, and reads back, only where the vocabulary has the syntax's markers as tokens)."""
    first = next(iter(SYNTAXES.values()))
    writers = [s for s in SYNTAXES.values() if isinstance(s, WritesCalls)]
    return [
        ToolFormat(first),
        ToolFormat(first, text_arguments=True),
        *(ToolFormat(s, calls_in_content=True) for s in writers),
    ]


def rendered_call(tokenizer: Tokenizer, fmt: ToolFormat) -> str | None:
    """The text the template writes for the probe call in ``fmt``'s history shape, after the
    generation prompt and without the turn's end (None: the template refused it, or the
    content shape's markers are not tokens of this vocabulary)."""
    if fmt.calls_in_content and not _tokens(tokenizer, fmt.syntax.markers):
        return None
    function = {"name": PROBE_NAME, "arguments": json.dumps(PROBE_ARGUMENTS)}
    call = {"id": "abc123456", "type": "function", "function": function}
    answer = {"role": "assistant", "content": "", "tool_calls": [call]}
    try:
        prompt = _render(tokenizer, [_ASK], True)
        called = _render(tokenizer, template_messages([_ASK, answer], fmt), False)
        worded = _render(tokenizer, [_ASK, {"role": "assistant", "content": _WORDS}], False)
    except Exception:  # jinja's errors and the template's own raise_exception
        return None
    shared = _shared_prefix(prompt, called)
    turn_end = worded[worded.find(_WORDS) + len(_WORDS) :] if _WORDS in worded else ""
    reply = called[shared:]
    return (reply.removesuffix(turn_end) if turn_end.strip() else reply).rstrip()


def _tokens(tokenizer: Tokenizer, texts: tuple[str, ...]) -> bool:
    """Whether every one of ``texts`` is a single token of the vocabulary."""
    return all(len(tokenizer.encode(text, add_special_tokens=False)) == 1 for text in texts)


def _shared_prefix(prompt: str, called: str) -> int:
    """How much of the rendered call is the conversation before it: the common prefix, backed
    off to a boundary when the call parts from the generation prompt midway (Nemotron's
    ``<think>`` and its ``<TOOLCALL>`` share their first character)."""
    shared = 0
    for a, b in zip(prompt, called):
        if a != b:
            break
        shared += 1
    if shared < len(prompt):
        shared = max(called.rfind(c, 0, shared) + 1 for c in "\n>]")
    return shared


def _render(tokenizer: Tokenizer, messages: list[dict[str, Any]], prompt: bool) -> str:
    hf: Any = getattr(tokenizer, "_tokenizer", tokenizer)
    return hf.apply_chat_template(
        messages, tools=_TOOLS, add_generation_prompt=prompt, tokenize=False
    )


def _reads_probe(syntax: CallSyntax, reply: str) -> bool:
    found = syntax.split(reply, {PROBE_NAME: PROBE_PARAMETERS})
    if found is None:
        return False
    calls = [(name, json.loads(args) if isinstance(args, str) else args) for name, args in found[1]]
    return calls == [(PROBE_NAME, PROBE_ARGUMENTS)]
