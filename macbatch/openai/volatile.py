"""Lines agent clients put at the front of a prompt that change on every request, taken out so
the stable prompt starts at the same token each turn and the prefix cache can serve it.

The prefix cache names a block by its tokens and every token before them (docs/engine.md), so
one token that differs near the start makes every later block a miss: Claude Code's billing
line, the first thing in its system prompt, made a 10,000-token session read 32 tokens from the
cache per turn. Each rule below says which API shapes it is applied to, where it looks, the
exact pattern, why the text can go and where it was seen; docs/serve.md has the same table, and
the clients checked that send nothing of the kind. ``macbatch serve
--keep-volatile-prompt-lines`` turns the rules off (the parsers' ``keep_volatile`` argument).

Every rule looks at one place only, the very start of the prompt's first message when that is
a system message: Messages ``system``, Responses ``instructions`` (or a leading system or
developer input item), chat's leading system or developer message. That is where the lines are
sent, and where a changing token costs the whole prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Shape(str, Enum):
    """The API shape a body came in (its parser turns them all into chat messages)."""

    CHAT = "chat completions"
    RESPONSES = "responses"
    MESSAGES = "messages"


@dataclass(frozen=True)
class VolatileLine:
    """One kind of line: where it is looked for, its exact pattern (matched at the start of the
    system text and removed), and why removing it is safe."""

    name: str
    shapes: frozenset[Shape]
    part: str
    pattern: re.Pattern[str]
    why: str
    seen_in: str


RULES: tuple[VolatileLine, ...] = (
    VolatileLine(
        name="claude-code-billing-header",
        # Claude Code speaks Messages; proxies forward its system prompt unchanged into chat's
        # system message (1rgs/claude-code-proxy issue 99, cc-switch-cli PR 149) and Responses'
        # instructions (farion1231/cc-switch issue 2350, claude-code-router issue 1372).
        shapes=frozenset(Shape),
        part="the start of the system prompt",
        # "x-anthropic-billing-header:" then "key=value;" fields (cc_version, cc_entrypoint,
        # cch, ...), then the line breaks after them. A field takes no ";" or line break, and
        # a key is a word, so the text that follows on the same line (when a client joined the
        # blocks with nothing between them) is never taken.
        pattern=re.compile(
            r"\Ax-anthropic-billing-header:(?:[ \t]*[A-Za-z0-9_]+=[^;\r\n]*;)+[ \t]*(?:\r?\n)*"
        ),
        why="Claude Code's attribution line for Anthropic's billing, the first system block; "
        "its cch= and cc_version suffix are hashes of the request, new on every request, and "
        "it says nothing to the model",
        seen_in="Claude Code 2.1.x (vllm-mlx PR 277, sglang PR 21064, llama.cpp PR 20623, "
        "anthropics/claude-code issue 68900)",
    ),
)


def stable_messages(messages: list[dict[str, Any]], shape: Shape) -> list[dict[str, Any]]:
    """``messages`` with each rule of ``shape`` applied to the start of the first message's
    text when it is a system message (left out if nothing remains of it); the list and its
    messages are not changed, a changed first message is a copy."""
    if not messages or messages[0].get("role") != "system":
        return messages
    first = messages[0]
    text = first.get("content")
    if not isinstance(text, str):  # with image parts: no client sends its line there
        return messages
    stable = text
    for rule in RULES:
        if shape in rule.shapes:
            stable = rule.pattern.sub("", stable, count=1)
    if stable == text:
        return messages
    rest = messages[1:]
    return rest if not stable and rest else [{**first, "content": stable}, *rest]
