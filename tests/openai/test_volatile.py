"""Agent clients' volatile lines (``macbatch.openai.volatile``) on recorded request shapes: Claude
Code's billing line leaves the prompt of each API shape it reaches (Messages as Claude Code
sends it; chat and Responses as proxies forward it), so consecutive turns render, through
Qwen3's real template and tokenizer, to prompts that share every token of the earlier one;
``keep_volatile`` keeps it. The pattern takes the line and nothing else, and docs/serve.md
states each rule exactly as the code has it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from macbatch.openai import Endpoint, Generation, parse_body
from macbatch.openai.anthropic_api import parse_messages
from macbatch.openai.responses_api import parse_responses
from macbatch.openai.volatile import RULES, Shape, stable_messages
from tests.support.agent_requests import IDENTITY, as_chat, as_responses, claude_code_body
from tests.support.structured import real_tokenizer

SERVE_DOC = Path(__file__).parents[2] / "docs" / "serve.md"
LINE = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;"


def _parse(shape: str, turn: int, keep: bool = False) -> Generation:
    body = claude_code_body(turn)
    if shape == "messages":
        return parse_messages(body, keep_volatile=keep).generation
    if shape == "chat":
        return parse_body(Endpoint.CHAT, as_chat(body), keep_volatile=keep)
    if shape == "chat parts":
        return parse_body(Endpoint.CHAT, as_chat(body, parts=True), keep_volatile=keep)
    return parse_responses(as_responses(body), keep_volatile=keep).generation


SHAPES = ["messages", "chat", "chat parts", "responses"]


def _system(generation: Generation) -> str:
    first = generation.prompts[0][0]
    assert first["role"] == "system"
    return first["content"]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_billing_line_leaves_the_system_prompt(shape: str) -> None:
    body = claude_code_body(2)
    blocks = [block["text"] for block in body["system"]]
    assert blocks[0].startswith("x-anthropic-billing-header: cc_version=")
    # Messages joins its system blocks as they are, the proxies with a blank line between
    joined = "".join(blocks[1:]) if shape == "messages" else "\n\n".join(blocks[1:])
    assert _system(_parse(shape, 2)) == joined
    kept = _system(_parse(shape, 2, keep=True))
    assert kept.startswith(blocks[0]) and kept.endswith(joined)


@pytest.mark.parametrize("shape", SHAPES)
def test_consecutive_turns_share_the_whole_earlier_prompt(shape: str) -> None:
    """Rendered by Qwen3's real template and tokenizer: turn 2's prompt starts with every token
    of turn 1's, up to its generation prompt; with the line kept, only the line's first
    tokens are shared."""
    hf = real_tokenizer("qwen3")._tokenizer

    def ids(turn: int, keep: bool) -> list[int]:
        generation = _parse(shape, turn, keep)
        assert generation.tools is not None
        tools = generation.tools.tools
        text = hf.apply_chat_template(
            list(generation.prompts[0]), tools=tools, tokenize=False, add_generation_prompt=True
        )
        return list(hf.encode(text, add_special_tokens=False))

    first, second = ids(1, False), ids(2, False)
    shared = _shared(first, second)
    assert len(first) > 10_000 and shared >= len(first) - 8, (shared, len(first))
    assert _shared(ids(1, True), ids(2, True)) < 40


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize(
    ("text", "left"),
    [
        (LINE, ""),  # a block of its own, as Claude Code sends it
        (LINE + IDENTITY, IDENTITY),  # blocks joined with nothing between them
        (LINE + "\n" + IDENTITY, IDENTITY),
        (LINE + "\r\n\r\n" + IDENTITY, IDENTITY),
        (LINE.replace("; ", ";") + "\n" + IDENTITY, IDENTITY),
        (
            "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=sdk-cli; "
            "cch=36ee5;\nrest",
            "rest",
        ),  # fmt: skip
    ],
)
def test_the_pattern_takes_the_line(text: str, left: str) -> None:
    messages = [{"role": "system", "content": text}, {"role": "user", "content": "hi"}]
    stable = stable_messages(messages, Shape.MESSAGES)
    expected = [messages[1]] if not left else [{"role": "system", "content": left}, messages[1]]
    assert stable == expected
    assert messages[0]["content"] == text  # the caller's messages are not changed


@pytest.mark.parametrize(
    "messages",
    [
        # not at the start of the system prompt
        [{"role": "system", "content": "Be brief.\n" + LINE}, {"role": "user", "content": "hi"}],
        [{"role": "system", "content": " " + LINE}, {"role": "user", "content": "hi"}],
        # not in a system message, or not in the first message
        [{"role": "user", "content": LINE + "\nhi"}],
        [{"role": "user", "content": "hi"}, {"role": "system", "content": LINE}],
        # not the line: no key=value; fields, or another header
        [{"role": "system", "content": "x-anthropic-billing-header: none\nhi"}],
        [{"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1.37\nhi"}],
        [{"role": "system", "content": "x-anthropic-other: cch=fa690;\nhi"}],
    ],
)
def test_the_pattern_takes_nothing_else(messages: list[dict[str, Any]]) -> None:
    assert stable_messages(messages, Shape.CHAT) is messages


def test_a_system_prompt_of_only_the_line_stays_when_nothing_follows() -> None:
    assert stable_messages([{"role": "system", "content": LINE}], Shape.CHAT) == [
        {"role": "system", "content": ""}
    ]


def test_serve_doc_states_each_rule() -> None:
    """docs/serve.md's table has each rule's name, the shapes it applies to, and its pattern
    exactly as compiled."""
    doc = SERVE_DOC.read_text()
    for rule in RULES:
        [row] = [line for line in doc.splitlines() if line.startswith(f"| `{rule.name}` |")]
        assert f"`{rule.pattern.pattern}`" in row
        for shape in rule.shapes:
            assert shape.value in row
    assert re.search(r"--keep-volatile-prompt-lines", doc)
