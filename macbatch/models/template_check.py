"""`macbatch doctor MODEL`'s chat-template rows: the tool-call format detection finds by
rendering (the same ``detect_tool_format`` the engine runs at load) and the thinking default.
A template no syntax reads is reported here; requests only fail when a tool choice needs one."""

from __future__ import annotations

from pathlib import Path

from macbatch.engine import detect_tool_format, has_chat_template, thinking_default

NO_FORMAT = (
    "none macbatch parses: tool_choice 'required' or a named tool is refused (400), "
    "'auto' replies come back as text"
)


def template_rows(path: Path) -> list[tuple[str, str]]:
    """(label, value) rows about the chat template of the model at ``path``."""
    from macbatch.engine.loader import load_tokenizer

    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:  # a missing or broken tokenizer: the engine would fail the same way
        return [("chat template", f"the tokenizer does not load: {exc}")]
    if not has_chat_template(tokenizer):
        return [("chat template", "none: send text prompts (chat messages are refused)")]
    fmt = detect_tool_format(tokenizer)
    if fmt is None:
        tools = NO_FORMAT
    else:
        tools = fmt.family + (" (history arguments as JSON text)" if fmt.text_arguments else "")
    default = thinking_default(tokenizer)
    thinking = {True: "on by default", False: "off by default", None: "no switch"}[default]
    if default is not None:
        thinking += " (enable_thinking switches it)"
    return [("tool calls", tools), ("thinking", thinking)]
