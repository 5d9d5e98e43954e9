"""A session's history as the engine sees it (chat messages) and as a user exports it (Markdown)."""

from __future__ import annotations

from macbatch.tui.store import ERROR, Message, Session


def prompt_messages(session: Session, history: list[Message]) -> list[dict[str, str]]:
    """Chat messages for the engine: the system prompt, then every turn with text.

    Failed replies carry no model text, so they are left out; stopped and interrupted replies
    keep the part the user saw.
    """
    messages = []
    if session.settings.system_prompt.strip():
        messages.append({"role": "system", "content": session.settings.system_prompt})
    for message in history:
        if message.status == ERROR and not message.content:
            continue
        messages.append({"role": message.role, "content": message.content})
    return messages


def to_markdown(session: Session, history: list[Message]) -> str:
    """The chat as a Markdown document: a title, the settings, then one section per message."""
    settings = session.settings
    lines = [
        f"# {session.title}",
        "",
        f"- temperature: {settings.temperature:g}",
        f"- top_p: {settings.top_p:g}",
        f"- max tokens: {settings.max_tokens}",
    ]
    if settings.thinking is not None:
        lines.append(f"- thinking: {'on' if settings.thinking else 'off'}")
    if settings.system_prompt:
        lines += ["", "## System", "", settings.system_prompt]
    for message in history:
        heading = "User" if message.role == "user" else "Assistant"
        if message.status not in ("done", "streaming"):
            heading += f" ({message.status})"
        lines += ["", f"## {heading}", "", message.content]
        if message.error:
            lines += ["", f"> error: {message.error}"]
    return "\n".join(lines) + "\n"
